// tests/rank_printer.hpp: what every rank but 0 prints in a multi-rank gtest run
// (tests/mpi_main.cpp, tests/gpu_main.cpp).
//
// Rank 0 keeps gtest's own result printer. Every other rank replaces it with this listener,
// which stays quiet while its tests pass and prints each failure as it happens, prefixed
// with the rank, so a failure on rank 3 of 4 is seen in the ctest log instead of only as
// "exit 1":
//   [rank 3] tests/test_fsdp.cpp:88: Failure
//   [rank 3] Expected equality of these values: ...
//   [rank 3] FAILED Fsdp.FullShardMatchesOneRank (120 ms)
// Lines go to stdout and are flushed per failure, so they interleave with rank 0's output at
// line granularity under mpirun.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>

namespace fsdp_test {

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : prefix_("[rank " + std::to_string(rank) + "] ") {}

  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::ostringstream os;
    os << (r.file_name() ? r.file_name() : "unknown file");
    if (r.line_number() >= 0) os << ':' << r.line_number();
    os << ": Failure\n" << r.message();
    print(os.str());
  }

  void OnTestEnd(const testing::TestInfo& info) override {
    if (!info.result() || !info.result()->Failed()) return;
    std::ostringstream os;
    os << "FAILED " << info.test_suite_name() << '.' << info.name();
    if (info.value_param()) os << " (param " << info.value_param() << ')';
    os << " (" << info.result()->elapsed_time() << " ms)";
    print(os.str());
  }

  // Failures outside any test (a SetUpTestSuite, an environment) end up here.
  void OnTestProgramEnd(const testing::UnitTest& unit) override {
    const testing::TestResult& ad_hoc = unit.ad_hoc_test_result();
    for (int i = 0; i < ad_hoc.total_part_count(); ++i) OnTestPartResult(ad_hoc.GetTestPartResult(i));
  }

 private:
  void print(const std::string& text) const {
    std::string out;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) out += prefix_ + line + '\n';
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
  std::string prefix_;
};

// Rank 0: gtest's default printer. Other ranks: RankFailurePrinter instead of it.
inline void install_rank_printer(int rank) {
  if (rank == 0) return;
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace fsdp_test
