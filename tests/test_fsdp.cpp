// End-to-end FSDP equivalence and resume tests, run by ctest under mpirun at 1, 2 and 4 ranks.
//
// For every sharding strategy, 5 training steps on the world communicator must give the same
// losses and final full parameters as a 1-rank NO_SHARD run (each rank runs that reference
// on MPI_COMM_SELF), within a relative difference of 1e-5: sharding, reduce-scatter and
// replica all-reduce change only the summation order. A run stopped at a checkpoint and
// resumed must continue bit-identically. The threaded shard initialisation gives the
// counter-based RNG's values element for element.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/merge.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/core/rng.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/data/prepare.hpp"
#include "fsdp/optim/optimizer.hpp"
#include "fsdp/train/runtime.hpp"
#include "fsdp/train/trainer.hpp"
#include "train_util.hpp"

namespace fs = std::filesystem;
using fsdp::Config;
using fsdp::TrainOptions;
using fsdp::TrainResult;
using namespace test_util;

namespace {

// The 1-rank NO_SHARD reference, computed on every rank independently.
const TrainResult& reference(const std::string& optimizer) {
  static std::map<std::string, TrainResult> cache;
  auto it = cache.find(optimizer);
  if (it != cache.end()) return it->second;
  const std::string dir = fresh_dir("reference_" + optimizer) + "/rank" + std::to_string(world_rank());
  Config c = small_config(dir);
  c.optim.name = optimizer == std::string("sgd") ? fsdp::OptimizerKind::sgd : fsdp::OptimizerKind::adamw;
  c.fsdp.sharding_strategy = fsdp::ShardingStrategy::NO_SHARD;
  return cache[optimizer] = run(c, On::self);
}

struct Case {
  fsdp::ShardingStrategy strategy;
  const char* optimizer;
};

class StrategyTest : public testing::TestWithParam<Case> {};

TEST_P(StrategyTest, MatchesOneRankNoShard) {
  const Case k = GetParam();
  const std::string name = std::string(fsdp::to_string(k.strategy)) + "_" + k.optimizer;
  Config c = small_config(fresh_dir(name));
  c.fsdp.sharding_strategy = k.strategy;
  c.optim.name = std::string(k.optimizer) == "sgd" ? fsdp::OptimizerKind::sgd : fsdp::OptimizerKind::adamw;
  // Hybrid: shard groups of 2 (4 ranks = 2 replicas x 2 shards); 1 rank: a group of one.
  c.mesh.shard_size = std::min(2, world_size());
  const TrainResult got = run(c, On::world);
  const TrainResult& ref = reference(k.optimizer);

  ASSERT_EQ(got.losses.size(), 5u);
  ASSERT_EQ(ref.losses.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i + 1;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // it trains
  // All parameters together within 1e-5, and each tensor within 1e-5 too, except under
  // AdamW: the key part of attn.c_attn.bias has an exactly-zero gradient (softmax is shift
  // invariant), so its gradient is pure rounding noise, which Adam's m/sqrt(v) normalises into
  // updates of order lr: there the per-tensor bound is 1e-4.
  ASSERT_EQ(got.params.size(), ref.params.size());
  std::vector<float> all_got, all_ref;
  for (const auto& [pname, values] : ref.params) {
    ASSERT_TRUE(got.params.count(pname)) << pname;
    const auto& g = got.params.at(pname);
    all_got.insert(all_got.end(), g.begin(), g.end());
    all_ref.insert(all_ref.end(), values.begin(), values.end());
    const bool noisy = std::string(k.optimizer) == "adamw" &&
                       pname.find("attn.c_attn.bias") != std::string::npos;
    EXPECT_LE(rel_diff(g, values), noisy ? 1e-4 : 1e-5) << pname;
  }
  EXPECT_LE(rel_diff(all_got, all_ref), 1e-5);
  ASSERT_EQ(got.val_losses.size(), 1u);
  EXPECT_NEAR(got.val_losses[0].second, ref.val_losses[0].second, 1e-5 * ref.val_losses[0].second);
}

INSTANTIATE_TEST_SUITE_P(
    AllStrategies, StrategyTest,
    testing::Values(Case{fsdp::ShardingStrategy::FULL_SHARD, "adamw"},
                    Case{fsdp::ShardingStrategy::SHARD_GRAD_OP, "adamw"},
                    Case{fsdp::ShardingStrategy::NO_SHARD, "adamw"},
                    Case{fsdp::ShardingStrategy::HYBRID_SHARD, "adamw"},
                    Case{fsdp::ShardingStrategy::HYBRID_SHARD_ZERO2, "adamw"},
                    Case{fsdp::ShardingStrategy::FULL_SHARD, "sgd"}),
    [](const testing::TestParamInfo<Case>& info) {
      return std::string(fsdp::to_string(info.param.strategy)) + "_" + info.param.optimizer;
    });

// GPT-2 with document masking through the trainer (documents end at each space of the byte
// text), wpe read at each token's position in its document: FULL_SHARD over the world equals
// a 1-rank NO_SHARD run with the same mask (SGD: no Adam normalisation of rounding noise),
// the mask changes the losses, and the plan counts its buffers.
TEST(DocumentMasking, Gpt2ShardsAsOneRank) {
  const std::vector<std::string> docs = {"data.attn_mask_type=block_causal",
                                         "data.reset_position_ids=true", "data.eos_token_id=32",
                                         "optim.name=sgd"};
  Config r = small_run(kSmallGpt2,
                       fresh_dir("gpt2_docs_ref") + "/rank" + std::to_string(world_rank()), docs);
  r.fsdp.sharding_strategy = fsdp::ShardingStrategy::NO_SHARD;
  const TrainResult ref = run(r, On::self);
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "it trains";
  EXPECT_NE(ref.losses.front(), reference("sgd").losses.front()) << "the mask acts";
  Config c = small_run(kSmallGpt2, fresh_dir("gpt2_docs_full"), docs);
  c.mesh.shard_size = std::min(2, world_size());
  const TrainResult got = run(c, On::world);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i + 1;
  }
  std::vector<float> all_got, all_ref;
  for (const auto& [pname, values] : ref.params) {
    all_got.insert(all_got.end(), got.params.at(pname).begin(), got.params.at(pname).end());
    all_ref.insert(all_ref.end(), values.begin(), values.end());
  }
  EXPECT_LE(rel_diff(all_got, all_ref), 1e-5);
  expect_plan_equals_peak(got, "gpt2 documents");
}

// The initial normals are standard normal: a Kolmogorov-Smirnov distance below the 1 %
// critical value 1.63 / sqrt(n), the mean, variance and kurtosis within ~5 standard errors,
// the two halves of a Box-Muller pair and neighbouring pairs uncorrelated, and fill() of any
// odd range equal to at() element by element.
TEST(Init, NormalStreamIsStandardNormal) {
  constexpr int64_t n = 1 << 20;
  const fsdp::rng::NormalStream normal(1234, fsdp::rng::key_of("h.0.mlp.c_fc.weight"));
  std::vector<float> z(n);
  normal.fill(0, n, 1.f, z.data());
  double m1 = 0, m2 = 0, m4 = 0, pair = 0, next = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double v = z[static_cast<std::size_t>(k)];
    m1 += v;
    m2 += v * v;
    m4 += v * v * v * v;
    if (k % 2 == 0) pair += v * z[static_cast<std::size_t>(k + 1)];
    if (k + 2 < n) next += v * z[static_cast<std::size_t>(k + 2)];
  }
  m1 /= n, m2 /= n, m4 /= n, pair /= n / 2, next /= n - 2;
  EXPECT_LT(std::abs(m1), 5.0 / std::sqrt(n));
  EXPECT_LT(std::abs(m2 - 1.0), 5.0 * std::sqrt(2.0 / n));
  EXPECT_LT(std::abs(m4 / (m2 * m2) - 3.0), 5.0 * std::sqrt(24.0 / n));
  EXPECT_LT(std::abs(pair), 5.0 / std::sqrt(n / 2));
  EXPECT_LT(std::abs(next), 5.0 / std::sqrt(n));
  std::vector<float> sorted = z;
  std::sort(sorted.begin(), sorted.end());
  double ks = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double cdf = 0.5 * std::erfc(-sorted[static_cast<std::size_t>(k)] / std::sqrt(2.0));
    ks = std::max({ks, std::abs(cdf - static_cast<double>(k) / n), std::abs(cdf - static_cast<double>(k + 1) / n)});
  }
  EXPECT_LT(ks, 1.63 / std::sqrt(n)) << "Kolmogorov-Smirnov distance";
  EXPECT_LT(std::max(-sorted.front(), sorted.back()), 5.9f);  // the documented tail cut
  for (const auto [first, count] : {std::pair<uint64_t, int64_t>{1, 1}, {3, 6}, {7, 7}, {10, 5}, {0, 0}}) {
    std::vector<float> part(static_cast<std::size_t>(count) + 1, -7.f);
    normal.fill(first, count, 0.5f, part.data());
    for (int64_t j = 0; j < count; ++j) {
      EXPECT_EQ(part[static_cast<std::size_t>(j)], 0.5f * normal.at(first + static_cast<uint64_t>(j)))
          << "fill(" << first << ", " << count << ")[" << j << "]";
      EXPECT_EQ(0.5f * normal.at(first + static_cast<uint64_t>(j)), 0.5f * z[first + static_cast<uint64_t>(j)]);
    }
    EXPECT_EQ(part.back(), -7.f) << "fill(" << first << ", " << count << ") wrote past its end";
  }
}

