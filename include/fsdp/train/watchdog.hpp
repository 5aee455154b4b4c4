// fsdp/train/watchdog.hpp: ending the job when a peer rank dies or stops answering.
//
// The Runtime gathers every rank's host name and pid at start-up and installs a PeerWatch as
// the WaitHook of its MPI communicators (fsdp/comm/mpi_communicator.hpp): every blocking
// wait on an MPI collective (Work::wait, barrier; the host side of staged CUDA collectives)
// polls and calls it about every 0.25 s from the waiting thread itself, so no second thread
// calls MPI and MPI_THREAD_FUNNELED suffices. PyTorch's counterpart is ProcessGroupNCCL's
// watchdog with init_process_group(timeout=...); NCCL communicators keep their own watchdog
// on the same comm.timeout_s (fsdp/cuda/nccl_communicator.hpp).
//
// The PeerWatch ends the job (prints one line `fsdp_train: ...` on stderr, then MPI_Abort
// with exit code 1, which mpirun turns into the end of every rank) when
//  - a rank on this host has exited (its /proc/<pid> is gone or a zombie): kExitGrace_s after
//    this rank first sees it, without waiting for the timeout. The grace lets mpirun's own
//    teardown (SIGCONT, then SIGTERM to the survivors: see below) arrive first; without it a
//    rank that was itself stopped and is continued by that teardown reports its peer's
//    MPI_Abort as a second line; or
//  - the wait has lasted comm.timeout_s: the line names the ranks of this host that are
//    stopped (state 'T', e.g. SIGSTOP) or exited, or else the ranks of other hosts, whose
//    state it cannot see, or says that every peer is running (busy or in another collective).
//    A rank of the same host name whose process was not visible in /proc with its start time
//    when the PeerWatch was built (another PID namespace: one container per rank) counts as
//    one it cannot see, never as exited.
//    If a running rank of this host with a lower number is waiting too, this rank gives it
//    kReportGrace_s to report first, so a job prints one line, not one per waiting rank.
// A rank that sees a peer exited while a stop signal is pending (fsdp/train/signals.hpp)
// ends quietly (_exit(1)): mpirun is tearing the job down, SIGTERMs the survivors of a dead
// rank and names it itself.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/comm/communicator.hpp"
#include "fsdp/core/process.hpp"  // host_name

namespace fsdp {

struct PeerInfo {
  std::string host;        // host name (gethostname) of the rank
  int64_t pid = 0;         // its process id on that host
  int64_t start_time = -1; // its start time (/proc/<pid>/stat field 22, clock ticks after boot)
};

// The start time of process `pid` on this host (field 22 of /proc/<pid>/stat), -1 if there is
// no such process visible here.
int64_t process_start_time(int64_t pid);

enum class ProcessState { running, stopped, exited };
// The state of process `pid` on this host from /proc/<pid>/stat: 'T'/'t' (stopped, traced)
// -> stopped; no such process, 'Z' (zombie), 'X', or (if start_time >= 0) another process
// that reuses the pid -> exited; anything else -> running.
ProcessState local_process_state(int64_t pid, int64_t start_time = -1);

class PeerWatch final : public WaitHook {
 public:
  static constexpr double kReportGrace_s = 2.0;
  static constexpr double kExitGrace_s = 3.0;
  // `rank`: this rank in `peers` (the world, indexed by world rank). `fail` receives the
  // diagnosis (one line, without the "fsdp_train: " prefix; empty: end quietly) and must end
  // the process; if it returns, the wait goes on (tests). timeout_s: comm.timeout_s (> 0).
  PeerWatch(int rank, std::vector<PeerInfo> peers, double timeout_s,
            std::function<void(const std::string&)> fail);
  void set_timeout(double timeout_s) { timeout_s_ = timeout_s; }  // seconds, > 0
  double timeout_s() const { return timeout_s_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }

  void waiting(const char* what, double waited_s) noexcept override;

  // The line waiting() reports after `waited_s` seconds on `what`, "" when it would keep
  // waiting, kQuiet when it would end the process without a line.
  std::string diagnose(const char* what, double waited_s) const;
  static const char* const kQuiet;

 private:
  int rank_;
  std::vector<PeerInfo> peers_;
  std::vector<bool> visible_;  // peers_[r] is a process of this host that /proc shows
  double timeout_s_;
  std::function<void(const std::string&)> fail_;
  // The waited_s at which this rank first saw a peer exited; < 0: not yet.
  mutable double exited_seen_s_ = -1.0;
};

}  // namespace fsdp
