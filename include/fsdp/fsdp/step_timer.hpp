// fsdp/fsdp/step_timer.hpp: where a training step's time goes, by phase.
//
// A step is a timeline cut into consecutive segments, each charged to one Phase: the
// trainer enters data, forward, optimizer, eval and checkpoint; the engine enters backward
// at a unit's first pre-backward hook and wraps every wait on a collective (all-gather,
// reduce-scatter, all-reduce, and the trainer's own loss/norm/agreement collectives) in a
// comm_wait Scope, which returns to the phase it interrupted. Every instant between begin()
// and end() belongs to exactly one phase, so the phases add up to the step. Evaluation and
// checkpointing are charged whole (a comm_wait Scope inside them does nothing).
//
// comm_wait is the *exposed* communication: the time the host (CPU backend, MPI) or the
// compute stream (CUDA) waited for a collective that had not finished. Communication that
// overlapped compute (a prefetched all-gather that completed in time) costs nothing there;
// this is what PyTorch's profiler shows as the gap before a stream waits on the NCCL stream.
//
// Clocks: on a backend whose kernels run on the host (create_timed_event() returns null, the
// CPU backend) every segment is timed with the host's steady clock. On a device backend every
// mark also records a timed event on the compute stream and segments are timed by the device
// (cudaEventElapsedTime between consecutive marks), since the host runs ahead of the GPU; the
// step's wall time (StepTimes::step_s) is always the host clock from begin() to end(). The
// trainer synchronizes the device before the step's last mark, so the two agree to the
// launch latency of the first mark.
//
// Cost: one steady_clock read per mark (and one cudaEventRecord on a device), about
// 4 x units + 10 marks per step; events are pooled and reused.
//
// Profiling (fsdp/core/profiler.hpp): with a Profiler set that is recording the step, end()
// adds the range "step N" (begin() to end()) and one range per segment, named after its
// phase, on the host clock (the host marks; the device-timed phase_s may differ by the
// launch latency on CUDA), so the ranges inside a step add up to it exactly.
#pragma once

#include <array>
#include <chrono>
#include <iterator>
#include <memory>
#include <vector>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/core/profiler.hpp"

namespace fsdp {

enum class Phase : int { data, forward, backward, comm_wait, optimizer, eval, checkpoint };
inline constexpr int kNumPhases = 7;
// The metrics.jsonl keys are these names + "_s".
template <>
struct EnumNames<Phase> {
  static constexpr EnumName<Phase> table[] = {
      {Phase::data, "data"},           {Phase::forward, "forward"},
      {Phase::backward, "backward"},   {Phase::comm_wait, "comm_wait"},
      {Phase::optimizer, "optimizer"}, {Phase::eval, "eval"},
      {Phase::checkpoint, "checkpoint"}};
};
static_assert(std::size(EnumNames<Phase>::table) == kNumPhases);

// One step's times, seconds.
struct StepTimes {
  double step_s = 0;                       // host wall clock, begin() to end()
  std::array<double, kNumPhases> phase_s{};  // seconds charged to each Phase
  double operator[](Phase p) const { return phase_s[static_cast<std::size_t>(p)]; }
  double sum() const;                      // of phase_s
};

class StepTimer {
 public:
  // Times steps of work enqueued on `backend.compute_stream()`.
  explicit StepTimer(DeviceRuntime& backend);
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  bool running() const { return running_; }
  Phase current() const { return current_; }
  // Starts a step in phase `first`. Throws fsdp::Error if a step is running.
  void begin(Phase first);
  // From now on the step is in phase `p` (a mark). No-op when no step is running or when it
  // already is in `p`.
  void enter(Phase p);
  // Ends the step: the last mark, then (device clock) waits for the marks' events and reads
  // them. Throws fsdp::Error if no step is running.
  StepTimes end();
  // Adds each recorded step's ranges to `profiler` (null: none; not owned).
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }

  // Enters `p` (when `timer` is non-null and running) and on destruction returns to the
  // phase it interrupted. Nests. Inside Phase::eval or Phase::checkpoint it does nothing:
  // those phases are charged whole, their own collectives included, so comm_wait is the
  // training step's. Never throws from its destructor (a failed mark is dropped).
  class Scope {
   public:
    Scope(StepTimer* timer, Phase p);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepTimer* timer_ = nullptr;
    Phase previous_ = Phase::data;
  };

 private:
  using Clock = std::chrono::steady_clock;
  struct Mark {
    Phase phase;             // the phase starting here (the last mark's is unused)
    Clock::time_point host;
    TimedEvent* event;       // device clock (null on a host backend)
  };
  void mark(Phase p);
  void add_ranges();

  DeviceRuntime& be_;
  Profiler* profiler_ = nullptr;
  bool device_clock_ = false;
  std::vector<std::unique_ptr<TimedEvent>> pool_;  // events of marks, reused every step
  std::vector<Mark> marks_;
  bool running_ = false;
  Phase current_ = Phase::data;
};

}  // namespace fsdp