// The engine fills each rank's shard with as many threads as the rank may use, one per 2^20
// elements at most (FsdpEngine::init_shard): every element, gathered over the ranks, is
// still std * normal(seed, name, k) (0 for vocabulary pad rows, 1 for ones), so the values
// do not depend on the thread count nor on the world size. A 3-million-element parameter
// gives two threads on this 2-core machine (usable_cpus, printed).
TEST(Init, ThreadedShardFillEqualsTheCounterBasedFormula) {
  std::vector<fsdp::ParamSpec> params(3);
  params[0].name = "big.weight";
  params[0].shape = {3000, 1031};
  params[1].name = "ones.weight";
  params[1].shape = {7};
  params[1].init = fsdp::InitKind::ones;
  params[2].name = "wte.weight";
  params[2].shape = {16, 1024};
  params[2].vocab_rows = 11;
  std::vector<fsdp::ModuleDecl> modules(1);
  modules[0].name = "m";
  modules[0].cls = "Block";
  modules[0].params = params;
  auto be = fsdp::make_cpu_backend(1);
  fsdp::MpiCommunicator world(MPI_COMM_WORLD), self(MPI_COMM_SELF);
  fsdp::FsdpConfig fc;
  fc.auto_wrap_policy = fsdp::AutoWrapPolicy::NO_WRAP;
  constexpr uint64_t kSeed = 1234;
  fsdp::FsdpEngine engine(modules, fc, fsdp::MixedPrecisionConfig{}, world, self, *be, kSeed,
                          /*initialise=*/true);
  if (test_util::world_rank() == 0) {
    std::printf("usable_cpus %d, shard of %lld elements\n", fsdp::usable_cpus(),
                static_cast<long long>(engine.shard_numel(0)));
  }
  const auto full = engine.gather_full_params();
  for (const auto& p : params) {
    const std::vector<float>& got = full.at(p.name);
    ASSERT_EQ(static_cast<int64_t>(got.size()), p.numel()) << p.name;
    const fsdp::rng::NormalStream normal(kSeed, fsdp::rng::key_of(p.name));
    const int64_t own = p.unpadded_numel();
    int64_t wrong = 0;
    for (int64_t k = 0; k < p.numel(); ++k) {
      float want = 0.f;
      if (k < own) {
        want = p.init == fsdp::InitKind::ones
                   ? 1.f
                   : p.init_std * normal.at(static_cast<uint64_t>(k));
      }
      if (got[static_cast<std::size_t>(k)] != want && ++wrong <= 3) {
        ADD_FAILURE() << p.name << "[" << k << "] = " << got[static_cast<std::size_t>(k)] << ", want " << want;
      }
    }
    EXPECT_EQ(wrong, 0) << p.name;
  }
}

