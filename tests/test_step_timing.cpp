// Where a step's time goes (issue 12): the StepTimer's phase accounting, the phases of real
// training steps against their wall time, the model FLOPs behind MFU and the peak FLOP/s
// tables. Run under mpirun at 1 and 2 ranks.
//  - StepTimer: phases tile the step (they add up to step_s), a comm_wait Scope returns to
//    the phase it interrupted (and inside eval does nothing), and misuse throws.
//  - Training (GPT-2 FULL_SHARD, 6 steps, evaluation at 3 and 6, checkpoints at 2, 4, 6):
//    on every step the phases add up to the step's wall time within 5%; forward, backward,
//    optimizer and comm_wait are positive; eval and checkpoint are charged on exactly the
//    steps that evaluate or save; metrics.jsonl carries step_s, every <phase>_s, tokens and mfu.
//  - Model FLOPs: GPT-2's train_flops_per_sample equals 6 N T + 12 L C T^2 with N counted
//    from the model's own ModuleDecls (every 2-D weight but the position embedding); T5's
//    equals a count written out per matrix for a tiny encoder-decoder.
//  - Peaks: known GPU names map to their published dense peaks, unknown ones to none; the
//    CPU estimate is cores x clock x 32 or 64 FLOP/cycle, a fraction of a core for ranks
//    that oversubscribe the node.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/backend/peak_flops.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/fsdp/step_timer.hpp"
#include "fsdp/model/model.hpp"
#include "train_util.hpp"

using namespace test_util;
using fsdp::Phase;
using fsdp::StepTimer;
using fsdp::StepTimes;

namespace {

// Real work on the host for the timer to measure (no sleeps): a GEMM of n x n.
void work(fsdp::Backend& be, int64_t n) {
  fsdp::DeviceBuffer a = fsdp::DeviceBuffer::floats(be, n * n, fsdp::MemCategory::other);
  fsdp::DeviceBuffer c = fsdp::DeviceBuffer::floats(be, n * n, fsdp::MemCategory::other);
  be.fill_zero(a.view());
  be.gemm(false, false, n, n, n, 1.f, a.view(), a.view(), 0.f, c.view());
}

TEST(StepTimer, PhasesTileTheStepAndScopesNest) {
  auto be = fsdp::make_cpu_backend(1);
  StepTimer t(*be);
  EXPECT_FALSE(t.running());
  t.enter(Phase::forward);  // no step running: ignored
  EXPECT_THROW(t.end(), fsdp::Error);
  t.begin(Phase::data);
  EXPECT_THROW(t.begin(Phase::data), fsdp::Error);
  work(*be, 64);
  t.enter(Phase::forward);
  work(*be, 96);
  {
    StepTimer::Scope outer(&t, Phase::comm_wait);
    EXPECT_EQ(t.current(), Phase::comm_wait);
    work(*be, 64);
    {
      StepTimer::Scope inner(&t, Phase::comm_wait);  // already there: nothing to restore
      work(*be, 32);
    }
    EXPECT_EQ(t.current(), Phase::comm_wait);
  }
  EXPECT_EQ(t.current(), Phase::forward);
  t.enter(Phase::backward);
  work(*be, 128);
  t.enter(Phase::backward);  // same phase: no new segment
  t.enter(Phase::optimizer);
  work(*be, 32);
  const StepTimes s = t.end();
  EXPECT_FALSE(t.running());
  EXPECT_GT(s.step_s, 0);
  EXPECT_NEAR(s.sum(), s.step_s, 1e-9 + 1e-6 * s.step_s);
  for (Phase p : {Phase::data, Phase::forward, Phase::comm_wait, Phase::backward, Phase::optimizer}) {
    EXPECT_GT(s[p], 0) << fsdp::to_string(p);
  }
  EXPECT_EQ(s[Phase::eval], 0);
  EXPECT_EQ(s[Phase::checkpoint], 0);
  // Evaluation is charged whole: a comm_wait scope inside it changes nothing.
  t.begin(Phase::eval);
  {
    StepTimer::Scope waiting(&t, Phase::comm_wait);
    EXPECT_EQ(t.current(), Phase::eval);
    work(*be, 32);
  }
  const StepTimes e = t.end();
  EXPECT_GT(e[Phase::eval], 0);
  EXPECT_EQ(e[Phase::comm_wait], 0);
  // A null timer, or one not running, makes a Scope a no-op.
  StepTimer::Scope none(nullptr, Phase::comm_wait);
  StepTimer::Scope idle(&t, Phase::comm_wait);
  EXPECT_FALSE(t.running());
}

TEST(StepTimer, PhaseNamesAreTheMetricsKeys) {
  const char* expected[] = {"data", "forward", "backward", "comm_wait", "optimizer", "eval",
                            "checkpoint"};
  for (int p = 0; p < fsdp::kNumPhases; ++p) {
    EXPECT_STREQ(fsdp::to_string(static_cast<Phase>(p)), expected[p]);
  }
}

Config timing_config(const std::string& dir) {
  Config c = small_config(dir);
  c.model.set("n_embd", int64_t{64});
  c.model.set("n_head", int64_t{4});
  c.data.seq_len = 32;
  c.model.set("n_positions", int64_t{32});
  c.train.max_steps = 6;
  c.train.global_batch_size = 8;
  c.train.peak_flops = 1e12;  // MFU reported whatever the machine
  c.eval.every = 3;
  c.checkpoint.every = 2;
  c.fsdp.sharding_strategy = fsdp::ShardingStrategy::FULL_SHARD;
  return c;
}

// Start-up (issue 31 item 5): train() names where its start-up went, in order, and those
// phases cover no more than the call itself took.
TEST(StepTiming, StartupPhasesAreListedInOrder) {
  const Config c = timing_config(fresh_dir("startup"));
  const auto t0 = std::chrono::steady_clock::now();
  const TrainResult r = run(c, On::world);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::string> names;
  double in_train = 0;
  for (const auto& [name, s] : r.startup) {
    names.push_back(name);
    EXPECT_GE(s, 0.0) << name;
    if (name != "launch") in_train += s;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"launch", "world", "plan", "run_dir", "model",
                                              "restore"}));
  EXPECT_LE(in_train, wall);
  EXPECT_GT(r.startup.front().second, 0.0);  // this process started before the test ran
}

