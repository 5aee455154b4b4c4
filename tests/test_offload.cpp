// CPU offload (fsdp.cpu_offload, issue 22; PyTorch's CPUOffload(offload_params=True)) on the
// CPU backend, where the offload runtime is a second CPU backend (host memory, its own
// MemoryTracker) and the copies are plain copies. ctest runs it at 1, 2 and 4 ranks:
//  - offloaded runs equal non-offloaded runs bit for bit (every loss, every final parameter)
//    for FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD, with fp32 and bf16 parameters (bf16
//    reduce too), with gradient clipping and AdamW; SGD and fp16 loss scaling (the unscale
//    path) once each; gradient accumulation over micro-batches;
//  - a last-bit difference moves GPT-2's loss-invariant key bias far more than anything else
//    (why the equality tests ask for bits, not a tolerance);
//  - the engine keeps the shards, gradient shards and optimizer state in the offload runtime
//    (the backend holds none of them) and every unit is unsharded on the device;
//  - resuming an offloaded run continues it bit for bit, and a checkpoint of an offloaded run
//    resumes without offload (and the reverse) to the same parameters: checkpoints are
//    unchanged;
//  - the memory plan's device and host rows equal the measured peaks of the backend and of
//    the offload runtime, and offload moves exactly the shards, gradients and optimizer
//    state from the device rows to the host rows;
//  - the memory check (memory_refusal): GPT 7B (inputs/gpt_7b.toml: 32 x 4096, seq 2048,
//    bf16, activation checkpointing) on one 80 GB GPU with 128 GiB of host memory is
//    accepted with offload and refused without, each saying why; a model whose host rows
//    exceed the host is refused naming the host.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/data/samples.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/optim/optimizer.hpp"
#include "fsdp/train/memory_check.hpp"
#include "train_util.hpp"

using namespace test_util;
using fsdp::MemCategory;
using fsdp::ShardingStrategy;

namespace {

struct Case {
  ShardingStrategy strategy;
  fsdp::DType param_dtype;
  std::string tag() const {
    return std::string(fsdp::to_string(strategy)) + "/" + std::string(fsdp::to_string(param_dtype));
  }
};

Config offload_config(const std::string& name, const Case& k) {
  Config c = small_config(fresh_dir(name));
  c.fsdp.sharding_strategy = k.strategy;
  c.mesh.shard_size = std::min(2, world_size());  // HYBRID: 2 replicas at 4 ranks
  c.mixed_precision.param_dtype = k.param_dtype;
  c.mixed_precision.reduce_dtype = k.param_dtype;
  c.train.max_steps = 4;
  return c;
}

void expect_same_run(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << " step " << i + 1;
  }
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (const auto& [name, values] : a.params) {
    EXPECT_EQ(b.params.at(name), values) << what << " " << name;
  }
}

TEST(Offload, EqualsTheRunWithoutOffloadBitForBit) {
  for (ShardingStrategy s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                             ShardingStrategy::HYBRID_SHARD}) {
    for (fsdp::DType dt : {fsdp::DType::f32, fsdp::DType::bf16}) {
      const Case k{s, dt};
      Config c = offload_config("offload_ref", k);
      const TrainResult ref = run(c, On::world);
      c.train.run_dir = fresh_dir("offload_on");
      c.fsdp.cpu_offload = true;
      const TrainResult off = run(c, On::world);
      expect_same_run(ref, off, k.tag());
      EXPECT_GT(ref.losses.front(), ref.losses.back()) << k.tag() << ": the model should learn";
    }
  }
}