TEST(Resume, ContinuesBitIdentically) {
  for (auto strategy : {fsdp::ShardingStrategy::FULL_SHARD, fsdp::ShardingStrategy::HYBRID_SHARD}) {
    const std::string tag = fsdp::to_string(strategy);
    Config c = small_config(fresh_dir("resume_full_" + tag));
    c.fsdp.sharding_strategy = strategy;
    c.mesh.shard_size = std::min(2, world_size());
    c.train.max_steps = 6;
    c.checkpoint.every = 3;
    const TrainResult full = run(c, On::world);

    c.train.run_dir = fresh_dir("resume_part_" + tag);
    const TrainResult first = run(c, On::world, /*stop_after=*/3);
    ASSERT_EQ(first.losses.size(), 3u);
    const TrainResult second = run(c, On::world, 0, /*resume=*/true);
    ASSERT_EQ(second.losses.size(), 3u);
    EXPECT_EQ(second.final_step, 6);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(first.losses[i], full.losses[i]) << tag << " step " << i + 1;
      EXPECT_EQ(second.losses[i], full.losses[i + 3]) << tag << " step " << i + 4;
    }
    for (const auto& [pname, values] : full.params) {
      EXPECT_EQ(second.params.at(pname), values) << tag << " " << pname;
    }
  }
}