TEST(StepTiming, PhasesAddUpToTheStepTime) {
  const std::string dir = fresh_dir("phases");
  const Config c = timing_config(dir);
  const TrainResult r = run(c, On::world);
  ASSERT_EQ(r.step_times.size(), 6u);
  for (std::size_t i = 0; i < r.step_times.size(); ++i) {
    const StepTimes& s = r.step_times[i];
    const int64_t step = static_cast<int64_t>(i) + 1;
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_GT(s.step_s, 0);
    EXPECT_LE(std::abs(s.sum() - s.step_s), 0.05 * s.step_s);
    for (Phase p : {Phase::forward, Phase::backward, Phase::optimizer, Phase::comm_wait}) {
      EXPECT_GT(s[p], 0) << fsdp::to_string(p);
    }
    EXPECT_EQ(s[Phase::eval] > 0, step % 3 == 0);
  }
  // A checkpoint step's checkpoint phase outweighs every other step's (which only asks
  // whether a background save is pending).
  double max_quiet = 0;
  for (int step : {1, 3, 5}) max_quiet = std::max(max_quiet, r.step_times[step - 1][Phase::checkpoint]);
  for (int step : {2, 4, 6}) EXPECT_GT(r.step_times[step - 1][Phase::checkpoint], max_quiet);

  // The same figures in metrics.jsonl (rank 0's).
  if (world_rank() == 0) {
    std::ifstream in(dir + "/metrics.jsonl");
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      ++n;
      double sum = 0;
      for (int p = 0; p < fsdp::kNumPhases; ++p) {
        const std::string key = std::string(fsdp::to_string(static_cast<Phase>(p))) + "_s";
        ASSERT_TRUE(j.contains(key)) << key << " in " << line;
        sum += j[key].get<double>();
      }
      EXPECT_LE(std::abs(sum - j["step_s"].get<double>()), 0.05 * j["step_s"].get<double>());
      EXPECT_EQ(j["tokens"].get<int64_t>(), j["step"].get<int64_t>() * 8 * 32);
      ASSERT_TRUE(j.contains("mfu"));
      const double flops_per_step =
          fsdp::model_family("gpt2").train_flops_per_sample(c.model, {32, 32}) * 8;
      const double tokens_per_s = j["tokens_per_sec"].get<double>();
      EXPECT_NEAR(j["mfu"].get<double>(),
                  flops_per_step * tokens_per_s / (8 * 32) / (world_size() * 1e12),
                  1e-9 + 1e-9 * j["mfu"].get<double>());
    }
    EXPECT_EQ(n, 6);
  }
}

TEST(ModelFlops, Gpt2Is6NPlusAttentionWithNFromItsModules) {
  Config c = timing_config("unused");
  const auto& family = fsdp::model_family("gpt2");
  double n = 0;
  for (const auto& m : family.modules(c.model)) {
    for (const auto& p : m.params) {
      if (p.shape.size() == 2 && p.name != "wpe.weight") n += static_cast<double>(p.numel());
    }
  }
  const double T = 32, L = 2, C = 64;
  EXPECT_DOUBLE_EQ(family.train_flops_per_sample(c.model, {32, 32}),
                   6 * n * T + 12 * L * C * T * T);
}

