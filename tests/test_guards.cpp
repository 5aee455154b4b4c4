// tests/test_guards.cpp: the run's guards against losing work (issue 9): the non-finite
// guard (a non-finite loss or gradient norm stops the run before the update, or skips the
// update with train.skip_nonfinite), and the memory check before allocation (a plan larger
// than the rank's memory is refused before anything is allocated). Also the host-memory
// readers they rest on (fsdp/core/host_memory.hpp).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/core/host_memory.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/optim/optimizer.hpp"
#include "fsdp/train/memory_check.hpp"
#include "fsdp/train/run_dir.hpp"
#include "fsdp/train/collective_guard.hpp"
#include "train_util.hpp"

namespace {

using namespace test_util;
namespace fs = std::filesystem;

// The last line of run_dir/metrics.jsonl, parsed.
nlohmann::json last_metrics_line(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return nlohmann::json::parse(last);
}

// Runs `c` and returns the fsdp::Error it throws (exit code and, on the rank that prints it,
// the message); fails the test if it does not throw.
struct Failure {
  int exit_code = 0;
  std::string message;  // empty on ranks that did not print (PeerFailed)
};
Failure run_expecting_failure(const Config& c, TrainOptions o = {}) {
  Failure f;
  try {
    run(c, On::world, 0, false, o);
    ADD_FAILURE() << "training did not fail";
  } catch (const fsdp::AgreedFailure& e) {
    f = {e.exit_code(), e.what()};
  } catch (const fsdp::PeerFailed& e) {
    f = {e.exit_code(), ""};
  }
  return f;
}

// metrics.jsonl reopened to append (a resume): an unfinished last line (its writer died
// mid-write) is cut off first, also one longer than the 4 KiB the scan reads at a time, and a
// file without any newline; complete files and a truncating open lose nothing extra.
TEST(MetricsFile, AppendingCutsAnUnfinishedLastLine) {
  const std::string dir = fresh_dir("metrics_cut");
  if (world_rank() != 0) return;
  const std::string path = dir + "/metrics.jsonl";
  auto read = [&] {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string y(10000, 'y'), z(5000, 'z');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"a\":1}\n{\"b\":2}\n{\"c\"", "{\"a\":1}\n{\"b\":2}\n"},
      {"complete\n", "complete\n"},
      {"", ""},
      {"no newline at all", ""},
      {"x\n" + y, "x\n"},
      {z + "\n" + z, z + "\n"},
  };
  for (const auto& [content, kept] : cases) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    fsdp::MetricsFile m(path, /*truncate=*/false);
    EXPECT_EQ(m.unfinished_bytes(), static_cast<int64_t>(content.size() - kept.size()))
        << content.substr(0, 40);
    m.append_line("{\"d\":4}");
    EXPECT_EQ(read(), kept + "{\"d\":4}\n") << content.substr(0, 40);
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "old\npartial";
  fsdp::MetricsFile fresh(path, /*truncate=*/true);
  EXPECT_EQ(fresh.unfinished_bytes(), 0);
  fresh.append_line("new");
  EXPECT_EQ(read(), "new\n");
  // A FIFO would block the run once its buffer filled: refused at opening, not hours later.
  const std::string fifo = dir + "/fifo.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  for (const bool truncate : {false, true}) {
    try {
      fsdp::MetricsFile f(fifo, truncate);
      ADD_FAILURE() << "a FIFO was opened as metrics.jsonl";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "train.run_dir: cannot write " + fifo + ": not a regular file");
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
    }
  }
}

