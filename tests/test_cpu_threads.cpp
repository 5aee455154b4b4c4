// tests/test_cpu_threads.cpp: the CPU rank's thread count and core binding
// (fsdp/backend/cpu_threads.hpp): the cpu list format, the planning rules on made-up
// topologies (SMT, several ranks per node, deliberate and default launcher bindings,
// oversubscription), and that setup_cpu_threads really binds every OpenMP thread.
#include <gtest/gtest.h>

#include <omp.h>
#include <sched.h>

#include <algorithm>

#include <string>
#include <vector>

#include "fsdp/backend/cpu_threads.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

// n cores of `smt` hardware threads, numbered like Linux on x86: the first siblings of all
// cores are 0..n-1, the second ones n..2n-1, ...
CpuTopology topology(int n, int smt = 1) {
  CpuTopology t;
  for (int c = 0; c < n; ++c) {
    CpuList core;
    for (int s = 0; s < smt; ++s) core.push_back(c + s * n);
    t.cores.push_back(core);
  }
  return t;
}
CpuList range(int lo, int hi) {  // [lo, hi]
  CpuList out;
  for (int c = lo; c <= hi; ++c) out.push_back(c);
  return out;
}

TEST(CpuList, ParsesAndFormatsTheKernelsFormat) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (CpuList{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list(" 5 "), (CpuList{5}));
  EXPECT_EQ(parse_cpu_list(""), CpuList{});
  EXPECT_EQ(parse_cpu_list("3,1-2,2"), (CpuList{1, 2, 3}));  // sorted, no duplicates
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({7}), "7");
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1,", "1 2", "0-99999999999"}) {
    EXPECT_THROW(parse_cpu_list(bad), Error) << bad;
  }
}

TEST(CpuThreadPlan, OpenMpiDefaultBindingIsWidenedToTheRanksCores) {
  // mpirun -np 1 binds the rank to core 0 by default: 2 threads must get both cores.
  const CpuThreadPlan p = plan_cpu_threads(2, 0, 1, topology(2), {0}, /*deliberate=*/false);
  EXPECT_EQ(p.threads, 2);
  EXPECT_EQ(p.bind, (CpuList{0, 1}));
  EXPECT_EQ(p.cpus, (CpuList{0, 1}));
  EXPECT_EQ(p.note, "");
  // auto = the node's cores / ranks.
  EXPECT_EQ(plan_cpu_threads(0, 0, 1, topology(2), {0}, false).threads, 2);
}

TEST(CpuThreadPlan, AutoGivesEachLocalRankItsSliceOfPhysicalCores) {
  const CpuTopology node = topology(8, 2);  // 8 cores, 16 CPUs
  for (int r = 0; r < 2; ++r) {
    const CpuThreadPlan p = plan_cpu_threads(0, r, 2, node, node.all_cpus(), false);
    EXPECT_EQ(p.threads, 4);  // physical cores, not hardware threads
    CpuList want = range(4 * r, 4 * r + 3);
    for (int c = 4 * r; c < 4 * r + 4; ++c) want.push_back(c + 8);  // SMT siblings too
    std::sort(want.begin(), want.end());
    EXPECT_EQ(p.bind, want) << "local rank " << r;
  }
}

TEST(CpuThreadPlan, ABindingAlreadyRightIsLeftAlone) {
  // mpirun -np 2, 1 thread each: Open MPI's core per rank is already the slice.
  EXPECT_TRUE(plan_cpu_threads(0, 1, 2, topology(2), {1}, false).bind.empty());
  EXPECT_EQ(plan_cpu_threads(0, 1, 2, topology(2), {1}, false).cpus, CpuList{1});
  EXPECT_EQ(plan_cpu_threads(0, 1, 2, topology(2), {1}, false).threads, 1);
  // Unbound single rank using the whole node.
  EXPECT_TRUE(plan_cpu_threads(0, 0, 1, topology(4), range(0, 3), false).bind.empty());
}