TEST(GradientAccumulation, MicroBatchesGiveTheSameStep) {
  // train.micro_batch_size splits each rank's batch (8 / world sequences) into micro-batches
  // whose gradients are reduce-scattered into the fp32 shards one by one: 1, 2 sequences and
  // the whole batch give the same steps (<= 1e-6 relative: only the summation order moves).
  // SGD, so no exactly-zero gradient is magnified by Adam's normalisation.
  for (auto strategy : {fsdp::ShardingStrategy::FULL_SHARD, fsdp::ShardingStrategy::NO_SHARD,
                        fsdp::ShardingStrategy::HYBRID_SHARD}) {
    const std::string tag = fsdp::to_string(strategy);
    Config c = small_config(fresh_dir("accum_whole_" + tag));
    c.fsdp.sharding_strategy = strategy;
    c.mesh.shard_size = std::min(2, world_size());
    c.optim.name = fsdp::OptimizerKind::sgd;
    const TrainResult whole = run(c, On::world);
    const int64_t local = 8 / world_size();
    for (int64_t micro : {int64_t{1}, int64_t{2}}) {
      if (micro >= local) continue;
      c.train.run_dir = fresh_dir("accum_" + std::to_string(micro) + "_" + tag);
      c.train.micro_batch_size = micro;
      const TrainResult got = run(c, On::world);
      ASSERT_EQ(got.losses.size(), whole.losses.size());
      for (std::size_t i = 0; i < got.losses.size(); ++i) {
        EXPECT_NEAR(got.losses[i], whole.losses[i], 1e-6 * whole.losses[i])
            << tag << " micro " << micro << " step " << i + 1;
      }
      std::vector<float> a, b;
      for (const auto& [name, values] : whole.params) {
        a.insert(a.end(), got.params.at(name).begin(), got.params.at(name).end());
        b.insert(b.end(), values.begin(), values.end());
      }
      EXPECT_LE(rel_diff(a, b), 1e-6) << tag << " micro " << micro;
      EXPECT_NEAR(got.val_losses.at(0).second, whole.val_losses.at(0).second,
                  1e-6 * whole.val_losses.at(0).second) << tag << " micro " << micro;
      c.train.micro_batch_size = 0;
    }
  }
}