// Why the offload equality tests, here and on the GPU (GpuTrain.*OffloadOptimizer*,
// *CpuOffload*), ask for bit equality rather than a tolerance (issue 31 item 1): GPT-2's key
// bias (c_attn.bias[C, 2C)) adds q . b_k to every score of a softmax row, so the loss does not
// depend on it and its gradient is rounding noise, which AdamW scales up to steps of about
// lr. A difference in the last bit of anything upstream (here: the learning rate times
// 1 + 1e-6) reorders that noise, and after 5 steps in bf16 the parameters differ by ~2e-3
// while the loss moves ~1e-5: the signature of the GPU failure at 1ab5425 (params 2.1e-3, loss
// 9.5e-6), whose last-bit difference was the two optimizers' FMA contraction (fixed since:
// fsdp/backend/optimizer_math.hpp). In fp32 the key bias moves just as far ahead of the rest.
// (Here, with this small config's data: parameters > 1e-4 apart; 2.7e-4 since the sampler's
// order changed on 2026-11-28, when the bound came down from 3e-4.)
TEST(Offload, ALastBitDifferenceMovesTheLossInvariantKeyBiasFurthest) {
  for (fsdp::DType dt : {fsdp::DType::f32, fsdp::DType::bf16}) {
    const std::string what(fsdp::to_string(dt));
    Config c = small_config(fresh_dir("keybias_a"));
    c.mixed_precision.param_dtype = dt;
    c.train.micro_batch_size = 1;
    const TrainResult a = run(c, On::world);
    c.train.run_dir = fresh_dir("keybias_b");
    c.optim.lr *= 1.0 + 1e-6;
    const TrainResult b = run(c, On::world);
    ASSERT_EQ(a.losses.size(), 5u) << what;
    double loss = 0.0;
    for (std::size_t i = 0; i < a.losses.size(); ++i) {
      loss = std::max(loss, std::abs(a.losses[i] - b.losses[i]) / std::abs(a.losses[i]));
    }
    std::vector<float> all_a, all_b;
    for (const auto& [name, values] : a.params) {
      all_a.insert(all_a.end(), values.begin(), values.end());
      all_b.insert(all_b.end(), b.params.at(name).begin(), b.params.at(name).end());
    }
    const double params = rel_diff(all_b, all_a);
    EXPECT_LT(loss, 1e-4) << what;
    if (dt == fsdp::DType::bf16) EXPECT_GT(params, 1e-4) << what << " loss " << loss;
    for (const char* name : {"h.0.attn.c_attn.bias", "h.1.attn.c_attn.bias"}) {
      const std::vector<float>& x = a.params.at(name);
      const std::vector<float>& y = b.params.at(name);
      const auto third = [&](const std::vector<float>& v, int64_t k) {
        const auto n = static_cast<std::ptrdiff_t>(v.size() / 3);
        return std::vector<float>(v.begin() + k * n, v.begin() + (k + 1) * n);
      };
      const double q = rel_diff(third(y, 0), third(x, 0)), k = rel_diff(third(y, 1), third(x, 1)),
                   v = rel_diff(third(y, 2), third(x, 2));
      EXPECT_GT(k, 10 * std::max(q, v)) << what << " " << name << ": q " << q << " k " << k
                                        << " v " << v;
    }
  }
}

TEST(Offload, SgdFp16AndMicroBatchesEqualTheRunWithoutOffload) {
  struct Variant {
    const char* name;
    void (*apply)(Config&);
  };
  const Variant variants[] = {
      {"sgd", [](Config& c) { c.optim.name = fsdp::OptimizerKind::sgd; }},
      {"fp16", [](Config& c) {
         c.mixed_precision.param_dtype = fsdp::DType::f16;
         c.mixed_precision.reduce_dtype = fsdp::DType::f16;
       }},
      {"bf16 params, fp32 reduce, micro-batches of 1", [](Config& c) {
         c.mixed_precision.param_dtype = fsdp::DType::bf16;
         c.train.micro_batch_size = 1;
       }},
      // The device accumulates between boundaries: through an all-reduce too, and in bf16.
      {"HYBRID_SHARD bf16, micro-batches of 1", [](Config& c) {
         c.fsdp.sharding_strategy = ShardingStrategy::HYBRID_SHARD;
         c.mixed_precision.param_dtype = fsdp::DType::bf16;
         c.mixed_precision.reduce_dtype = fsdp::DType::bf16;
         c.train.micro_batch_size = 1;
       }},
  };
  for (const Variant& v : variants) {
    Config c = offload_config("offload_var_ref", {ShardingStrategy::FULL_SHARD, fsdp::DType::f32});
    v.apply(c);
    const TrainResult ref = run(c, On::world);
    c.train.run_dir = fresh_dir("offload_var_on");
    c.fsdp.cpu_offload = true;
    expect_same_run(ref, run(c, On::world), v.name);
  }
}

TEST(Offload, ShardsGradientsAndOptimizerStateLiveInTheOffloadRuntime) {
  Config c = offload_config("offload_where", {ShardingStrategy::FULL_SHARD, fsdp::DType::bf16});
  c.fsdp.cpu_offload = true;
  const TrainResult r = run(c, On::world);
  auto dev = [&](MemCategory m) { return r.peak_bytes[static_cast<std::size_t>(m)]; };
  auto host = [&](MemCategory m) { return r.host_peak_bytes[static_cast<std::size_t>(m)]; };
  EXPECT_EQ(dev(MemCategory::sharded_params), 0);
  EXPECT_EQ(dev(MemCategory::grads), 0);  // one micro-batch a step: no accumulator either
  EXPECT_EQ(dev(MemCategory::optimizer_state), 0);
  EXPECT_GT(host(MemCategory::sharded_params), 0);
  EXPECT_EQ(host(MemCategory::grads), host(MemCategory::sharded_params));
  EXPECT_EQ(host(MemCategory::optimizer_state), 2 * host(MemCategory::sharded_params));  // AdamW
  EXPECT_GT(dev(MemCategory::unsharded_params), 0);
  EXPECT_EQ(host(MemCategory::unsharded_params), 0);
  EXPECT_EQ(host(MemCategory::activations), 0);

  // fp32 at one shard: without offload the model reads the shard itself; offloaded, every
  // unit is unsharded on the device.
  const std::string rank = "/rank" + std::to_string(world_rank());  // one job per rank
  Config one = offload_config("offload_fp32", {ShardingStrategy::NO_SHARD, fsdp::DType::f32});
  one.train.run_dir += rank;
  one.mesh.shard_size = 1;
  const TrainResult plain = run(one, On::self);
  EXPECT_EQ(plain.peak_bytes[static_cast<std::size_t>(MemCategory::unsharded_params)], 0);
  one.train.run_dir = fresh_dir("offload_fp32_on") + rank;
  one.fsdp.cpu_offload = true;
  const TrainResult off = run(one, On::self);
  EXPECT_GT(off.peak_bytes[static_cast<std::size_t>(MemCategory::unsharded_params)], 0);
  expect_same_run(plain, off, "NO_SHARD fp32 on one rank");
}