TEST(CpuThreadPlan, DeliberateBindingIsRespected) {
  const CpuTopology node = topology(16);
  // srun --cpus-per-task=4: auto = the 4 bound cores, binding kept.
  CpuThreadPlan p = plan_cpu_threads(0, 1, 4, node, range(4, 7), true);
  EXPECT_EQ(p.threads, 4);
  EXPECT_TRUE(p.bind.empty());
  EXPECT_EQ(p.note, "");
  // Fewer threads than bound CPUs: kept too.
  p = plan_cpu_threads(2, 1, 4, node, range(4, 7), true);
  EXPECT_EQ(p.threads, 2);
  EXPECT_TRUE(p.bind.empty());
}

TEST(CpuThreadPlan, MoreThreadsThanADeliberateBindingRebindsWithANote) {
  const CpuThreadPlan p = plan_cpu_threads(4, 1, 2, topology(8), {1}, true);
  EXPECT_EQ(p.threads, 4);
  EXPECT_EQ(p.bind, range(4, 7));
  EXPECT_NE(p.note.find("exceeds the CPUs the launcher bound this rank to (1)"), std::string::npos)
      << p.note;
  EXPECT_NE(p.note.find("rebound to CPUs 4-7"), std::string::npos) << p.note;
}

TEST(CpuThreadPlan, OversubscribedNodeUsesEveryCpuAndSaysSoOnlyForThreadedRanks) {
  // The main job: 4 ranks x 1 thread on 2 cores, unbound. No note, nothing to change.
  CpuThreadPlan p = plan_cpu_threads(0, 3, 4, topology(2), {0, 1}, false);
  EXPECT_EQ(p.threads, 1);
  EXPECT_TRUE(p.bind.empty());
  EXPECT_EQ(p.note, "");
  // 2 ranks x 2 threads on 2 cores, each bound to one core by mpirun: every CPU, and a note.
  p = plan_cpu_threads(2, 1, 2, topology(2), {1}, false);
  EXPECT_EQ(p.bind, (CpuList{0, 1}));
  EXPECT_NE(p.note.find("2 ranks x 2 threads on 2 cores: oversubscribed"), std::string::npos)
      << p.note;
  EXPECT_NE(p.note.find("train.num_threads = 1 fits"), std::string::npos) << p.note;
}

TEST(CpuThreadPlan, RejectsBadArguments) {
  EXPECT_THROW(plan_cpu_threads(-1, 0, 1, topology(2), {0}, false), Error);
  EXPECT_THROW(plan_cpu_threads(1, 2, 2, topology(2), {0}, false), Error);
  EXPECT_THROW(plan_cpu_threads(1, 0, 0, topology(2), {0}, false), Error);
  EXPECT_THROW(plan_cpu_threads(1, 0, 1, CpuTopology{}, {0}, false), Error);
}

TEST(CpuThreadPlan, TopologyOfThisMachineCoversItsCpus) {
  const CpuTopology t = read_cpu_topology();
  ASSERT_FALSE(t.cores.empty());
  const CpuList all = t.all_cpus();
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
}

// Under ctest this binary runs with mpirun --bind-to none; bind to one CPU first, as
// Open MPI's default would, and check that setup_cpu_threads gives every OpenMP thread the
// plan's CPUs.
TEST(CpuThreadSetup, BindsEveryOpenMpThread) {
  const CpuTopology node = read_cpu_topology();
  const CpuList all = node.all_cpus();
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(all.front(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int want_threads = static_cast<int>(node.cores.size());
  const CpuThreadPlan plan = setup_cpu_threads(want_threads, 0, 1);
  EXPECT_EQ(plan.threads, want_threads);
  std::vector<CpuList> seen(static_cast<std::size_t>(want_threads));
#pragma omp parallel num_threads(want_threads)
  { seen[static_cast<std::size_t>(omp_get_thread_num())] = current_affinity(node); }
  for (int t = 0; t < want_threads; ++t) {
    EXPECT_EQ(seen[static_cast<std::size_t>(t)], all) << "OpenMP thread " << t;
  }
  // Restore: the rest of the process (nothing here) runs unbound.
  cpu_set_t every;
  CPU_ZERO(&every);
  for (int c : all) CPU_SET(c, &every);
  sched_setaffinity(0, sizeof every, &every);
}

}  // namespace
}  // namespace fsdp
