// tests/rank_printer_probe.cpp: a gtest binary for tests/test_rank_printer.sh, not a test of
// its own. Its one test fails on the rank named by FSDP_PROBE_FAIL_RANK (none when unset),
// so the script can check what each rank prints (tests/rank_printer.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

TEST(RankPrinterProbe, FailsOnOneRank) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* fail = std::getenv("FSDP_PROBE_FAIL_RANK");
  const int fail_rank = fail ? std::atoi(fail) : -1;
  EXPECT_NE(rank, fail_rank) << "deliberate failure on rank " << rank;
}