// `c` (checkpoint.every = 3) run to its step 3 and stopped there, then resumed to
// train.max_steps with `resumed` applied to its config: {first 3 steps, the rest}.
std::pair<TrainResult, TrainResult> stop_at_3_and_resume(
    Config c, const std::function<void(Config&)>& resumed) {
  c.train.run_dir = fresh_dir("offload_resume_part");
  TrainResult first = run(c, On::world, /*stop_after=*/3);
  EXPECT_EQ(first.losses.size(), 3u);
  resumed(c);
  TrainResult second = run(c, On::world, 0, /*resume=*/true);
  EXPECT_EQ(second.losses.size(), static_cast<std::size_t>(c.train.max_steps - 3));
  return {std::move(first), std::move(second)};
}

// The resume tests' run: FULL_SHARD in bf16, 6 steps, a checkpoint every 3.
Config resume_config(const std::string& name) {
  Config c = offload_config(name, Case{ShardingStrategy::FULL_SHARD, fsdp::DType::bf16});
  c.train.max_steps = 6;
  c.checkpoint.every = 3;
  return c;
}

// `c` (resume_config's) stopped at step 3 and resumed with `resumed` applied
// continues `full`, the uninterrupted run, bit for bit: every loss and the final parameters.
void expect_resume_continues(const TrainResult& full, const Config& c,
                             const std::function<void(Config&)>& resumed, const std::string& tag) {
  const auto [first, second] = stop_at_3_and_resume(c, resumed);
  ASSERT_EQ(first.losses.size(), 3u) << tag;
  ASSERT_EQ(second.losses.size(), 3u) << tag;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << tag << " step " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[i + 3]) << tag << " step " << i + 4;
  }
  for (const auto& [name, values] : full.params) {
    EXPECT_EQ(second.params.at(name), values) << tag << " " << name;
  }
}

// fsdp.offload_optimizer_ratio changes where each unit's shards live, not the checkpoint: a
// run resumed with another ratio (all offloaded -> half -> none) continues the uninterrupted
// run bit for bit.
TEST(OffloadOptimizer, ResumeAcrossOffloadRatios) {
  Config c = resume_config("offratio_full");
  c.fsdp.offload_optimizer = true;
  const TrainResult full = run(c, On::world);
  for (const auto& [first_ratio, second_ratio] : {std::pair{1.0, 0.5}, std::pair{0.5, 1.0}}) {
    c.fsdp.offload_optimizer_ratio = first_ratio;
    expect_resume_continues(
        full, c, [r = second_ratio](Config& x) { x.fsdp.offload_optimizer_ratio = r; },
        std::to_string(first_ratio) + " -> " + std::to_string(second_ratio));
  }
}

