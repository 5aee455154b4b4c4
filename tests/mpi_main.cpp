// tests/mpi_main.cpp: GoogleTest main for every test binary (single- or multi-rank).
// Initialises MPI, runs the tests, and makes the exit code agree on all ranks: if any rank
// failed, every rank exits non-zero (flashlight/HighFive's MPI test main).
// Rank 0 prints gtest's usual output; every other rank prints only its failures, prefixed
// with the rank (tests/rank_printer.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include "rank_printer.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fsdp_test::install_rank_printer(rank);
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !local_failed) {
    std::fprintf(stderr, "a test failed on another rank\n");
  }
  MPI_Finalize();
  return any_failed;
}
