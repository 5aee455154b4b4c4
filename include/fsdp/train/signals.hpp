// fsdp/train/signals.hpp: stopping a run cleanly on SIGTERM, SIGINT or SIGUSR1.
//
// fsdp_train's main installs a SignalGuard. A handled signal only records itself in a
// process-wide flag (async-signal-safe: a lock-free std::atomic<int>, nothing else). The
// trainer reads the flag at each step boundary and agrees on it across ranks inside the
// step's existing peak-memory all-reduce, so a signal that reached any one rank stops every
// rank after the same step: nothing more is evaluated, the completed step is checkpointed,
// and fsdp_train exits with kExitInterrupted (3) (docs/checkpoint.md "Signals"). This is
// what torchrun's elastic agent and Lightning's SLURM requeue do with SIGTERM / SIGUSR1:
// save, then exit, instead of losing the work since the last checkpoint.
//
// A second SIGTERM or SIGINT while the first is pending (before the checkpoint is saved and
// the process has exited) ends the process at once: the handler restores the default action
// and re-raises the signal, as CPython's second Ctrl-C would. A second SIGUSR1 is ignored.
// The library never installs handlers by itself (unit tests run without them); tests can
// trigger the same path in-process with note_signal() or TrainOptions::pending_signal.
#pragma once

#include <csignal>
#include <string>

namespace fsdp {

// The first of SIGTERM, SIGINT, SIGUSR1 recorded since start-up or the last
// clear_pending_signal(), 0 if none. Async-signal-safe; any thread.
int pending_signal() noexcept;

// Records `sig` as received, unless a signal is already pending (the first one wins): what
// the handler does, callable by tests. Async-signal-safe.
void note_signal(int sig) noexcept;

// Forgets the pending signal (tests that run several jobs in one process).
void clear_pending_signal() noexcept;

// "SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", ... or "signal N" for other numbers.
std::string signal_name(int sig);

// Installs the handler for SIGTERM, SIGINT and SIGUSR1 (sigaction with SA_RESTART, the three
// signals blocked while it runs) and restores the previous dispositions when destroyed. One
// at a time per process: constructing a second while one is alive throws fsdp::Error, as
// does a failing sigaction (naming the signal and errno's text).
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();  // restores the previous handlers; the pending flag is left as it is
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  void restore() noexcept;
  static constexpr int kNumSignals = 3;
  struct sigaction previous_[kNumSignals];
  int installed_ = 0;  // handlers installed so far (previous_[0, installed_) are valid)
};

}  // namespace fsdp
