// Stop signals: the async-signal-safe flag and its handler (see fsdp/train/signals.hpp).
#include "fsdp/train/signals.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>

#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

std::atomic<int> g_pending{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");
std::atomic<bool> g_guard_alive{false};

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (g_pending.compare_exchange_strong(expected, sig)) return;  // first: stop at the boundary
  if (sig == SIGUSR1) return;
  // A second SIGTERM / SIGINT: leave now, by the default action of the signal (it is blocked
  // inside this handler, so it is delivered, and ends the process, when the handler returns).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

}  // namespace

int pending_signal() noexcept { return g_pending.load(); }

void note_signal(int sig) noexcept {
  int expected = 0;
  g_pending.compare_exchange_strong(expected, sig);
}

void clear_pending_signal() noexcept { g_pending.store(0); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    case SIGKILL: return "SIGKILL";
    case SIGSTOP: return "SIGSTOP";
    default: return "signal " + std::to_string(sig);
  }
}

SignalGuard::SignalGuard() {
  if (g_guard_alive.exchange(true)) throw Error("SignalGuard: a SignalGuard is already installed");
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = &on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : kSignals) sigaddset(&sa.sa_mask, s);
  for (int s : kSignals) {
    if (sigaction(s, &sa, &previous_[installed_]) != 0) {
      const int err = errno;
      restore();  // what was installed so far
      g_guard_alive.store(false);
      throw Error("SignalGuard: sigaction(" + signal_name(s) + "): " + std::strerror(err));
    }
    ++installed_;
  }
}

void SignalGuard::restore() noexcept {
  while (installed_ > 0) {
    --installed_;
    sigaction(kSignals[installed_], &previous_[installed_], nullptr);
  }
}

SignalGuard::~SignalGuard() {
  restore();
  g_guard_alive.store(false);
}

}  // namespace fsdp