TEST(Offload, ResumeContinuesBitForBitAndAcrossOffloadOnAndOff) {
  Config c = resume_config("offload_resume_full");
  c.fsdp.cpu_offload = true;
  const TrainResult full = run(c, On::world);

  // Offloaded -> offloaded, offloaded -> not, not -> offloaded: the second half of each is
  // the uninterrupted offloaded run's, bit for bit.
  for (const auto& [first_offload, second_offload] :
       {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    c.fsdp.cpu_offload = first_offload;
    expect_resume_continues(
        full, c, [on = second_offload](Config& r) { r.fsdp.cpu_offload = on; },
        std::string(first_offload ? "on" : "off") + " -> " + (second_offload ? "on" : "off"));
  }
}

// fsdp.delayed_parameter_update through the trainer: step 1 is the undelayed run's, step 2
// (taken at the initial parameters) is not (with warm-up steps, the first delayed one is);
// a checkpoint completes the pending update, so a run stopped at the checkpoint and resumed,
// with the delay or without it, continues the uninterrupted delayed run bit for bit (its
// step after the save uses the saved parameters).
TEST(Offload, DelayedUpdateResumesBitForBit) {
  Config c = resume_config("offload_delayed_full");
  c.fsdp.offload_optimizer = true;
  const TrainResult undelayed = run(c, On::world);
  c.train.run_dir = fresh_dir("offload_delayed_full2");
  c.fsdp.delayed_parameter_update = true;
  const TrainResult full = run(c, On::world);
  ASSERT_EQ(full.losses.size(), 6u);
  EXPECT_EQ(full.losses[0], undelayed.losses[0]);
  EXPECT_NE(full.losses[1], undelayed.losses[1]);
  EXPECT_LT(full.losses.back(), full.losses.front());
  // Two steps of warm-up (no checkpoint at step 3, whose save would complete update 3):
  // steps 1-3 are the undelayed run's, step 4 is taken at the parameters before update 3.
  c.train.run_dir = fresh_dir("offload_delayed_warm");
  c.fsdp.delayed_parameter_update_warmup_steps = 2;
  c.checkpoint.every = 0;
  const TrainResult warm = run(c, On::world);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(warm.losses[i], undelayed.losses[i]) << "step " << i + 1;
  EXPECT_NE(warm.losses[3], undelayed.losses[3]);
  c.checkpoint.every = 3;
  c.fsdp.delayed_parameter_update_warmup_steps = 0;
  for (bool second_delayed : {true, false}) {
    c.fsdp.delayed_parameter_update = true;
    const auto [first, second] = stop_at_3_and_resume(
        c, [second_delayed = second_delayed](Config& r) {
          r.fsdp.delayed_parameter_update = second_delayed;
        });
    ASSERT_EQ(first.losses.size(), 3u);
    ASSERT_EQ(second.losses.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
    // Resumed with the delay: the rest of the delayed run. Without it, step 4 (at the
    // parameters of step 3's save, as the delayed run's step 4) is the same too.
    EXPECT_EQ(second.losses[0], full.losses[3]) << second_delayed;
    if (second_delayed) {
      for (int i = 1; i < 3; ++i) {
        EXPECT_EQ(second.losses[i], full.losses[i + 3]) << "step " << i + 4;
      }
      for (const auto& [name, values] : full.params) {
        EXPECT_EQ(second.params.at(name), values) << name;
      }
    } else {
      EXPECT_NE(second.losses[2], full.losses[5]);
    }
  }
}

TEST(Offload, PlanEqualsTheMeasuredDeviceAndHostPeaks) {
  for (ShardingStrategy s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                             ShardingStrategy::HYBRID_SHARD}) {
    for (fsdp::DType dt : {fsdp::DType::f32, fsdp::DType::bf16}) {
      const Case k{s, dt};
      Config c = offload_config("offload_plan", k);
      c.fsdp.cpu_offload = true;
      const TrainResult r = run(c, On::world);
      const fsdp::EngineMemoryPlan& p = r.plan;
      ASSERT_TRUE(p.offload) << k.tag();
      auto dev = [&](MemCategory m) { return r.peak_bytes[static_cast<std::size_t>(m)]; };
      auto host = [&](MemCategory m) { return r.host_peak_bytes[static_cast<std::size_t>(m)]; };
      EXPECT_EQ(p.sharded_params, dev(MemCategory::sharded_params)) << k.tag();
      EXPECT_EQ(p.grads, dev(MemCategory::grads)) << k.tag();
      EXPECT_EQ(p.optimizer_state, dev(MemCategory::optimizer_state)) << k.tag();
      EXPECT_EQ(p.unsharded_params, dev(MemCategory::unsharded_params)) << k.tag();
      EXPECT_EQ(p.unsharded_grads, dev(MemCategory::unsharded_grads)) << k.tag();
      EXPECT_EQ(p.comm_buffers, dev(MemCategory::comm_buffers)) << k.tag();
      EXPECT_EQ(r.planned_activation_bytes, dev(MemCategory::activations)) << k.tag();
      EXPECT_EQ(p.host.sharded_params, host(MemCategory::sharded_params)) << k.tag();
      EXPECT_EQ(p.host.grads, host(MemCategory::grads)) << k.tag();
      EXPECT_EQ(p.host.optimizer_state, host(MemCategory::optimizer_state)) << k.tag();
      EXPECT_EQ(p.host.comm_buffers, host(MemCategory::comm_buffers)) << k.tag();

      // Against the plan without offload: the model states move to the host, byte for byte.
      Config plain = c;
      plain.fsdp.cpu_offload = false;
      const fsdp::EngineMemoryPlan q =
          fsdp::plan_memory(fsdp::model_family(c.model.type).modules(c.model), plain,
                            world_size(), c.mesh.shard_size > 0 ? static_cast<int>(c.mesh.shard_size)
                                                                 : world_size(),
                            fsdp::num_optimizer_states(c.optim.name));
      EXPECT_FALSE(q.offload);
      EXPECT_EQ(p.host.sharded_params, q.sharded_params) << k.tag();
      EXPECT_EQ(p.host.grads, q.grads) << k.tag();
      EXPECT_EQ(p.host.optimizer_state, q.optimizer_state) << k.tag();
      EXPECT_EQ(p.sharded_params + p.grads + p.optimizer_state, 0) << k.tag();
      EXPECT_EQ(q.host.total, 0) << k.tag();
      // The host's comm_buffers: the param_dtype copies the uploads read (none for fp32,
      // which uploads the shard itself) and 16-bit gradient staging (the 7B plan's test
      // bounds it); fp32 reduced gradients land in the gradient shards, nothing staged.
      const int64_t copies = dt == fsdp::DType::f32 ? 0 : p.host.sharded_params / 2;
      if (dt == fsdp::DType::f32) {
        EXPECT_EQ(p.host.comm_buffers, copies) << k.tag();
      } else {
        EXPECT_GT(p.host.comm_buffers, copies) << k.tag();
      }
    }
  }
  // Micro-batches: the passes before the last accumulate on the device (an fp32 accumulator
  // as large as the shards), and the plan counts it.
  for (ShardingStrategy s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::HYBRID_SHARD}) {
    const Case k{s, fsdp::DType::bf16};
    Config c = offload_config("offload_plan_micro", k);
    c.fsdp.cpu_offload = true;
    c.train.micro_batch_size = 1;
    const TrainResult r = run(c, On::world);
    auto dev = [&](MemCategory m) { return r.peak_bytes[static_cast<std::size_t>(m)]; };
    auto host = [&](MemCategory m) { return r.host_peak_bytes[static_cast<std::size_t>(m)]; };
    EXPECT_EQ(r.plan.grads, dev(MemCategory::grads)) << k.tag();
    EXPECT_EQ(r.plan.grads, r.plan.host.sharded_params) << k.tag();
    EXPECT_EQ(r.plan.comm_buffers, dev(MemCategory::comm_buffers)) << k.tag();
    EXPECT_EQ(r.plan.unsharded_params, dev(MemCategory::unsharded_params)) << k.tag();
    EXPECT_EQ(r.plan.host.comm_buffers, host(MemCategory::comm_buffers)) << k.tag();
    EXPECT_EQ(r.plan.host.grads, host(MemCategory::grads)) << k.tag();
  }
}

