// Rank 0's run-directory lock, fresh-run checks and write probes (see fsdp/train/run_dir.hpp).
#include "fsdp/train/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"  // host_name

namespace fs = std::filesystem;

namespace fsdp {

namespace {

std::string errno_text() { return std::strerror(errno); }

// "host H pid P started T" of this process.
std::string holder_line() {
  char when[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "host " + host_name() + " pid " + std::to_string(::getpid()) + " started " + when;
}

// The whole content of an open file (the lock file: one short line).
std::string read_all(int fd) {
  std::string s;
  char buf[512];
  off_t off = 0;
  while (s.size() < 4096) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<std::size_t>(n));
    off += n;
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// The fields of a lock line "host H pid P started T"; false if it is not one. Another
// process's bytes are untrusted: the fields come back escaped.
bool parse_holder(const std::string& line, std::string& host, std::string& pid, std::string& started) {
  std::istringstream in(line);
  std::string k1, k2, k3, rest;
  if (!(in >> k1 >> host >> k2 >> pid >> k3 >> started) || (in >> rest) || k1 != "host" ||
      k2 != "pid" || k3 != "started") {
    return false;
  }
  host = printable(host);
  pid = printable(pid);
  started = printable(started);
  return true;
}

// "host h, pid p, started t" (the in-use message) or "host h pid p (started t)" (`stale`).
std::string describe_holder(const std::string& line, bool stale) {
  std::string host, pid, started;
  if (parse_holder(line, host, pid, started)) {
    return stale ? "host " + host + " pid " + pid + " (started " + started + ")"
                 : "host " + host + ", pid " + pid + ", started " + started;
  }
  if (line.empty()) return "holder not yet recorded";
  return "lock file says '" + printable(line) + "'";
}

void write_all(int fd, const std::string& s, const std::string& path) {
  if (::ftruncate(fd, 0) != 0) throw InputError("train.run_dir: cannot write " + path + ": " + errno_text());
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::pwrite(fd, s.data() + done, s.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError("train.run_dir: cannot write " + path + ": " + errno_text());
    done += static_cast<std::size_t>(n);
  }
}

// Creates `dir` (and parents). InputError naming it if that fails or it is not a directory.
void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError("train.run_dir: cannot create " + dir + ": " + ec.message());
  if (!fs::is_directory(dir, ec)) throw InputError("train.run_dir: " + dir + " is not a directory");
}

// What of an earlier run a fresh run must not overwrite: "" when nothing.
std::string earlier_run_contents(const std::string& run_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  const fs::path ck = ckpt::checkpoints_dir(run_dir);
  if (fs::exists(ck / "latest", ec)) found.push_back("checkpoints/latest");
  if (fs::is_directory(ck, ec)) {
    std::vector<std::string> steps;
    for (const auto& de : fs::directory_iterator(ck, ec)) {
      const std::string name = de.path().filename().string();
      if (name.rfind("step_", 0) == 0) steps.push_back(name);
    }
    if (!steps.empty()) {
      std::sort(steps.begin(), steps.end());
      found.push_back(steps.size() == 1 ? "checkpoints/" + printable(steps.back())
                                        : std::to_string(steps.size()) + " step directories, newest checkpoints/" +
                                              printable(steps.back()));
    }
  }
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0 && !ec) {
    found.push_back("a non-empty metrics.jsonl");
  }
  std::string out;
  for (const auto& f : found) out += (out.empty() ? "" : ", ") + f;
  return out;
}

}  // namespace

