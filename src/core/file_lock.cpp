// The owned descriptor and the lock file (fsdp/core/file_lock.hpp).
#include "fsdp/core/file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fsdp/core/error.hpp"

namespace fsdp {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int UniqueFd::close() {
  if (fd_ < 0) return 0;
  return ::close(std::exchange(fd_, -1));
}

LockFile try_lock_file(const std::string& path, const std::string& key) {
  const std::string name = printable(path);
  LockFile lock{UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644)),
                false};
  if (!lock.fd) throw InputError(key + ": cannot create " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(lock.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw InputError(key + ": cannot lock " + name + ": not a regular file");
  }
  if (::flock(lock.fd.get(), LOCK_EX | LOCK_NB) == 0) {
    lock.held = true;
  } else if (errno != EWOULDBLOCK) {
    throw InputError(key + ": cannot lock " + name + ": " + std::strerror(errno));
  }
  return lock;
}

}  // namespace fsdp
