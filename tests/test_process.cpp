// tests/test_process.cpp: fsdp::world_rank() and fsdp::where() (fsdp/core/process.hpp), the
// "rank R on HOST" of error lines, which core finds without MPI: under mpirun (np 1 and 2)
// the launcher's environment gives the MPI rank before the Runtime says it, and what the
// Runtime says wins.
#include <gtest/gtest.h>
#include <mpi.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"

namespace {

int mpi_rank() {
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

TEST(Process, HostNameIsGethostname) {
  char buf[256] = {};
  ASSERT_EQ(gethostname(buf, sizeof buf - 1), 0);
  EXPECT_EQ(fsdp::host_name(), std::string(buf));
}

// Runs first (gtest keeps file order): nothing has called set_world_rank yet.
TEST(Process, RankFromTheLauncherBeforeTheRuntimeSaysIt) {
  EXPECT_EQ(fsdp::world_rank(), mpi_rank()) << "mpirun exports OMPI_COMM_WORLD_RANK";
  EXPECT_EQ(fsdp::where(), "rank " + std::to_string(mpi_rank()) + " on " + fsdp::host_name());
}

TEST(Process, WhatTheRuntimeSaysWins) {
  fsdp::set_world_rank(mpi_rank() + 40);
  EXPECT_EQ(fsdp::world_rank(), mpi_rank() + 40);
  EXPECT_EQ(fsdp::where(), "rank " + std::to_string(mpi_rank() + 40) + " on " + fsdp::host_name());
  fsdp::set_world_rank(mpi_rank());
}

}  // namespace

// Issue 29 item 7: an error line under mpirun came out torn by another rank's output
// (std::cerr wrote "fsdp_train: ", the message and the newline separately). write_line makes
// one write(2): on a packet-mode pipe (O_DIRECT, each write one packet, each read at most one
// packet) a single read returns the whole line.
TEST(Process, WriteLineIsOneWrite) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_DIRECT), 0);
  const std::string line = "fsdp_train: rank 3: " + std::string(300, 'x');
  fsdp::write_line(fds[1], line);
  std::string buf(4096, '\0');
  const ssize_t n = ::read(fds[0], buf.data(), buf.size());
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_EQ(n, static_cast<ssize_t>(line.size() + 1));
  EXPECT_EQ(buf.substr(0, static_cast<std::size_t>(n)), line + "\n");
}

// The process's age from /proc advances with the wall clock (clock-tick resolution) and
// started before this test did.
TEST(Process, SecondsSinceStartFollowTheWallClock) {
  const double t0 = fsdp::seconds_since_process_start();
  ASSERT_GE(t0, 0.0);
  const auto w0 = std::chrono::steady_clock::now();
  volatile double sink = 0;  // real work, no sleep: about 0.2 s of the wall clock
  while (std::chrono::steady_clock::now() - w0 < std::chrono::milliseconds(200)) sink = sink + 1;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  const double t1 = fsdp::seconds_since_process_start();
  EXPECT_NEAR(t1 - t0, wall, 0.03);  // two readings of 10 ms ticks, plus scheduling
}
