// fsdp/core/profiler.hpp: fsdp_train's built-in profiler (train.profile_steps, --profile).
//
// Over a window of training steps [first, last] (1-based, inclusive) a rank records
//  - host ranges on its "CPU" track: one "step N" per step, the step's phase segments as the
//    StepTimer cuts them (fsdp/fsdp/step_timer.hpp: data, forward, backward, comm_wait,
//    optimizer, eval, checkpoint; they tile the step exactly), and the issue and wait of every
//    collective of the engine and the trainer ("all_gather wait unit 3 (h.2)", args: bytes);
//  - device activity from an ActivityCollector the owner plugs in (the CUDA backend's CUPTI
//    collector, fsdp/cuda/cupti_collector.hpp: kernels, memcpys and memsets, one track per
//    stream),
// and after the window's last step writes them as a Chrome trace (the JSON object format
// torch.profiler's export_chrome_trace writes and Perfetto and chrome://tracing open):
//
//   {"traceEvents": [
//      {"ph": "M", "name": "process_name", "pid": RANK, "args": {"name": "rank 0"}},
//      {"ph": "M", "name": "thread_name", "pid": RANK, "tid": TID, "args": {"name": "CPU"}},
//      {"ph": "X", "cat": "phase", "name": "forward", "pid": RANK, "tid": TID,
//       "ts": 123.456, "dur": 78.9, "args": {"step": 2}}, ...],
//    "displayTimeUnit": "ms", "otherData": {...}}
//
// ts and dur are microseconds (with nanosecond decimals) of the host's steady clock
// (CLOCK_MONOTONIC; Profiler::now_ns), which device timestamps are translated to, so all the
// ranks of a node share one time axis. pid is the rank; the CPU track's tid is the OS id of
// the thread that built the Profiler (as torch's traces use), a stream's tid its CUDA stream
// id (named "stream N"). Categories: "step", "phase", "collective" on the host; "kernel",
// "gpu_memcpy", "gpu_memset" on streams (torch's names). tools/profile_summary.py tabulates
// a trace.
//
// Cost: nothing when profiling is off (the owners hold a null Profiler*: a ProfileRange is a
// null test, no clock read, no allocation); outside the window one more test of a bool. In
// the window a range costs two clock reads and one event in memory; the file is written
// once, after the window. Not thread-safe: one thread (the training thread) records.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace fsdp {

// One argument of a trace event ("args": {key: value}); a vector is written as an array
// (a CUDA grid [x, y, z]).
struct TraceArg {
  std::string key;
  std::variant<int64_t, double, std::string, std::vector<int64_t>> value;
};

// One complete event ("ph": "X").
struct TraceEvent {
  std::string name;
  std::string cat;        // "step", "phase", "collective", "kernel", "gpu_memcpy", "gpu_memset"
  int64_t start_ns = 0;   // Profiler::now_ns()'s clock
  int64_t dur_ns = 0;
  int64_t stream = -1;    // -1: the host ("CPU" track); else the device stream's id
  std::vector<TraceArg> args;
};

// Device activity collected over the window (the CUDA backend's CUPTI collector). The
// Profiler calls start() at the end of the step before the window (torch.profiler's warm-up
// step: CUPTI's start costs the host milliseconds, which would otherwise land in the first
// profiled step's data phase and leave the GPU idle there), or when the window's first step
// begins if it is step 1, and stop() after the window's last step, once each; stop() appends
// every completed activity with timestamps on Profiler::now_ns()'s clock (the Profiler drops
// those that began before the window's first step). Errors throw fsdp::Error.
class ActivityCollector {
 public:
  virtual ~ActivityCollector() = default;
  virtual void start() = 0;
  virtual void stop(std::vector<TraceEvent>& out) = 0;
  // Records the device dropped (buffers full); written to the trace's otherData.
  virtual int64_t dropped_records() const { return 0; }
};

class Profiler {
 public:
  // Records steps first..last (1 <= first <= last; the config checked them) of rank `rank`
  // into `path` (written by write()). `device`: device activity, or null (CPU backend).
  Profiler(int64_t first, int64_t last, int rank, std::string path,
           std::unique_ptr<ActivityCollector> device = nullptr);
  // A window cut short by an exception: writes what was recorded, best effort (never throws).
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Nanoseconds of the host's steady clock (std::chrono::steady_clock, CLOCK_MONOTONIC).
  static int64_t now_ns();

  // Whether the step begun last lies in the window (ranges are recorded).
  bool recording() const { return recording_; }
  // The step begun last (0 before the first).
  int64_t step() const { return step_; }
  // The first step begun (0 before it): 1 for a fresh run, N + 1 for a run resumed at step N.
  int64_t first_step_begun() const { return first_step_begun_; }
  int64_t first() const { return first_; }
  int64_t last() const { return last_; }
  const std::string& path() const { return path_; }

  // Step `step` (1-based) begins: recording() becomes whether it lies in the window; the
  // window's first step starts the device collector if the warm-up did not.
  void begin_step(int64_t step);
  // The step begun ends. Returns true when it was the window's last step: write() is due.
  // The end of the step before the window starts the device collector (the warm-up).
  bool end_step();
  // Adds an event (while recording; ignored otherwise).
  void add(TraceEvent event);

  // Stops the device collector and writes the trace to path() atomically (fsdp::AtomicFile),
  // creating its directory. Once: later calls do nothing. Returns false, writing nothing,
  // when no step of the window ran. Throws fsdp::Error naming the file on a write failure.
  bool write();
  bool written() const { return written_; }
  int64_t steps_recorded() const { return steps_recorded_; }

 private:
  int64_t first_, last_;
  int rank_;
  std::string path_;
  std::unique_ptr<ActivityCollector> device_;
  int64_t host_tid_ = 0;
  int64_t step_ = 0;
  int64_t first_step_begun_ = 0;
  int64_t steps_recorded_ = 0;
  bool recording_ = false;
  bool device_started_ = false;
  int64_t window_start_ns_ = 0;  // now_ns() when the window's first step began
  void start_device();           // starts the device collector, once
  bool written_ = false;
  std::vector<TraceEvent> events_;
};

// A host range on the CPU track, from construction to destruction (RAII). With a null
// `profiler`, or one not recording, it does nothing: one test, no clock read, no allocation.
//   ProfileRange range(profiler, "collective", "all_reduce loss wait");
//   ProfileRange range(profiler, "collective");
//   if (range) range.name("all_gather issue " + label).arg("bytes", n);  // built only if on
class ProfileRange {
 public:
  // `cat` and `name` must outlive the range (string literals).
  ProfileRange(Profiler* profiler, const char* cat, const char* name = "") noexcept
      : cat_(cat), static_name_(name) {
    if (profiler && profiler->recording()) {
      profiler_ = profiler;
      start_ns_ = Profiler::now_ns();
    }
  }
  ~ProfileRange() { end(); }
  // Ends the range now (a collective's issue, before its wait); the destructor then does
  // nothing.
  void end() noexcept {
    if (profiler_) finish();
    profiler_ = nullptr;
  }
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

  // Whether the range is being recorded: name() and arg() only then.
  explicit operator bool() const { return profiler_ != nullptr; }
  ProfileRange& name(std::string name);
  ProfileRange& arg(std::string key, int64_t value);
  ProfileRange& arg(std::string key, std::string value);

 private:
  void finish() noexcept;
  Profiler* profiler_ = nullptr;
  int64_t start_ns_ = 0;
  const char* cat_;
  const char* static_name_;
  std::string name_;
  std::vector<TraceArg> args_;
};

}  // namespace fsdp