TEST(NonFiniteGuard, StopsBeforeTheUpdateAndKeepsTheLastCheckpoint) {
  Config c = small_config(fresh_dir("nonfinite_stop"));
  c.train.max_steps = 6;
  c.checkpoint.every = 2;
  TrainOptions o;
  o.inject_overflow_steps = {3};  // +inf in one rank's gradient shard after step 3's backward
  o.inject_rank = world_size() - 1;
  const Failure f = run_expecting_failure(c, o);
  EXPECT_EQ(f.exit_code, fsdp::kExitRuntimeError);
  if (world_rank() == 0) {
    EXPECT_NE(f.message.find("step 3: grad_norm is inf (loss "), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("training diverged"), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("last checkpoint: " + fsdp::ckpt::step_dir(c.train.run_dir, 2)),
              std::string::npos) << f.message;
    // Step 2's checkpoint is still the latest; nothing of step 3 was saved.
    EXPECT_EQ(fsdp::ckpt::find_latest(c.train.run_dir), fsdp::ckpt::step_dir(c.train.run_dir, 2));
    EXPECT_FALSE(fs::exists(fsdp::ckpt::step_dir(c.train.run_dir, 3)));
    EXPECT_FALSE(fs::exists(fsdp::ckpt::tmp_step_dir(c.train.run_dir, 3)));
    const auto line = last_metrics_line(c.train.run_dir);
    EXPECT_EQ(line.at("step"), 3);
    EXPECT_EQ(line.at("nonfinite"), true);
    EXPECT_TRUE(line.at("grad_norm").is_null());  // JSON has no inf
  }
}

TEST(NonFiniteGuard, SkipNonfiniteLeavesTheParametersAsTheStepBefore) {
  Config c = small_config(fresh_dir("nonfinite_skip"));
  c.train.max_steps = 5;
  c.train.skip_nonfinite = true;
  TrainOptions o;
  o.inject_overflow_steps = {3};
  o.inject_rank = world_size() - 1;
  const TrainResult full = run(c, On::world, 0, false, o);
  EXPECT_EQ(full.nonfinite_steps, std::vector<int64_t>{3});
  ASSERT_EQ(full.losses.size(), 5u);
  for (double l : full.losses) EXPECT_TRUE(std::isfinite(l));  // the loss is the forward's

  c.train.run_dir = fresh_dir("nonfinite_skip2");
  const TrainResult two = run(c, On::world, /*stop_after=*/2, false, o);
  c.train.run_dir = fresh_dir("nonfinite_skip3");
  const TrainResult three = run(c, On::world, /*stop_after=*/3, false, o);
  ASSERT_FALSE(two.params.empty());
  for (const auto& [name, values] : two.params) EXPECT_EQ(three.params.at(name), values) << name;
  // Without the injection, step 3 changes them (the comparison above can fail).
  c.train.run_dir = fresh_dir("nonfinite_clean3");
  const TrainResult clean = run(c, On::world, /*stop_after=*/3);
  EXPECT_NE(clean.params.at("h.0.mlp.c_fc.weight"), two.params.at("h.0.mlp.c_fc.weight"));
}

TEST(MemoryCheck, RefusesAPlanLargerThanTheMachineBeforeAllocating) {
  Config c = small_config(fresh_dir("memory_refused"));
  c.model.set("n_layer", int64_t{1000});
  c.model.set("n_embd", int64_t{4096});
  c.model.set("n_head", int64_t{32});
  const Failure f = run_expecting_failure(c);
  EXPECT_EQ(f.exit_code, fsdp::kExitInputError);
  if (world_rank() == 0) {
    EXPECT_NE(f.message.find("memory plan: "), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("does not fit"), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("largest row: optimizer_state"), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("train.check_memory"), std::string::npos) << f.message;
  }
  // Nothing was allocated by the backend: the check ran before the model and the engine.
  EXPECT_EQ(runtime().backend().memory().peak_total(), 0u);
  // The budget it compared with is what the machine reports (MemAvailable or the cgroup).
  EXPECT_GT(runtime().memory_budget().bytes, 0);
  const std::string& source = runtime().memory_budget().source;
  EXPECT_TRUE(source.find("MemAvailable") != std::string::npos ||
              source.find("cgroup") != std::string::npos) << source;
}

