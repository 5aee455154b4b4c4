// An exclusive lock on a named output for the length of a write (fsdp/core/output_lock.hpp).
#include "fsdp/core/output_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp {

OutputLock::OutputLock(const std::string& output, std::string lock_path, const std::string& key)
    : lock_path_(std::move(lock_path)) {
  const std::string name = printable(lock_path_);
  for (;;) {
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) throw InputError(key + ": cannot create " + name + ": " + std::strerror(errno));
    struct stat held {};
    if (::fstat(fd, &held) != 0 || !S_ISREG(held.st_mode)) {
      ::close(fd);
      throw InputError(key + ": cannot lock " + name + ": not a regular file");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        throw InputError(key + ": " + printable(output) +
                         " is being written by another process (it holds " + name +
                         "); wait for it to end or choose another output");
      }
      throw InputError(key + ": cannot lock " + name + ": " + std::strerror(err));
    }
    // The holder before us may have unlinked the file between our open and our flock: then
    // we hold a lock on a file no other process will open. Ours only if the name is still it.
    struct stat named {};
    if (::stat(lock_path_.c_str(), &named) == 0 && named.st_dev == held.st_dev &&
        named.st_ino == held.st_ino) {
      fd_ = fd;
      return;
    }
    ::close(fd);
  }
}

OutputLock::~OutputLock() {
  ::unlink(lock_path_.c_str());  // while still held: no other process can be holding it now
  ::close(fd_);
}

}  // namespace fsdp