TEST(Merge, SafetensorsEqualTheRunsFullParameters) {
  // FULL_SHARD over the world, then fsdp_merge's library entry point on the final checkpoint:
  // every tensor must equal the run's gathered parameter bit for bit (Conv1D weights
  // transposed to HF's [in, out]).
  Config c = small_config(fresh_dir("merge"));
  const TrainResult got = run(c, On::world);
  const std::string out = c.train.run_dir + "/hf";
  auto check = [&] {  // a lambda, so a failed ASSERT still reaches the barrier below
    const auto latest = fsdp::ckpt::find_latest(c.train.run_dir);
    ASSERT_TRUE(latest.has_value());
    fsdp::ckpt::merge_to_hf(*latest, out);
    const fsdp::safetensors::Reader st(out + "/model.safetensors");
    EXPECT_EQ(st.names().size(), got.params.size());
    for (const auto& [name, values] : got.params) {
      // Hugging Face GPT-2 naming and layout, written out here independently of the library.
      const std::string hf_name = "transformer." + name;
      bool conv1d = false;
      for (const char* w : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                            "mlp.c_proj.weight"}) {
        conv1d = conv1d || name.find(w) != std::string::npos;
      }
      const auto& e = st.entry(hf_name);
      EXPECT_EQ(e.dtype, "F32") << name;
      const std::vector<float> merged = st.read_f32(hf_name);
      ASSERT_EQ(merged.size(), values.size()) << name;
      if (!conv1d) {
        EXPECT_EQ(merged, values) << name;
        continue;
      }
      ASSERT_EQ(e.shape.size(), 2u) << name;
      const int64_t rows = e.shape[1], cols = e.shape[0];  // ours [out, in]; HF [in, out]
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k)
          ASSERT_EQ(merged[k * rows + r], values[r * cols + k]) << name << " [" << r << "," << k << "]";
    }
  };
  if (world_rank() == 0) check();
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

// The trainer clips the update as torch.nn.utils.clip_grad_norm_ then the optimizer would:
// one plain SGD step (no momentum, no decay, constant lr) with optim.grad_clip at a tenth of
// the gradient's norm moves every parameter by the unclipped step times max_norm / (norm +
// 1e-6). The gradient and its norm come from the unclipped step's move (lr g); the initial
// parameters from a step whose lr is too small to change an fp32 parameter. The coefficient
// reaches the update folded in (GradNormClipper::coefficient), not by scaling the shards, so
// this is what checks that the trainer passes it on. FULL_SHARD over the world.
TEST(GradClip, TheTrainerClipsTheUpdate) {
  auto step = [](double lr, double grad_clip) {
    const std::string dir = fresh_dir("grad_clip");
    Config c = small_config(dir);
    c.optim.name = fsdp::OptimizerKind::sgd;
    c.optim.momentum = 0;
    c.optim.weight_decay = 0;
    c.optim.warmup_steps = 0;
    c.optim.lr = c.optim.min_lr = lr;
    c.optim.grad_clip = grad_clip;
    c.train.max_steps = 1;
    return run(c, On::world).params;
  };
  const double lr = 0.1;
  const auto p0 = step(1e-12, 0.0), unclipped = step(lr, 0.0);
  std::map<std::string, std::vector<float>> moved;
  double sq = 0;
  for (const auto& [name, values] : unclipped) {
    std::vector<float>& d = moved[name];
    for (std::size_t i = 0; i < values.size(); ++i) {
      d.push_back(values[i] - p0.at(name)[i]);
      sq += static_cast<double>(d.back()) * d.back();
    }
  }
  const double norm = std::sqrt(sq) / lr, max_norm = norm / 10, coef = max_norm / (norm + 1e-6);
  ASSERT_GT(norm, 0.0);
  const auto clipped = step(lr, max_norm);
  std::vector<float> got, want;
  for (const auto& [name, values] : clipped) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      got.push_back(values[i] - p0.at(name)[i]);
      want.push_back(static_cast<float>(coef * moved.at(name)[i]));
    }
  }
  EXPECT_LT(rel_diff(got, want), 1e-4);
}