// fsdp.offload_optimizer (DeepSpeed's offload_optimizer without offload_param): the master
// shards, gradients and optimizer state on the host as with cpu_offload, the param_dtype
// shards resident on the device. The same arithmetic in the same order: equal to the run
// without offload bit for bit, for every strategy and dtype, with micro-batches and fp16.
TEST(OffloadOptimizer, EqualsTheRunWithoutOffloadBitForBit) {
  struct Variant {
    const char* name;
    void (*apply)(Config&);
  };
  const Variant variants[] = {
      {"default", [](Config&) {}},
      {"micro-batches of 1", [](Config& c) { c.train.micro_batch_size = 1; }},
      {"fp16, sgd", [](Config& c) {
         c.mixed_precision.param_dtype = fsdp::DType::f16;
         c.mixed_precision.reduce_dtype = fsdp::DType::f16;
         c.optim.name = fsdp::OptimizerKind::sgd;
       }},
  };
  for (ShardingStrategy s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                             ShardingStrategy::HYBRID_SHARD}) {
    for (fsdp::DType dt : {fsdp::DType::f32, fsdp::DType::bf16}) {
      for (const Variant& v : variants) {
        const Case k{s, dt};
        // fp32 at one shard: without offload the model's backward accumulates each
        // micro-batch into the fp32 shard inside its GEMMs (beta = 1), with offload into a
        // zeroed full gradient then added whole: equal sums, other roundings (cpu_offload
        // the same; its test above runs micro-batches in bf16 for that reason).
        if (dt == fsdp::DType::f32 && world_size() == 1 && std::string(v.name) != "default") {
          continue;
        }
        Config c = offload_config("offopt_ref", k);
        v.apply(c);
        const std::string what = k.tag() + " " + v.name;
        const TrainResult ref = run(c, On::world);
        c.train.run_dir = fresh_dir("offopt_on");
        c.fsdp.offload_optimizer = true;
        const TrainResult off = run(c, On::world);
        expect_same_run(ref, off, what);
        ASSERT_TRUE(off.plan.offload) << what;
        // fsdp.offload_optimizer_ratio 0.5: the root and the first block on the device,
        // stepping there beside the host's units.
        c.train.run_dir = fresh_dir("offopt_half");
        c.fsdp.offload_optimizer_ratio = 0.5;
        expect_same_run(ref, run(c, On::world), what + " ratio 0.5");
      }
    }
  }
}