TEST(ModelFlops, T5CountsEveryMatrixWithItsTokens) {
  Config c = fsdp::parse_config(R"(
[model]
type = "t5"
vocab_size = 300
d_model = 8
d_kv = 2
d_ff = 12
num_layers = 2
num_decoder_layers = 3
num_heads = 3
feed_forward_proj = "gated-gelu"
[data]
objective = "seq2seq"
source = "synthetic"
max_input_len = 10
max_target_len = 4
)", "t5_flops", {});
  const double Ti = 10, Tt = 4, D = 8, I = 6, F = 12, V = 300;
  // Forward multiply-adds of one sample, matrix by matrix.
  const double enc_layer = Ti * (4 * I * D)       // q k v o
                           + Ti * (3 * F * D)     // wi_0 wi_1 wo
                           + 2 * Ti * Ti * I;     // Q K^T, P V
  const double dec_layer = Tt * (4 * I * D)       // self q k v o
                           + Tt * (2 * I * D)     // cross q o
                           + Ti * (2 * I * D)     // cross k v over the encoder output
                           + Tt * (3 * F * D)     // feed-forward
                           + 2 * Tt * Tt * I      // self-attention
                           + 2 * Tt * Ti * I;     // cross-attention
  const double macs = 2 * enc_layer + 3 * dec_layer + Tt * V * D;  // + LM head
  EXPECT_DOUBLE_EQ(fsdp::model_family("t5").train_flops_per_sample(c.model, {10, 4}), 6 * macs);
}

TEST(PeakFlops, KnownGpusHaveTheirPublishedDensePeaks) {
  using fsdp::DType;
  EXPECT_DOUBLE_EQ(fsdp::gpu_peak_flops("NVIDIA H100 80GB HBM3", DType::bf16)->flops_per_s, 989.4e12);
  EXPECT_DOUBLE_EQ(fsdp::gpu_peak_flops("NVIDIA H100 80GB HBM3", DType::f32)->flops_per_s, 66.9e12);
  EXPECT_DOUBLE_EQ(fsdp::gpu_peak_flops("NVIDIA H100 PCIe", DType::f16)->flops_per_s, 756e12);
  EXPECT_DOUBLE_EQ(fsdp::gpu_peak_flops("NVIDIA H100 NVL", DType::bf16)->flops_per_s, 835e12);
  EXPECT_DOUBLE_EQ(fsdp::gpu_peak_flops("NVIDIA H200", DType::bf16)->flops_per_s, 989.4e12);
  EXPECT_DOUBLE_EQ(fsdp::gpu_peak_flops("NVIDIA A100-SXM4-80GB", DType::bf16)->flops_per_s, 312e12);
  EXPECT_FALSE(fsdp::gpu_peak_flops("NVIDIA GeForce GTX 1080", DType::bf16).has_value());
}

TEST(PeakFlops, CpuEstimateIsThreadsTimesClockTimesFlopsPerCycle) {
  fsdp::CpuInfo zen4{"AuthenticAMD", 25, {"avx2", "fma", "avx512f"}, 2600, "cpu MHz"};
  EXPECT_DOUBLE_EQ(fsdp::cpu_peak_flops(zen4, 2)->flops_per_s, 2 * 2600e6 * 32);
  fsdp::CpuInfo zen5 = zen4;
  zen5.family = 26;
  EXPECT_DOUBLE_EQ(fsdp::cpu_peak_flops(zen5, 2)->flops_per_s, 2 * 2600e6 * 64);
  fsdp::CpuInfo xeon{"GenuineIntel", 6, {"avx2", "fma", "avx512f"}, 3000, "cpuinfo_max_freq"};
  EXPECT_DOUBLE_EQ(fsdp::cpu_peak_flops(xeon, 4)->flops_per_s, 4 * 3000e6 * 64);
  fsdp::CpuInfo old{"GenuineIntel", 6, {"sse4_2"}, 3000, "cpu MHz"};
  EXPECT_FALSE(fsdp::cpu_peak_flops(old, 1).has_value());
  fsdp::CpuInfo no_clock = xeon;
  no_clock.mhz = 0;
  EXPECT_FALSE(fsdp::cpu_peak_flops(no_clock, 1).has_value());
  // 4 ranks on 2 cores: each computes on half a core.
  EXPECT_DOUBLE_EQ(fsdp::cpu_peak_flops(zen4, 0.5)->flops_per_s, 0.5 * 2600e6 * 32);
  EXPECT_FALSE(fsdp::cpu_peak_flops(zen4, 0).has_value());
}

// Issue 29 item 7: a banner said "1 core x 16.36 GHz (measured)" on a VM (a chain of adds of
// an immediate runs faster than one per cycle there). The measurement is a chain of dependent
// multiplies now, and whatever it gives is used only when it is a clock a CPU runs at; the
// clock read_cpu_info reports is always one.
TEST(PeakFlops, MeasuredClockIsPlausibleOrNotUsed) {
  EXPECT_FALSE(fsdp::plausible_clock_mhz(16360));
  EXPECT_FALSE(fsdp::plausible_clock_mhz(0));
  EXPECT_TRUE(fsdp::plausible_clock_mhz(3690));
  const double measured = fsdp::measure_cpu_clock_mhz();
#if defined(__x86_64__)
  EXPECT_TRUE(fsdp::plausible_clock_mhz(measured)) << measured << " MHz";
#endif
  const fsdp::CpuInfo cpu = fsdp::read_cpu_info();
  if (cpu.mhz > 0) EXPECT_TRUE(fsdp::plausible_clock_mhz(cpu.mhz)) << cpu.mhz << " MHz, " << cpu.clock_source;
}

}  // namespace