// checkpoint.async_save stages a periodic save in host memory (one copy of the rank's shard
// file: fp32 parameter shards and optimizer state). The plan counts it as save_staging, equal
// to the writer's buffers after the run; nothing when no periodic save stages (every = 0, or
// the only save is the last step's, which is synchronous).
TEST(MemoryCheck, AsyncSaveStagingIsPlannedAsMeasured) {
  for (const int64_t every : {2, 0, 5}) {
    Config c = small_config(fresh_dir("async_staging_" + std::to_string(every)));
    c.train.max_steps = 5;
    c.checkpoint.every = every;
    c.checkpoint.async_save = true;
    const TrainResult r = run(c, On::world);
    const std::string what = "checkpoint.every = " + std::to_string(every);
    if (every == 2) {
      EXPECT_GT(r.plan.save_staging, 0) << what;
      EXPECT_EQ(r.plan.save_staging, r.plan.sharded_params + r.plan.optimizer_state) << what;
    } else {
      EXPECT_EQ(r.plan.save_staging, 0) << what;
    }
    EXPECT_EQ(r.save_staging_bytes, r.plan.save_staging) << what;
  }
  // NO_SHARD: every rank holds the whole model, and only rank 0 (replica 0 of the one shard
  // position) writes a shard file, so only it stages.
  Config c = small_config(fresh_dir("async_staging_no_shard"));
  c.fsdp.sharding_strategy = fsdp::ShardingStrategy::NO_SHARD;
  c.checkpoint.every = 2;
  c.checkpoint.async_save = true;
  const TrainResult r = run(c, On::world);
  EXPECT_GT(r.plan.save_staging, 0);
  EXPECT_EQ(r.save_staging_bytes, world_rank() == 0 ? r.plan.save_staging : 0);
}

// The memory check charges each rank of a node an equal part of the node's staging: the
// writing ranks' staging spread over all of the node's ranks (whose budgets are equal parts of
// its memory), rounded up.
TEST(MemoryCheck, StagingIsChargedAsTheNodesShare) {
  fsdp::EngineMemoryPlan p;
  p.total = 7;
  p.save_staging = 1001;
  EXPECT_EQ(fsdp::with_staging_share(p, 2, 2).save_staging, 1001);  // every rank writes
  EXPECT_EQ(fsdp::with_staging_share(p, 1, 2).save_staging, 501);   // NO_SHARD: rank 0 alone
  EXPECT_EQ(fsdp::with_staging_share(p, 1, 8).save_staging, 126);
  EXPECT_EQ(fsdp::with_staging_share(p, 0, 8).save_staging, 0);  // a node with no writer
  EXPECT_EQ(fsdp::with_staging_share(p, 1, 8).total, 7);         // the rest unchanged
}

