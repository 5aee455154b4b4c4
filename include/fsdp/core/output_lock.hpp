// fsdp/core/output_lock.hpp: one process at a time writes a named output.
//
// fsdp::AtomicFile (atomic_file.hpp) writes `path + ".tmp"` and removes a temporary of that
// name that it finds (a crash's leftover), so two processes writing the same output at once
// delete each other's temporary: `fsdp_prepare -o out.h5 A & fsdp_prepare -o out.h5 B` made
// both fail, with no out.h5. fsdp_train keeps one run per train.run_dir with its own lock
// (fsdp/train/run_dir.hpp); the tools that write an output outside a run directory hold an
// OutputLock on it until they return: fsdp_prepare on -o before it reads its inputs,
// fsdp_merge on OUT_DIR (lock file OUT_DIR/.fsdp_merge.lock) once the checkpoint is verified
// (a second merge would remove the first one's files as stale).
//
// The lock is an exclusive flock(2) on a lock file (`output + ".lock"` unless the caller names
// another) that exists only while it is held: try_lock_file (fsdp/core/file_lock.hpp: open,
// create, O_NOFOLLOW, flock(LOCK_EX | LOCK_NB)), then check that the name still names the
// file locked (a holder that was releasing may have unlinked it: then try again).
// Release: unlink the file while still holding the lock, then close it. A process that dies
// releases the flock with its descriptors and leaves the empty file, which the next writer
// takes over and removes. flock is advisory and per open file description (two OutputLocks
// of one process exclude each other too); on NFS it needs a server with lock support.
#pragma once

#include <string>

#include "fsdp/core/file_lock.hpp"

namespace fsdp {

class OutputLock {
 public:
  // Locks `output` through the lock file `lock_path` (its folder must exist). `key` names the
  // option the path came from in errors. Throws InputError (exit 2) "<key>: <output> is being
  // written by another process (it holds <lock_path>); wait for it to end or choose another
  // output" when another process holds the lock, and InputError "<key>: cannot create|lock
  // <lock_path>: <strerror>" when the file cannot be made or locked (e.g. a read-only folder)
  // or is not a regular file (a symbolic link is not followed).
  OutputLock(const std::string& output, std::string lock_path, const std::string& key);
  // The lock file `output + ".lock"`, beside a file output.
  OutputLock(const std::string& output, const std::string& key)
      : OutputLock(output, output + ".lock", key) {}
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  // Unlinks the lock file, then releases the lock. Never throws.
  ~OutputLock();

  const std::string& lock_path() const { return lock_path_; }

 private:
  std::string lock_path_;
  UniqueFd fd_;  // holds the flock
};

}  // namespace fsdp