// The plan's rows equal the measured peaks, and against cpu_offload the device holds exactly
// the param_dtype shards more (2 or 4 bytes a shard element) while the host rows are equal.
TEST(OffloadOptimizer, PlanEqualsTheMeasuredPeaksAndHoldsTheParamDtypeShardsOnTheDevice) {
  for (fsdp::DType dt : {fsdp::DType::f32, fsdp::DType::bf16}) {
    for (int64_t micro : {int64_t{0}, int64_t{1}}) {
      const Case k{ShardingStrategy::FULL_SHARD, dt};
      Config c = offload_config("offopt_plan", k);
      c.train.micro_batch_size = micro;
      c.fsdp.offload_optimizer = true;
      const TrainResult r = run(c, On::world);
      const std::string what = k.tag() + " micro " + std::to_string(micro);
      auto dev = [&](MemCategory m) { return r.peak_bytes[static_cast<std::size_t>(m)]; };
      auto host = [&](MemCategory m) { return r.host_peak_bytes[static_cast<std::size_t>(m)]; };
      const fsdp::EngineMemoryPlan& p = r.plan;
      const std::pair<MemCategory, std::array<int64_t, 2>> rows[] = {
          {MemCategory::sharded_params, {p.sharded_params, p.host.sharded_params}},
          {MemCategory::grads, {p.grads, p.host.grads}},
          {MemCategory::optimizer_state, {p.optimizer_state, p.host.optimizer_state}},
          {MemCategory::unsharded_params, {p.unsharded_params, p.host.unsharded_params}},
          {MemCategory::unsharded_grads, {p.unsharded_grads, p.host.unsharded_grads}},
          {MemCategory::comm_buffers, {p.comm_buffers, p.host.comm_buffers}}};
      for (const auto& [m, planned] : rows) {
        EXPECT_EQ(planned[0], dev(m)) << what << " device " << fsdp::to_string(m);
        EXPECT_EQ(planned[1], host(m)) << what << " host " << fsdp::to_string(m);
      }
      Config full = c;
      full.fsdp.offload_optimizer = false;
      full.fsdp.cpu_offload = true;
      const fsdp::EngineMemoryPlan q =
          fsdp::plan_memory(fsdp::model_family(c.model.type).modules(c.model), full,
                            world_size(), world_size(), fsdp::num_optimizer_states(c.optim.name));
      const int64_t bytes = static_cast<int64_t>(fsdp::dtype_size(dt));
      EXPECT_EQ(p.sharded_params, q.host.sharded_params / 4 * bytes) << what;
      EXPECT_EQ(p.host.sharded_params, q.host.sharded_params) << what;
      EXPECT_EQ(p.host.optimizer_state, q.host.optimizer_state) << what;
      EXPECT_EQ(p.host.grads, q.host.grads) << what;
    }
  }
}

// fsdp.offload_optimizer_ratio 0.5: the plan's device and host rows equal the measured peaks,
// and the units kept on the device take their fp32 shards, gradients and optimizer state off
// the host rows: the host holds less, and device plus host hold the fully offloaded plan's
// fp32 state.
TEST(OffloadOptimizer, RatioPlanEqualsTheMeasuredPeaks) {
  const Case k{ShardingStrategy::FULL_SHARD, fsdp::DType::bf16};
  Config c = offload_config("offratio_plan", k);
  c.fsdp.offload_optimizer = true;
  c.fsdp.offload_optimizer_ratio = 0.5;
  const TrainResult r = run(c, On::world);
  auto dev = [&](MemCategory m) { return r.peak_bytes[static_cast<std::size_t>(m)]; };
  auto host = [&](MemCategory m) { return r.host_peak_bytes[static_cast<std::size_t>(m)]; };
  const fsdp::EngineMemoryPlan& p = r.plan;
  EXPECT_EQ(p.sharded_params, dev(MemCategory::sharded_params));
  EXPECT_EQ(p.grads, dev(MemCategory::grads));
  EXPECT_EQ(p.optimizer_state, dev(MemCategory::optimizer_state));
  EXPECT_EQ(p.comm_buffers, dev(MemCategory::comm_buffers));
  EXPECT_EQ(p.host.sharded_params, host(MemCategory::sharded_params));
  EXPECT_EQ(p.host.grads, host(MemCategory::grads));
  EXPECT_EQ(p.host.optimizer_state, host(MemCategory::optimizer_state));
  EXPECT_EQ(p.host.comm_buffers, host(MemCategory::comm_buffers));
  Config all = c;
  all.fsdp.offload_optimizer_ratio = 1.0;
  const fsdp::EngineMemoryPlan q =
      fsdp::plan_memory(fsdp::model_family(c.model.type).modules(c.model), all, world_size(),
                        world_size(), fsdp::num_optimizer_states(c.optim.name));
  EXPECT_GT(p.optimizer_state, 0);
  EXPECT_EQ(p.optimizer_state + p.host.optimizer_state, q.host.optimizer_state);
  EXPECT_LT(p.host.sharded_params, q.host.sharded_params);
  EXPECT_LT(p.host.total, q.host.total);
}

// fsdp.offload_optimizer_ratio = 0 ("auto") through the trainer on the CPU backend, whose
// device is the host's memory: resolved to 1 (everything offloaded: no optimizer state on the
// device), the same run as without offload.
TEST(OffloadOptimizer, AutoRatioOnTheCpuBackendOffloadsEverything) {
  const Case k{ShardingStrategy::FULL_SHARD, fsdp::DType::bf16};
  Config c = offload_config("offauto_ref", k);
  const TrainResult ref = run(c, On::world);
  c.train.run_dir = fresh_dir("offauto_on");
  c.fsdp.offload_optimizer = true;
  c.fsdp.offload_optimizer_ratio = 0;
  const TrainResult off = run(c, On::world);
  expect_same_run(ref, off, "auto");
  EXPECT_EQ(off.plan.optimizer_state, 0);
  EXPECT_GT(off.plan.host.optimizer_state, 0);
}