// The staging must fit with the rest: on the CPU backend in the one memory, on a device in the
// host's budget; the refusal names it as its largest row and advises async_save = false.
TEST(MemoryCheck, AsyncSaveStagingMustFitTheHost) {
  Config c = small_config(fresh_dir("async_staging_budgets"));
  c.checkpoint.every = 2;
  c.checkpoint.async_save = true;
  const auto modules = fsdp::model_family(c.model.type).modules(c.model);
  const int states = fsdp::num_optimizer_states(c.optim.name);
  const fsdp::EngineMemoryPlan p = fsdp::plan_memory(modules, c, 1, 1, states);
  ASSERT_GT(p.save_staging, 0);
  EXPECT_EQ(p.host_total(), p.save_staging);
  const int64_t acts = 1000;
  const fsdp::MemoryBudget none{};
  const int64_t need = p.total + acts + p.save_staging;
  EXPECT_EQ(fsdp::memory_refusal(p, acts, {need, "cpu"}, none, true), "");
  const std::string cpu = fsdp::memory_refusal(p, acts, {need - 1, "cpu"}, none, true);
  EXPECT_EQ(cpu.rfind("memory plan: ", 0), 0u) << cpu;
  EXPECT_NE(cpu.find("largest row: save_staging"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("checkpoint.async_save = false"), std::string::npos) << cpu;
  const fsdp::MemoryBudget gpu{p.total + acts, "gpu"};
  EXPECT_EQ(fsdp::memory_refusal(p, acts, gpu, {p.save_staging, "host"}, false), "");
  const std::string host = fsdp::memory_refusal(p, acts, gpu, {p.save_staging - 1, "host"}, false);
  EXPECT_EQ(host.rfind("memory plan: host ", 0), 0u) << host;
  EXPECT_NE(host.find("largest row: save_staging"), std::string::npos) << host;
  EXPECT_NE(host.find("checkpoint.async_save = false"), std::string::npos) << host;
  // Without async_save nothing is staged and the same budgets take the plan.
  c.checkpoint.async_save = false;
  const fsdp::EngineMemoryPlan q = fsdp::plan_memory(modules, c, 1, 1, states);
  EXPECT_EQ(q.save_staging, 0);
  EXPECT_EQ(q.total, p.total);
  EXPECT_EQ(fsdp::memory_refusal(q, acts, {p.total + acts, "cpu"}, none, true), "");
  EXPECT_EQ(fsdp::memory_refusal(q, acts, gpu, {0, "host"}, false), "");
}

// A run whose model fits this machine but whose async saves' staging does not is refused at
// start-up, before anything is allocated, instead of failing at its first periodic save.
TEST(MemoryCheck, RefusesAnAsyncSaveStagingLargerThanTheMachineBeforeAllocating) {
  Config c = small_config(fresh_dir("async_staging_refused"));
  c.model.set("n_embd", int64_t{1024});
  c.checkpoint.every = 2;
  c.checkpoint.async_save = true;
  const int64_t budget = runtime().memory_budget().bytes;
  ASSERT_GT(budget, 0);
  const int states = fsdp::num_optimizer_states(c.optim.name);
  auto plan_of = [&](int64_t layers, bool async) {
    Config d = c;
    d.model.set("n_layer", layers);
    d.checkpoint.async_save = async;
    return fsdp::plan_memory(fsdp::model_family(d.model.type).modules(d.model), d, world_size(),
                             world_size(), states);
  };
  // The fewest layers whose plan with the staging exceeds the budget (bisection; the plan
  // grows with the layers); without the staging that plan must fit with room to spare.
  int64_t lo = 1, hi = 1;
  auto refused = [&](int64_t layers) {
    const fsdp::EngineMemoryPlan p = plan_of(layers, true);
    return p.total + p.save_staging > budget;
  };
  while (!refused(hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (refused(mid) ? hi : lo) = mid;
  }
  const int64_t layers = hi;
  ASSERT_LT(plan_of(layers, false).total, budget * 3 / 4) << layers << " layers";
  c.model.set("n_layer", layers);
  const Failure f = run_expecting_failure(c);
  EXPECT_EQ(f.exit_code, fsdp::kExitInputError);
  if (world_rank() == 0) {
    EXPECT_NE(f.message.find("memory plan: "), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("largest row: save_staging"), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("checkpoint.async_save = false"), std::string::npos) << f.message;
  }
  EXPECT_EQ(runtime().backend().memory().peak_total(), 0u);
}

TEST(HostMemory, ParsesMeminfoAndCgroupStat) {
  EXPECT_EQ(fsdp::parse_mem_available("MemTotal:  100 kB\nMemAvailable:   2048 kB\n"), 2048 * 1024);
  EXPECT_EQ(fsdp::parse_mem_available("MemTotal:  100 kB\n"), -1);
  EXPECT_EQ(fsdp::parse_mem_available("MemAvailable: lots\n"), -1);
  EXPECT_EQ(fsdp::parse_memory_stat("anon 5\ninactive_file 4096\nactive_file 7\n", "inactive_file"), 4096);
  EXPECT_EQ(fsdp::parse_memory_stat("anon 5\n", "inactive_file"), 0);
  fsdp::HostMemory m;
  EXPECT_EQ(m.available(), -1);
  m.mem_available = 10'000;
  EXPECT_EQ(m.available(), 10'000);
  m.cgroup_limit = 8'000;  // a cgroup limit with 5'000 used, 1'000 of it reclaimable cache
  m.cgroup_usage = 5'000;
  m.cgroup_reclaimable = 1'000;
  EXPECT_EQ(m.available(), 4'000);
  EXPECT_NE(m.describe().find("cgroup memory limit"), std::string::npos);
  m.cgroup_usage = 9'500;  // over the limit: nothing left, not negative
  m.cgroup_reclaimable = 0;
  EXPECT_EQ(m.available(), 0);
  EXPECT_EQ(fsdp::human_bytes(1536.0 * 1024 * 1024), "1.5 GiB");
  EXPECT_GT(fsdp::read_host_memory().available(), 0);  // this machine reports something
}

}  // namespace
