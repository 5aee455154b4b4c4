// fsdp/core/file_lock.hpp: an owned file descriptor, and the exclusive lock file that
// fsdp_train's run directory (fsdp/train/run_dir.hpp) and the tools' outputs
// (fsdp/core/output_lock.hpp) both take.
#pragma once

#include <string>
#include <utility>

namespace fsdp {

// Owns one file descriptor (-1: none); closes it when destroyed. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Closes the descriptor held (if any) and takes `fd`.
  void reset(int fd = -1);
  // Closes now; returns close(2)'s result (a deferred write error shows up here on NFS), 0
  // when none is held.
  int close();
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// A lock file opened by try_lock_file: `fd` is open in both cases; `held` says whether this
// process now holds the exclusive flock(2) on it (false: another open file description holds
// it, and the caller may read what the holder wrote there).
struct LockFile {
  UniqueFd fd;
  bool held = false;
};

// Opens `path` read-write (created 0644 if missing; a symbolic link is not followed) and tries
// an exclusive flock(LOCK_EX | LOCK_NB) on it. Throws InputError (exit 2), one line starting
// "<key>: ", "cannot create <path>: <strerror>" when it cannot be opened (e.g. a read-only
// folder, a link), "cannot lock <path>: not a regular file", or "cannot lock <path>:
// <strerror>" when flock fails for another reason than a holder (e.g. ENOLCK on an NFS
// without lock support). flock is advisory and per open file description, so two calls of
// one process exclude each other too.
LockFile try_lock_file(const std::string& path, const std::string& key);

}  // namespace fsdp