// The plan of inputs/gpt_7b.toml on one rank (world size 1) and its activation bytes.
struct Plan {
  fsdp::EngineMemoryPlan engine;
  int64_t activations = 0;
};
// global_batch 0: the file's (8 micro-batches of one sequence). offload: fsdp.cpu_offload (the
// file's own offload_optimizer off either way), with every block recomputing (the file's
// header: what a device under ~50 GB needs).
Plan plan_7b(bool offload, int64_t n_layer = 32, int64_t global_batch = 0) {
  std::vector<std::string> sets = {"fsdp.cpu_offload=" + std::string(offload ? "true" : "false"),
                                   "fsdp.offload_optimizer=false",
                                   "fsdp.activation_checkpointing=true",
                                   "model.n_layer=" + std::to_string(n_layer)};
  if (global_batch > 0) sets.push_back("train.global_batch_size=" + std::to_string(global_batch));
  Config c = fsdp::load_config(std::string(FSDP_SOURCE_DIR) + "/inputs/gpt_7b.toml", sets);
  const fsdp::ModelFamily& family = fsdp::model_family(c.model.type);
  Plan p;
  p.engine = fsdp::plan_memory(family.modules(c.model), c, 1, 1,
                              fsdp::num_optimizer_states(c.optim.name));
  p.activations = family.activation_bytes(c.model, c.train.micro_batch_size,
                                          fsdp::data::batch_shape(c),
                                          c.mixed_precision.param_dtype,
                                          c.fsdp.checkpointing());
  return p;
}

TEST(Offload, A7BPlanFitsOneGpuWithOffloadAndNotWithout) {
  using testing::HasSubstr;
  using testing::Not;
  constexpr int64_t GiB = int64_t{1} << 30;
  const fsdp::MemoryBudget gpu{79 * GiB, "cuda:0 free 79.0 GiB / 1 rank"};
  const fsdp::MemoryBudget host{120 * GiB, "MemAvailable 120.0 GiB / 1 rank on this node"};

  const Plan on = plan_7b(true);
  ASSERT_TRUE(on.engine.offload);
  // The device: the units in flight and, over 8 micro-batches, the fp32 gradient
  // accumulator (4 B/param).
  EXPECT_EQ(on.engine.grads, on.engine.host.sharded_params);
  EXPECT_LT(on.engine.total + on.activations, 32 * GiB);
  // The host: fp32 params, grads and Adam state (16 B/param) and the bf16 copies the uploads
  // read (2 B/param), with a few units' gradient staging.
  EXPECT_GT(on.engine.host.total, 110 * GiB);
  EXPECT_LT(on.engine.host.total, 116 * GiB);
  // No gradient staging: the fp32 accumulator's copies land in the host gradient shards.
  const int64_t copies = on.engine.host.sharded_params / 2;  // bf16
  EXPECT_EQ(on.engine.host.comm_buffers, copies);
  // One micro-batch a step stages its bf16 gradients: a few units' worth (at most
  // kStagedCopies copies wait for the host), not the 32 blocks'.
  const Plan one = plan_7b(true, 32, 1);
  EXPECT_GT(one.engine.host.comm_buffers, copies);
  EXPECT_LT(one.engine.host.comm_buffers - copies, one.engine.host.sharded_params / 8);
  EXPECT_EQ(fsdp::memory_refusal(on.engine, on.activations, gpu, host, false), "");

  const Plan off = plan_7b(false);
  const std::string no = fsdp::memory_refusal(off.engine, off.activations, gpu, host, false);
  EXPECT_THAT(no, HasSubstr("memory plan: "));
  EXPECT_THAT(no, HasSubstr("does not fit in the 79.0 GiB this rank may use (cuda:0 free"));
  EXPECT_THAT(no, HasSubstr("largest row: optimizer_state"));
  EXPECT_THAT(no, HasSubstr("fsdp.cpu_offload"));

  // 13B-class depth (64 layers): the host rows (~190 GiB) exceed the host; named as such.
  const Plan deep = plan_7b(true, 64);
  const std::string host_no = fsdp::memory_refusal(deep.engine, deep.activations, gpu, host, false);
  EXPECT_THAT(host_no, HasSubstr("memory plan: host "));
  EXPECT_THAT(host_no, HasSubstr("(MemAvailable 120.0 GiB / 1 rank on this node)"));
  EXPECT_THAT(host_no, HasSubstr("largest row: optimizer_state"));

  // Where the device is the host (the CPU backend), the rows add up: 7B with offload needs
  // its device and host rows together.
  const fsdp::MemoryBudget cpu{100 * GiB, "MemAvailable 100.0 GiB / 1 rank on this node"};
  const std::string cpu_no = fsdp::memory_refusal(on.engine, on.activations, cpu, cpu, true);
  EXPECT_THAT(cpu_no, HasSubstr("memory plan: 13"));
  // and offload is not advised there: it moves nothing out of the one memory.
  EXPECT_THAT(cpu_no, HasSubstr("fsdp.activation_checkpointing or a smaller"));
  EXPECT_THAT(cpu_no, Not(HasSubstr("offload")));
  EXPECT_EQ(fsdp::memory_refusal(on.engine, on.activations, {-1, "unknown"}, {-1, "unknown"}, false), "");
}