// Optimizer state is typed: each optimizer has its own states (torch.optim's state-dict names,
// which are also the checkpoint dataset names), and asking for another optimizer's state
// throws fsdp::Error naming the optimizer and the state.
TEST(OptimizerState, TypedPerOptimizer) {
  using fsdp::OptimState;
  EXPECT_STREQ(to_string(OptimState::exp_avg), "exp_avg");
  EXPECT_STREQ(to_string(OptimState::exp_avg_sq), "exp_avg_sq");
  EXPECT_STREQ(to_string(OptimState::momentum_buffer), "momentum_buffer");
  const auto be = fsdp::make_cpu_backend(1);
  for (const auto kind : {fsdp::OptimizerKind::adamw, fsdp::OptimizerKind::sgd}) {
    fsdp::OptimConfig oc;
    oc.name = kind;
    fsdp::Optimizer opt(oc, *be);
    auto param = fsdp::DeviceBuffer::floats(*be, 8, fsdp::MemCategory::sharded_params);
    auto grad = fsdp::DeviceBuffer::floats(*be, 8, fsdp::MemCategory::grads);
    opt.add_shard(param.view(), grad.view(), {{0, 8}});
    const bool adamw = kind == fsdp::OptimizerKind::adamw;
    EXPECT_EQ(opt.states(), adamw ? (std::vector<OptimState>{OptimState::exp_avg, OptimState::exp_avg_sq})
                                   : (std::vector<OptimState>{OptimState::momentum_buffer}));
    for (const OptimState s : opt.states()) EXPECT_EQ(opt.state(0, s).numel(), 8);
    const OptimState other = adamw ? OptimState::momentum_buffer : OptimState::exp_avg;
    try {
      (void)opt.state(0, other);
      ADD_FAILURE() << "expected fsdp::Error";
    } catch (const fsdp::Error& e) {
      const std::string want = std::string("optimizer ") + to_string(kind) + " has no state " + to_string(other);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    if (!adamw) EXPECT_THROW((void)opt.state(0, OptimState::exp_avg_sq), fsdp::Error);
    EXPECT_THROW((void)opt.state(1, opt.states().front()), fsdp::Error);
  }
}

// step_shard's compute_copy (offload's param_dtype copy of the host shard): the update writes
// it in its own pass, bit for bit the cast of the updated param that it replaces, and the fp32
// params are those of an optimizer without it. Another dtype or size throws.
TEST(OptimizerState, ComputeCopyIsTheCastOfTheUpdatedShard) {
  const auto be = fsdp::make_cpu_backend(2);
  const int64_t n = 40007;  // not a multiple of the SIMD width; split over both threads
  for (const auto kind : {fsdp::OptimizerKind::adamw, fsdp::OptimizerKind::sgd}) {
    for (const fsdp::DType t : {fsdp::DType::bf16, fsdp::DType::f16}) {
      fsdp::OptimConfig oc;
      oc.name = kind;
      oc.weight_decay = 0.1;
      fsdp::Optimizer fused(oc, *be), plain(oc, *be);
      auto pa = fsdp::DeviceBuffer::floats(*be, n, fsdp::MemCategory::sharded_params);
      auto pb = fsdp::DeviceBuffer::floats(*be, n, fsdp::MemCategory::sharded_params);
      auto grad = fsdp::DeviceBuffer::floats(*be, n, fsdp::MemCategory::grads);
      fsdp::DeviceBuffer copy(*be, t, n, fsdp::MemCategory::sharded_params),
          cast(*be, t, n, fsdp::MemCategory::sharded_params);
      float* a = pa.view().f32();
      float* b = pb.view().f32();
      float* g = grad.view().f32();
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] = std::sin(0.37 * static_cast<double>(i));
      const std::vector<fsdp::ElementRange> decayed = {{0, 100}, {5000, 30000}};
      fused.add_shard(pa.view(), grad.view(), decayed);
      plain.add_shard(pb.view(), grad.view(), decayed);
      for (int step = 1; step <= 3; ++step) {
        for (int64_t i = 0; i < n; ++i) g[i] = 0.01f * static_cast<float>(std::cos(0.11 * static_cast<double>(i * step)));
        fused.begin_update();
        fused.step_shard(0, 1e-2, {}, copy.view());
        plain.step(1e-2);
        be->cast(cast.view(), pb.view());
        ASSERT_EQ(std::memcmp(a, b, static_cast<std::size_t>(n) * 4), 0) << "param, step " << step;
        ASSERT_EQ(std::memcmp(copy.view().data, cast.view().data, copy.view().bytes()), 0)
            << to_string(kind) << " " << to_string(t) << " compute_copy, step " << step;
      }
      fsdp::DeviceBuffer wrong(*be, fsdp::DType::f32, n, fsdp::MemCategory::other),
          small(*be, t, n - 1, fsdp::MemCategory::other);
      EXPECT_THROW(fused.step_shard(0, 1e-2, {}, wrong.view()), fsdp::Error);
      EXPECT_THROW(fused.step_shard(0, 1e-2, {}, small.view()), fsdp::Error);
    }
  }
}
