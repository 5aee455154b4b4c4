// Atomic file publication: temp name, fsync, rename, directory fsync (see
// fsdp/core/atomic_file.hpp).
#include "fsdp/core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/file_lock.hpp"

namespace fs = std::filesystem;

namespace fsdp {

namespace {

std::string parent_or_dot(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

// The live temporaries, for the signal handler: a slot is free (0), being filled (1) or
// holds the absolute path of a temporary that may exist (2). Lock-free atomics only, so the
// handler may read them.
struct TempSlot {
  std::atomic<int> state{0};
  char path[4096];
};
constexpr int kTempSlots = 32;
TempSlot g_temps[kTempSlots];
static_assert(std::atomic<int>::is_always_lock_free);

int register_temporary(const std::string& tmp) noexcept {
  std::error_code ec;
  const std::string abs = fs::absolute(tmp, ec).string();
  if (ec || abs.size() >= sizeof(TempSlot::path)) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (g_temps[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_temps[i].path, abs.c_str(), abs.size() + 1);
      g_temps[i].state.store(2, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void release_temporary(int slot) noexcept {
  if (slot >= 0) g_temps[slot].state.store(0, std::memory_order_release);
}

extern "C" void remove_temporaries_and_reraise(int sig) {
  const int saved = errno;
  for (TempSlot& t : g_temps) {
    if (t.state.load(std::memory_order_acquire) == 2) ::unlink(t.path);
  }
  ::signal(sig, SIG_DFL);
  errno = saved;
  ::raise(sig);
}

}  // namespace

void remove_temporaries_on_signal() noexcept {
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // inherited as ignored: keep it so
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_reraise;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

void fsync_path(const std::string& path, bool directory) {
  UniqueFd fd(::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC)));
  if (fd.get() < 0) throw Error(path + ": cannot open for fsync: " + std::strerror(errno));
  if (::fsync(fd.get()) != 0) throw Error(path + ": fsync failed: " + std::strerror(errno));
}

void rename_durably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw Error(to + ": cannot rename from " + from + ": " + std::strerror(errno));
  }
  fsync_path(parent_or_dot(to), true);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  remove_tmp();
  signal_slot_ = register_temporary(tmp_path_);
}

AtomicFile::~AtomicFile() {
  if (!committed_) remove_tmp();
  release_temporary(signal_slot_);
}

void AtomicFile::remove_tmp() noexcept {
  std::error_code ec;
  fs::remove(tmp_path_, ec);
}

void AtomicFile::commit() {
  if (committed_) throw Error(path_ + ": AtomicFile::commit called twice");
  try {
    {
      UniqueFd fd(::open(tmp_path_.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0) throw Error(path_ + ": cannot open " + tmp_path_ + " for fsync: " + std::strerror(errno));
      if (::fsync(fd.get()) != 0) throw Error(path_ + ": fsync failed: " + std::strerror(errno));
    }
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
      throw Error(path_ + ": cannot rename from " + tmp_path_ + ": " + std::strerror(errno));
    }
    committed_ = true;  // the temporary is gone: nothing to remove any more
    release_temporary(signal_slot_);
    signal_slot_ = -1;
    fsync_path(parent_or_dot(path_), true);
  } catch (...) {
    if (!committed_) remove_tmp();
    throw;
  }
}

void AtomicFile::write(const std::function<void(const std::string& tmp)>& fill) {
  try {
    fill(tmp_path_);
  } catch (const Error& e) {
    remove_tmp();
    std::string msg = e.what();
    for (const std::string& name : {tmp_path_, path_}) {  // name the final file once
      const std::string prefix = name + ": ";
      if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
    }
    throw Error(path_ + ": " + msg, e.exit_code());
  } catch (...) {
    remove_tmp();
    throw;
  }
  commit();
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write([&](const std::string& tmp) {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw Error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Error(path + ": write failed: " + std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
    if (fd.close() != 0) throw Error(path + ": write failed: " + std::strerror(errno));
  });
}

}  // namespace fsdp