// fsdp.offload_optimizer_ratio = 0 ("auto") for GPT 7B on one 80 GB GPU: the ratio
// auto_offload_ratio picks fits 90 % of the device's budget, no ratio on a grid of 1/64 below
// it does (the bisection found the smallest, to the units' granularity), and it keeps a good
// part of the optimizer on the device; a 40 GB device fits only full offload (1); no budget,
// or the CPU backend, gives 1.
TEST(OffloadOptimizer, AutoRatioIsTheSmallestThatFitsTheDevice) {
  constexpr int64_t GiB = int64_t{1} << 30;
  Config c = fsdp::load_config(std::string(FSDP_SOURCE_DIR) + "/inputs/gpt_7b.toml",
                               {"fsdp.cpu_offload=false", "fsdp.offload_optimizer=true",
                                "fsdp.offload_optimizer_ratio=0"});
  const fsdp::ModelFamily& family = fsdp::model_family(c.model.type);
  const auto modules = family.modules(c.model);
  const int states = fsdp::num_optimizer_states(c.optim.name);
  const int64_t acts = family.activation_bytes(c.model, c.train.micro_batch_size,
                                               fsdp::data::batch_shape(c),
                                               c.mixed_precision.param_dtype,
                                               c.fsdp.checkpointing());
  auto fits = [&](double ratio, int64_t budget) {
    Config r = c;
    r.fsdp.offload_optimizer_ratio = ratio;
    const fsdp::EngineMemoryPlan p = fsdp::plan_memory(modules, r, 1, 1, states);
    return fsdp::memory_refusal(p, acts, {budget, "test"}, {}, false).empty();
  };
  const fsdp::MemoryBudget h100{79 * GiB, "cuda:0 free 79.0 GiB / 1 rank"};
  const double auto_ratio = fsdp::auto_offload_ratio(modules, c, 1, 1, states, acts, h100, false);
  const auto usable = static_cast<int64_t>(79 * GiB * (1 - fsdp::kAutoOffloadHeadroom));
  EXPECT_TRUE(fits(auto_ratio, usable)) << auto_ratio;
  // It uses what it may: less than one more unit's device rows (~1.9 GiB) are left over.
  EXPECT_FALSE(fits(auto_ratio, usable - 2 * GiB)) << auto_ratio;
  for (int i = 1; i < 64 && i / 64.0 < auto_ratio - 1.0 / 64; ++i) {
    EXPECT_FALSE(fits(i / 64.0, usable)) << i << "/64 fits below " << auto_ratio;
  }
  EXPECT_GT(auto_ratio, 0.4);
  EXPECT_LT(auto_ratio, 0.7);
  EXPECT_EQ(fsdp::auto_offload_ratio(modules, c, 1, 1, states, acts, {40 * GiB, "40"}, false), 1.0);
  // An H200 (139 GiB) fits all but the last unit (at least one unit stays offloaded), and the
  // plan without offload (106.5 GiB) fits its budget too (the trainer's log says so).
  const fsdp::MemoryBudget h200{139 * GiB, "cuda:0 free 139.0 GiB / 1 rank"};
  EXPECT_LT(fsdp::auto_offload_ratio(modules, c, 1, 1, states, acts, h200, false), 0.05);
  Config plain = c;
  plain.fsdp.offload_optimizer = false;
  EXPECT_EQ(fsdp::memory_refusal(fsdp::plan_memory(modules, plain, 1, 1, states), acts,
                                 fsdp::auto_offload_budget(h200), {}, false),
            "");
  EXPECT_EQ(fsdp::auto_offload_budget({}).bytes, -1);
  EXPECT_EQ(fsdp::auto_offload_ratio(modules, c, 1, 1, states, acts, {}, false), 1.0);
  EXPECT_EQ(fsdp::auto_offload_ratio(modules, c, 1, 1, states, acts, h100, true), 1.0);
}

// The CPU backend's HostAllocator (what the offload runtime on CUDA fills with page-locked
// memory): every raw block comes from it and goes back to it.
TEST(Offload, CpuBackendTakesItsMemoryFromTheGivenAllocator) {
  auto counts = std::make_shared<std::array<int, 2>>();  // allocations, frees
  {
    fsdp::HostAllocator a;
    a.allocate = [counts](std::size_t bytes) {
      ++(*counts)[0];
      return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    };
    a.free = [counts](void* p) {
      ++(*counts)[1];
      std::free(p);
    };
    auto be = fsdp::make_cpu_backend(1, a);
    fsdp::DeviceBuffer x(*be, fsdp::DType::f32, 1000, MemCategory::sharded_params);
    be->fill_zero(x.view());
    EXPECT_EQ((*counts)[0], 1);
    EXPECT_EQ(be->memory().current(MemCategory::sharded_params), 4000u);
  }
  EXPECT_EQ((*counts)[1], (*counts)[0]);
}

}  // namespace
