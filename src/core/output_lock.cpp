// An exclusive lock on a named output for the length of a write (fsdp/core/output_lock.hpp).
#include "fsdp/core/output_lock.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp {

OutputLock::OutputLock(const std::string& output, std::string lock_path, const std::string& key)
    : lock_path_(std::move(lock_path)) {
  for (;;) {
    LockFile lock = try_lock_file(lock_path_, key);
    if (!lock.held) {
      throw InputError(key + ": " + printable(output) + " is being written by another process (it holds " +
                       printable(lock_path_) + "); wait for it to end or choose another output");
    }
    // The holder before us may have unlinked the file between our open and our flock: then
    // we hold a lock on a file no other process will open. Ours only if the name is still it.
    struct stat held {}, named {};
    if (::fstat(lock.fd.get(), &held) == 0 && ::stat(lock_path_.c_str(), &named) == 0 &&
        named.st_dev == held.st_dev && named.st_ino == held.st_ino) {
      fd_ = std::move(lock.fd);
      return;
    }
  }
}

OutputLock::~OutputLock() {
  ::unlink(lock_path_.c_str());  // while still held: no other process can be holding it now
}  // then fd_ closes, releasing the lock

}  // namespace fsdp
