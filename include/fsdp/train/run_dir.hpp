// fsdp/train/run_dir.hpp: rank 0's hold on train.run_dir for the length of a run.
//
// Before anything is written into run_dir, rank 0 opens it (open_run_dir):
//   1. creates run_dir and takes an exclusive flock(2) on run_dir/fsdp_train.lock, writing one
//      line "host H pid P started T" (T in ISO 8601 UTC) into it. A second fsdp_train run into
//      the same run_dir is refused while the first holds the lock. A lock file that still holds
//      a line but whose flock is free was left by a run that died: it is taken over (the
//      caller logs the line of the dead holder). The lock is released (and the file emptied)
//      when the RunDir is destroyed; the kernel releases it if the process dies.
//   2. refuses a fresh run (no --resume) into a run_dir that holds step directories
//      (checkpoints/step_*), checkpoints/latest, or a non-empty metrics.jsonl; the lock file
//      does not count.
//   3. creates run_dir/checkpoints/ and proves it writable (creates and removes a probe file),
//      so an unwritable path stops the run at start, not after hours of training.
// Then, once the model holds its starting weights (resume / init_from loaded) and before the
// first evaluation or step, RunDir::open_metrics opens metrics.jsonl (truncated for a fresh
// run, appended to on --resume): a run that fails while loading leaves no metrics.jsonl.
// flock is advisory and per open file description; on NFS it needs a server with lock support.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "fsdp/core/file_lock.hpp"

namespace fsdp {

// Creates and removes a probe file in `dir`: proves files can be created there (checkpoints/
// at start-up; profile/ when the profiler is on). Throws InputError "<key>: cannot write in
// <dir>: <strerror>".
void probe_writable(const std::string& dir, const std::string& key);

// metrics.jsonl opened for appending lines. Every append is written with write(2) at once
// (no buffering), so a full disk is seen at the line that does not fit.
class MetricsFile {
 public:
  MetricsFile() = default;
  // Opens (creates) `path`; `truncate` empties it first. Appending (a resume), an unfinished
  // last line (no newline: the process that wrote it died mid-write) is cut off first, so the
  // new lines do not join it into one malformed line; unfinished_bytes() says how much.
  // Throws InputError "train.run_dir: cannot write <path>: <strerror>" ("...: not a regular
  // file" for a FIFO, a device, ...).
  MetricsFile(const std::string& path, bool truncate);
  bool is_open() const { return static_cast<bool>(fd_); }
  const std::string& path() const { return path_; }
  // Bytes of the unfinished last line cut off at opening (0: none).
  int64_t unfinished_bytes() const { return unfinished_bytes_; }
  // Appends `line` and a newline. Throws fsdp::Error (exit 1) "<path>: write failed: <strerror>"
  // ("No space left on device" on a full disk); a partly written line is cut off again so the
  // file stays valid JSON lines.
  void append_line(std::string_view line);

 private:
  UniqueFd fd_;  // move-only, and so is MetricsFile
  std::string path_;
  int64_t unfinished_bytes_ = 0;
};

// Rank 0's hold on run_dir: the lock and metrics.jsonl. Move-only.
class RunDir {
 public:
  RunDir();
  RunDir(RunDir&&) noexcept;
  RunDir& operator=(RunDir&&) noexcept;
  ~RunDir();  // empties the lock file and releases the lock
  const std::string& path() const { return path_; }
  // A dead run's lock taken over, "host H pid P (started T)" (escaped), "" if none.
  const std::string& stale_holder() const { return stale_holder_; }
  // Opens run_dir/metrics.jsonl for appending; `resume` false empties it first. Throws
  // InputError "train.run_dir: cannot write <path>: <strerror>".
  void open_metrics(bool resume);
  MetricsFile& metrics() { return metrics_; }

 private:
  friend RunDir open_run_dir(const std::string& run_dir, bool resume);
  std::string path_;
  UniqueFd lock_;  // run_dir/fsdp_train.lock, flock held
  std::string stale_holder_;
  MetricsFile metrics_;
};

// Steps 1-3 above. Throws InputError (exit 2), one line naming train.run_dir and the path:
//   "train.run_dir: D is in use by another fsdp_train run (host H, pid P, started T); ..."
//   "train.run_dir: D already holds checkpoints (...); pass --resume ... or choose another ..."
//   "train.run_dir: cannot write D/checkpoints: <strerror>"  (and likewise for run_dir itself)
RunDir open_run_dir(const std::string& run_dir, bool resume);

// The lock file's name inside run_dir: "fsdp_train.lock".
inline constexpr const char* kRunDirLockName = "fsdp_train.lock";

}  // namespace fsdp
