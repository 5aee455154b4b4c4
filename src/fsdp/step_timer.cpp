// Per-phase step timing (see fsdp/fsdp/step_timer.hpp).
#include "fsdp/fsdp/step_timer.hpp"

#include <numeric>

#include "fsdp/core/error.hpp"

namespace fsdp {

double StepTimes::sum() const { return std::accumulate(phase_s.begin(), phase_s.end(), 0.0); }

StepTimer::StepTimer(DeviceRuntime& backend) : be_(backend) {
  device_clock_ = be_.create_timed_event() != nullptr;
}

void StepTimer::mark(Phase p) {
  TimedEvent* event = nullptr;
  if (device_clock_) {
    if (marks_.size() >= pool_.size()) pool_.push_back(be_.create_timed_event());
    event = pool_[marks_.size()].get();
    event->record(be_.compute_stream());
  }
  marks_.push_back({p, Clock::now(), event});
  current_ = p;
}

void StepTimer::begin(Phase first) {
  if (running_) throw Error("StepTimer::begin: a step is already running");
  marks_.clear();
  running_ = true;
  mark(first);
}

void StepTimer::enter(Phase p) {
  if (!running_ || p == current_) return;
  mark(p);
}

StepTimes StepTimer::end() {
  if (!running_) throw Error("StepTimer::end: no step is running");
  mark(current_);
  running_ = false;
  StepTimes t;
  t.step_s = std::chrono::duration<double>(marks_.back().host - marks_.front().host).count();
  if (profiler_ && profiler_->recording()) add_ranges();
  if (device_clock_) marks_.back().event->synchronize();
  for (std::size_t i = 0; i + 1 < marks_.size(); ++i) {
    const Mark& a = marks_[i];
    const Mark& b = marks_[i + 1];
    const double s = device_clock_ ? b.event->seconds_since(*a.event)
                                   : std::chrono::duration<double>(b.host - a.host).count();
    t.phase_s[static_cast<std::size_t>(a.phase)] += s;
  }
  return t;
}

// "step N" over the whole step, then one range per segment named after its phase.
void StepTimer::add_ranges() {
  auto ns = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  const int64_t step = profiler_->step();
  auto event = [&](std::string name, const char* cat, const Mark& a, const Mark& b) {
    TraceEvent e;
    e.name = std::move(name);
    e.cat = cat;
    e.start_ns = ns(a.host);
    e.dur_ns = ns(b.host) - e.start_ns;
    e.args.push_back({"step", step});
    profiler_->add(std::move(e));
  };
  event("step " + std::to_string(step), "step", marks_.front(), marks_.back());
  for (std::size_t i = 0; i + 1 < marks_.size(); ++i) {
    event(to_string(marks_[i].phase), "phase", marks_[i], marks_[i + 1]);
  }
}

StepTimer::Scope::Scope(StepTimer* timer, Phase p) {
  if (!timer || !timer->running() || timer->current() == p) return;
  // Evaluation and checkpointing are charged whole, their own collectives included.
  if (timer->current() == Phase::eval || timer->current() == Phase::checkpoint) return;
  timer_ = timer;
  previous_ = timer->current();
  timer->enter(p);
}

StepTimer::Scope::~Scope() {
  if (!timer_) return;
  try {
    timer_->enter(previous_);
  } catch (...) {
  }
}

}  // namespace fsdp