void probe_writable(const std::string& dir, const std::string& key) {
  const std::string probe = (fs::path(dir) / (".write_probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(key + ": cannot write in " + dir + ": " + errno_text());
  const ssize_t n = ::write(fd, "x", 1);
  const int err = n == 1 ? 0 : errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (err != 0) throw InputError(key + ": cannot write in " + dir + ": " + std::strerror(err));
}


// ---- MetricsFile ----

MetricsFile::MetricsFile(const std::string& path, bool truncate) : path_(path) {
  fd_.reset(::open(path.c_str(),
                   O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644));
  if (!fd_) throw InputError("train.run_dir: cannot write " + path + ": " + errno_text());
  auto fail = [](const std::string& what) {  // fd_ closes as the constructor unwinds
    throw InputError("train.run_dir: " + what);
  };
  struct stat st {};
  // A FIFO would block the run once its buffer is full (opened read-write it never blocks
  // here); anything else cannot take appended lines.
  if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode))
    fail("cannot write " + path + ": not a regular file");
  // The end of the last complete line: scan back from the end in blocks for a newline.
  const off_t size = ::lseek(fd_.get(), 0, SEEK_END);
  off_t keep = size;
  char block[4096];
  constexpr auto kBlock = static_cast<off_t>(sizeof block);
  while (keep > 0) {
    const off_t from = keep > kBlock ? keep - kBlock : 0;
    const ssize_t n = ::pread(fd_.get(), block, static_cast<std::size_t>(keep - from), from);
    if (n != keep - from)
      fail("cannot read " + path + ": " + (n < 0 ? errno_text() : std::string("short read")));
    const void* nl = ::memrchr(block, '\n', static_cast<std::size_t>(n));
    if (nl) {
      keep = from + (static_cast<const char*>(nl) - block) + 1;
      break;
    }
    keep = from;
  }
  if (keep < size) {
    if (::ftruncate(fd_.get(), keep) != 0)
      fail("cannot cut the unfinished last line of " + path + ": " + errno_text());
    unfinished_bytes_ = size - keep;
  }
}

void MetricsFile::append_line(std::string_view line) {
  if (!fd_) throw Error("metrics.jsonl: not open");
  const off_t start = ::lseek(fd_.get(), 0, SEEK_END);
  std::string s(line);
  s += '\n';
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd_.get(), s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      if (start >= 0 && done > 0) (void)!::ftruncate(fd_.get(), start);  // no half line left behind
      throw Error(path_ + ": write failed: " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
}

// ---- RunDir ----

RunDir::RunDir() = default;

RunDir::RunDir(RunDir&& o) noexcept = default;

RunDir& RunDir::operator=(RunDir&& o) noexcept {
  if (this != &o) {
    RunDir old(std::move(*this));  // releases our lock at end of scope
    path_ = std::move(o.path_);
    lock_ = std::move(o.lock_);
    stale_holder_ = std::move(o.stale_holder_);
    metrics_ = std::move(o.metrics_);
  }
  return *this;
}

RunDir::~RunDir() {
  if (!lock_) return;
  (void)!::ftruncate(lock_.get(), 0);  // an empty lock file is a released one, not a stale one
  ::flock(lock_.get(), LOCK_UN);
}  // then lock_ closes

RunDir open_run_dir(const std::string& run_dir, bool resume) {
  RunDir rd;
  rd.path_ = run_dir;
  make_dir(run_dir);
  const std::string lock_path = (fs::path(run_dir) / kRunDirLockName).string();
  {
    // Owned here until the lock is ours: only then may RunDir's destructor empty the file.
    LockFile lock = try_lock_file(lock_path, "train.run_dir");
    if (!lock.held) {
      throw InputError("train.run_dir: " + run_dir + " is in use by another fsdp_train run (" +
                       describe_holder(read_all(lock.fd.get()), false) + "); wait for it to end or choose another " +
                       "train.run_dir (lock file " + lock_path + ")");
    }
    rd.lock_ = std::move(lock.fd);
  }
  const std::string previous = read_all(rd.lock_.get());
  if (!previous.empty()) rd.stale_holder_ = describe_holder(previous, true);
  write_all(rd.lock_.get(), holder_line() + "\n", lock_path);

  if (!resume) {
    const std::string earlier = earlier_run_contents(run_dir);
    if (!earlier.empty()) {
      throw InputError("train.run_dir: \"" + run_dir + "\" already holds checkpoints or metrics of an earlier run (" +
                       earlier + "); pass --resume to continue that run or choose another train.run_dir");
    }
  }
  const std::string ck = ckpt::checkpoints_dir(run_dir);
  make_dir(ck);
  probe_writable(ck, "train.run_dir");
  return rd;
}

void RunDir::open_metrics(bool resume) {
  metrics_ = MetricsFile((fs::path(path_) / "metrics.jsonl").string(), /*truncate=*/!resume);
}

}  // namespace fsdp
