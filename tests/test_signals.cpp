// tests/test_signals.cpp: stop signals (fsdp/train/signals.hpp), the peer watchdog's process
// states and diagnosis (fsdp/train/watchdog.hpp), and the trainer's agreed stop at a step
// boundary. Signal delivery is tested in forked children that never call MPI; the
// end-to-end paths under mpirun are tests/cli/signals.sh.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/train/signals.hpp"
#include "fsdp/train/watchdog.hpp"
#include "child_process.hpp"
#include "train_util.hpp"

namespace {

using namespace test_util;

// Polls `pred` every 10 ms for up to 10 s.
template <class Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// A child process that sleeps until killed; reaped by the destructor.
struct Child {
  pid_t pid = -1;
  Child() {
    pid = fork();
    if (pid == 0) {
      for (;;) pause();
    }
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

bool state_is(pid_t pid, fsdp::ProcessState state) {
  return fsdp::local_process_state(pid) == state;
}

extern "C" void dummy_handler(int) {}

TEST(Signals, FirstPendingSignalWins) {
  fsdp::clear_pending_signal();
  EXPECT_EQ(fsdp::pending_signal(), 0);
  fsdp::note_signal(SIGUSR1);
  fsdp::note_signal(SIGTERM);
  EXPECT_EQ(fsdp::pending_signal(), SIGUSR1);
  fsdp::clear_pending_signal();
  EXPECT_EQ(fsdp::pending_signal(), 0);
  EXPECT_EQ(fsdp::signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(fsdp::signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(fsdp::signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(fsdp::signal_name(64), "signal 64");
}

TEST(Signals, GuardRecordsTheSignalAndRestoresThePreviousHandler) {
  struct sigaction mine {}, old {}, now {};
  mine.sa_handler = &dummy_handler;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &mine, &old), 0);
  fsdp::clear_pending_signal();
  {
    fsdp::SignalGuard guard;
    EXPECT_THROW(fsdp::SignalGuard second, fsdp::Error);
    ASSERT_EQ(raise(SIGUSR1), 0);  // delivered before raise returns (this thread)
    EXPECT_EQ(fsdp::pending_signal(), SIGUSR1);
    ASSERT_EQ(raise(SIGUSR1), 0);  // a second SIGUSR1 is ignored
    EXPECT_EQ(fsdp::pending_signal(), SIGUSR1);
  }
  ASSERT_EQ(sigaction(SIGUSR1, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &dummy_handler);
  ASSERT_EQ(sigaction(SIGUSR1, &old, nullptr), 0);
  fsdp::clear_pending_signal();
}

TEST(Signals, SecondSigtermOrSigintEndsTheProcessAtOnce) {
  const int term = in_child([] {
    fsdp::clear_pending_signal();
    fsdp::SignalGuard guard;
    raise(SIGTERM);
    if (fsdp::pending_signal() != SIGTERM) _exit(10);
    raise(SIGTERM);
    _exit(11);  // not reached: the second SIGTERM's default action ends the process
  });
  ASSERT_TRUE(WIFSIGNALED(term)) << "exit status " << WEXITSTATUS(term);
  EXPECT_EQ(WTERMSIG(term), SIGTERM);

  const int usr_then_int = in_child([] {
    fsdp::clear_pending_signal();
    fsdp::SignalGuard guard;
    raise(SIGUSR1);
    raise(SIGINT);
    _exit(12);
  });
  ASSERT_TRUE(WIFSIGNALED(usr_then_int)) << "exit status " << WEXITSTATUS(usr_then_int);
  EXPECT_EQ(WTERMSIG(usr_then_int), SIGINT);

  const int one = in_child([] {
    fsdp::clear_pending_signal();
    fsdp::SignalGuard guard;
    raise(SIGINT);
    _exit(fsdp::pending_signal() == SIGINT ? 0 : 13);
  });
  ASSERT_TRUE(WIFEXITED(one));
  EXPECT_EQ(WEXITSTATUS(one), 0);
}

TEST(Watchdog, ProcessStatesFromProc) {
  EXPECT_EQ(fsdp::local_process_state(getpid()), fsdp::ProcessState::running);
  const int64_t start = fsdp::process_start_time(getpid());
  ASSERT_GE(start, 0);
  EXPECT_EQ(fsdp::local_process_state(getpid(), start), fsdp::ProcessState::running);
  // The pid with another start time: a different process reusing it, so ours has exited.
  EXPECT_EQ(fsdp::local_process_state(getpid(), start + 1), fsdp::ProcessState::exited);
  Child c;
  ASSERT_GT(c.pid, 0);
  EXPECT_TRUE(eventually([&] { return state_is(c.pid, fsdp::ProcessState::running); }));
  kill(c.pid, SIGSTOP);
  EXPECT_TRUE(eventually([&] { return state_is(c.pid, fsdp::ProcessState::stopped); }));
  kill(c.pid, SIGCONT);
  EXPECT_TRUE(eventually([&] { return state_is(c.pid, fsdp::ProcessState::running); }));
  kill(c.pid, SIGKILL);  // a zombie until reaped: exited
  EXPECT_TRUE(eventually([&] { return state_is(c.pid, fsdp::ProcessState::exited); }));
  waitpid(c.pid, nullptr, 0);
  EXPECT_EQ(fsdp::local_process_state(c.pid), fsdp::ProcessState::exited);
  c.pid = -1;
}

TEST(Watchdog, DiagnosisNamesTheStoppedExitedOrRemoteRank) {
  const std::string host = fsdp::host_name();
  const int64_t me = getpid();
  std::vector<std::string> failures;
  auto record = [&](const std::string& line) { failures.push_back(line); };
  Child c;
  ASSERT_GT(c.pid, 0);
  const fsdp::PeerInfo self{host, me, fsdp::process_start_time(me)};
  const fsdp::PeerInfo child{host, c.pid, fsdp::process_start_time(c.pid)};
  ASSERT_GE(self.start_time, 0);
  ASSERT_GE(child.start_time, self.start_time);
  fsdp::PeerWatch local(0, {self, child}, 5.0, record);
  // A running peer: nothing before the timeout; at it, every rank is running.
  EXPECT_EQ(local.diagnose("all_reduce", 1.0), "");
  EXPECT_EQ(local.diagnose("all_reduce", 5.0),
            "rank 0 (host " + host + "): all_reduce did not complete within comm.timeout_s = 5 s; "
            "every other rank is running (busy, or waiting in a different collective)");
  kill(c.pid, SIGSTOP);
  ASSERT_TRUE(eventually([&] { return state_is(c.pid, fsdp::ProcessState::stopped); }));
  EXPECT_EQ(local.diagnose("all_gather", 4.9), "");
  const std::string stopped = "rank 0 (host " + host + "): all_gather did not complete within "
                              "comm.timeout_s = 5 s; rank 1 (host " + host + ", pid " +
                              std::to_string(c.pid) + ") is stopped";
  EXPECT_EQ(local.diagnose("all_gather", 5.0), stopped);
  local.waiting("all_gather", 5.1);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0], stopped);

  // Rank 1 of the same job: rank 0 is running and waits too, so rank 1 leaves it the report
  // for kReportGrace_s.
  fsdp::PeerWatch second(1, {self, child}, 5.0, record);
  EXPECT_EQ(second.diagnose("barrier", 5.5), "");
  EXPECT_NE(second.diagnose("barrier", 5.0 + fsdp::PeerWatch::kReportGrace_s), "");

  // An exited peer is reported kExitGrace_s after it is first seen, before the timeout (the
  // grace lets mpirun's teardown of the job arrive first).
  kill(c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
  const int64_t gone = c.pid;
  c.pid = -1;
  fsdp::clear_pending_signal();
  EXPECT_EQ(local.diagnose("broadcast", 0.3), "");
  EXPECT_EQ(local.diagnose("broadcast", 0.3 + fsdp::PeerWatch::kExitGrace_s - 0.1), "");
  EXPECT_EQ(local.diagnose("broadcast", 3.3),
            "rank 0 (host " + host + "): broadcast still waiting after 3.3 s; rank 1 (host " +
                host + ", pid " + std::to_string(gone) + ") has exited");
  // ... unless a stop signal is pending: the job is being torn down (quiet end).
  fsdp::note_signal(SIGTERM);
  EXPECT_EQ(local.diagnose("broadcast", 0.3), fsdp::PeerWatch::kQuiet);
  fsdp::clear_pending_signal();

  // Ranks on another host cannot be inspected: named as not answering.
  fsdp::PeerWatch remote(0, {self, {"elsewhere", 42, 7}, {"elsewhere", 43, 7}}, 2.5, record);
  EXPECT_EQ(remote.diagnose("reduce_scatter", 2.0), "");
  EXPECT_EQ(remote.diagnose("reduce_scatter", 2.5),
            "rank 0 (host " + host + "): reduce_scatter did not complete within comm.timeout_s = "
            "2.5 s; ranks on other hosts did not answer: 1 (host elsewhere), 2 (host elsewhere)");

  // Same host name but not this PID namespace (a process /proc does not show with that start
  // time, e.g. one container per rank): not inspectable either, and never "has exited".
  fsdp::PeerWatch hidden(0, {self, {host, me, self.start_time + 1}}, 1.0, record);
  EXPECT_EQ(hidden.diagnose("all_reduce", 0.5), "");
  EXPECT_EQ(hidden.diagnose("all_reduce", 1.0),
            "rank 0 (host " + host + "): all_reduce did not complete within comm.timeout_s = 1 s; "
            "ranks not visible in this host's /proc did not answer: 1 (host " + host + ")");
}

TEST(Watchdog, RuntimeKnowsEveryRanksHostAndPid) {
  const auto& peers = runtime().peers();
  ASSERT_EQ(static_cast<int>(peers.size()), world_size());
  EXPECT_EQ(peers[static_cast<std::size_t>(world_rank())].pid, getpid());
  EXPECT_EQ(peers[static_cast<std::size_t>(world_rank())].host, fsdp::host_name());
  for (const auto& p : peers) EXPECT_GT(p.pid, 0);
}

// A signal seen by the last rank only, at the boundary of step 3 of 5, stops every rank after
// step 3 with a checkpoint of it and no evaluation; resuming gives the uninterrupted losses.
TEST(Signals, TrainerStopsEveryRankAtTheSameStepAndResumes) {
  const std::string dir = fresh_dir("signal_stop");
  Config c = small_config(dir + "/stopped");
  c.eval.every = 2;  // step 2 evaluates; the stop at step 3 must not
  const int last = world_size() - 1;
  int calls = 0;
  TrainOptions o;
  o.pending_signal = [&] { return ++calls >= 3 && world_rank() == last ? SIGUSR1 : 0; };
  const TrainResult stopped = run(c, On::world, 0, false, o);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(stopped.stop_signal, SIGUSR1);
  EXPECT_EQ(stopped.stop_rank, last);
  EXPECT_EQ(stopped.final_step, 3);
  ASSERT_EQ(stopped.losses.size(), 3u);
  ASSERT_EQ(stopped.val_losses.size(), 1u);
  EXPECT_EQ(stopped.val_losses[0].first, 2);
  if (world_rank() == last) {
    EXPECT_EQ(stopped.stop_message,
              "received SIGUSR1 on rank " + std::to_string(last) + " (host " + fsdp::host_name() +
                  "); saved checkpoint " + fsdp::ckpt::step_dir(c.train.run_dir, 3) +
                  " at step 3; resume with --resume");
  } else {
    EXPECT_EQ(stopped.stop_message, "");
  }
  const auto latest = fsdp::ckpt::find_latest(c.train.run_dir);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, fsdp::ckpt::step_dir(c.train.run_dir, 3));

  const TrainResult resumed = run(c, On::world, 0, /*resume=*/true);
  EXPECT_EQ(resumed.stop_signal, 0);
  EXPECT_EQ(resumed.final_step, 5);
  Config ref_cfg = c;
  ref_cfg.train.run_dir = dir + "/ref";
  const TrainResult ref = run(ref_cfg, On::world);
  ASSERT_EQ(ref.losses.size(), 5u);
  ASSERT_EQ(resumed.losses.size(), 2u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(stopped.losses[s], ref.losses[s]) << "step " << s + 1;
  for (int s = 0; s < 2; ++s) EXPECT_EQ(resumed.losses[s], ref.losses[s + 3]) << "step " << s + 4;
  ASSERT_EQ(resumed.params.size(), ref.params.size());
  for (const auto& [name, values] : ref.params) {
    EXPECT_EQ(rel_diff(resumed.params.at(name), values), 0.0) << name;
  }
}

// A signal at the last step's boundary is ignored: the run completes.
TEST(Signals, SignalAtTheLastStepCompletesTheRun) {
  const std::string dir = fresh_dir("signal_last");
  Config c = small_config(dir + "/run");
  c.train.max_steps = 2;
  TrainOptions o;
  int calls = 0;
  o.pending_signal = [&] { return ++calls >= 2 ? SIGTERM : 0; };
  const TrainResult r = run(c, On::world, 0, false, o);
  EXPECT_EQ(r.stop_signal, 0);
  EXPECT_EQ(r.final_step, 2);
  ASSERT_EQ(r.val_losses.size(), 1u);  // the final evaluation ran
  EXPECT_EQ(r.val_losses[0].first, 2);
}

}  // namespace
