// Llama end to end through the trainer, run by ctest under mpirun at 1, 2 and 4 ranks, as
// tests/test_fsdp.cpp does for GPT-2: every sharding strategy equals a 1-rank NO_SHARD run
// (losses, validation loss and final parameters within 1e-5 relative); a stopped and resumed
// run continues bit-identically; CPU offload, activation checkpointing and micro-batches give
// the plain run's steps; the memory plan equals the measured peaks; and fsdp_merge's
// safetensors hold the run's parameters under HF LlamaForCausalLM's names, with a config.json
// whose sizes read back to the run's [model].
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/init_from.hpp"
#include "fsdp/checkpoint/merge.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/data/prepare.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/train/router_bias.hpp"
#include "train_util.hpp"

using fsdp::Config;
using fsdp::ShardingStrategy;
using fsdp::TrainResult;
using namespace test_util;

namespace {

const TrainResult& reference(bool tied) {
  static std::map<bool, TrainResult> cache;
  if (auto it = cache.find(tied); it != cache.end()) return it->second;
  Config c = llama_config(fresh_dir(std::string("llama_reference_") + (tied ? "tied" : "untied")) +
                          "/rank" + std::to_string(world_rank()));
  c.model.set("tie_word_embeddings", tied);
  c.fsdp.sharding_strategy = ShardingStrategy::NO_SHARD;
  return cache[tied] = run(c, On::self);
}

void expect_close(const TrainResult& got, const TrainResult& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], tol * std::abs(ref.losses[i])) << what << " step " << i + 1;
  }
  std::vector<float> a, b;
  ASSERT_EQ(got.params.size(), ref.params.size()) << what;
  for (const auto& [name, values] : ref.params) {
    ASSERT_TRUE(got.params.count(name)) << what << ": " << name;
    a.insert(a.end(), got.params.at(name).begin(), got.params.at(name).end());
    b.insert(b.end(), values.begin(), values.end());
  }
  EXPECT_LE(rel_diff(a, b), tol) << what;
  ASSERT_EQ(got.val_losses.size(), ref.val_losses.size()) << what;
  for (std::size_t i = 0; i < ref.val_losses.size(); ++i) {
    EXPECT_NEAR(got.val_losses[i].second, ref.val_losses[i].second, tol * ref.val_losses[i].second)
        << what;
  }
}

TEST(LlamaFsdp, EveryStrategyMatchesOneRankNoShard) {
  for (bool tied : {false, true}) {
    for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                   ShardingStrategy::NO_SHARD, ShardingStrategy::HYBRID_SHARD,
                   ShardingStrategy::HYBRID_SHARD_ZERO2}) {
      const std::string tag = std::string(fsdp::to_string(s)) + (tied ? "_tied" : "_untied");
      Config c = llama_config(fresh_dir("llama_" + tag));
      c.model.set("tie_word_embeddings", tied);
      c.fsdp.sharding_strategy = s;
      c.mesh.shard_size = std::min(2, world_size());
      const TrainResult got = run(c, On::world);
      const TrainResult& ref = reference(tied);
      EXPECT_LT(ref.losses.back(), ref.losses.front()) << "it trains";
      expect_close(got, ref, 1e-5, tag);
    }
  }
}

TEST(LlamaFsdp, ResumeContinuesBitIdentically) {
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::HYBRID_SHARD}) {
    const std::string tag = fsdp::to_string(s);
    Config c = llama_config(fresh_dir("llama_resume_full_" + tag));
    c.fsdp.sharding_strategy = s;
    c.mesh.shard_size = std::min(2, world_size());
    c.train.max_steps = 6;
    c.checkpoint.every = 3;
    const TrainResult full = run(c, On::world);
    c.train.run_dir = fresh_dir("llama_resume_part_" + tag);
    const TrainResult first = run(c, On::world, /*stop_after=*/3);
    const TrainResult second = run(c, On::world, 0, /*resume=*/true);
    ASSERT_EQ(first.losses.size(), 3u);
    ASSERT_EQ(second.losses.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(first.losses[i], full.losses[i]) << tag << " step " << i + 1;
      EXPECT_EQ(second.losses[i], full.losses[i + 3]) << tag << " step " << i + 4;
    }
    for (const auto& [name, values] : full.params) EXPECT_EQ(second.params.at(name), values) << tag << " " << name;
  }
}

// Offload, activation checkpointing and micro-batches change where and when the same sums
// are done, not which: bit for bit (micro-batches: the summation order moves, 1e-6).
TEST(LlamaFsdp, OffloadCheckpointingAndMicroBatchesGiveThePlainSteps) {
  for (auto dtype : {"fp32", "bf16"}) {
    const std::vector<std::string> mp = {std::string("mixed_precision.param_dtype=") + dtype,
                                         std::string("mixed_precision.reduce_dtype=") + dtype,
                                         "optim.name=sgd"};
    const std::string tag = dtype;
    const TrainResult plain = run(llama_config(fresh_dir(std::string("llama_plain_") + dtype), mp), On::world);
    auto with = [&](const std::string& name, std::vector<std::string> extra) {
      std::vector<std::string> o = mp;
      o.insert(o.end(), extra.begin(), extra.end());
      return run(llama_config(fresh_dir("llama_" + name + "_" + tag), o), On::world);
    };
    const TrainResult off = with("offload", {"fsdp.cpu_offload=true"});
    const TrainResult ckpt = with("ckpt", {"fsdp.activation_checkpointing=true"});
    for (std::size_t i = 0; i < plain.losses.size(); ++i) {
      EXPECT_EQ(off.losses[i], plain.losses[i]) << tag << " offload step " << i + 1;
      EXPECT_EQ(ckpt.losses[i], plain.losses[i]) << tag << " checkpointing step " << i + 1;
    }
    for (const auto& [name, values] : plain.params) {
      EXPECT_EQ(off.params.at(name), values) << tag << " offload " << name;
      EXPECT_EQ(ckpt.params.at(name), values) << tag << " checkpointing " << name;
    }
    if (8 / world_size() > 1) {
      const TrainResult micro = with("micro", {"train.micro_batch_size=1"});
      expect_close(micro, plain, std::string(dtype) == "fp32" ? 1e-6 : 1e-2, tag + " micro-batches");
    }
  }
}

TEST(LlamaFsdp, PlanEqualsTheMeasuredPeaks) {
  for (const char* strategy : {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"}) {
    for (const char* micro : {"0", "1"}) {
      for (const char* offload : {"false", "true"}) {
        const std::string tag = std::string(strategy) + " micro " + micro + " offload " + offload;
        Config c = llama_config(fresh_dir(std::string("llama_plan_") + strategy + micro + offload),
                                {std::string("fsdp.sharding_strategy=") + strategy,
                                 std::string("train.micro_batch_size=") + micro,
                                 std::string("fsdp.cpu_offload=") + offload,
                                 "mixed_precision.param_dtype=bf16"});
        c.mesh.shard_size = std::min(2, world_size());
        const TrainResult r = run(c, On::world);
        auto dev = [&](fsdp::MemCategory m) { return r.peak_bytes[static_cast<std::size_t>(m)]; };
        EXPECT_EQ(r.plan.sharded_params, dev(fsdp::MemCategory::sharded_params)) << tag;
        EXPECT_EQ(r.plan.grads, dev(fsdp::MemCategory::grads)) << tag;
        EXPECT_EQ(r.plan.optimizer_state, dev(fsdp::MemCategory::optimizer_state)) << tag;
        EXPECT_EQ(r.plan.unsharded_params, dev(fsdp::MemCategory::unsharded_params)) << tag;
        EXPECT_EQ(r.plan.unsharded_grads, dev(fsdp::MemCategory::unsharded_grads)) << tag;
        EXPECT_EQ(r.plan.comm_buffers, dev(fsdp::MemCategory::comm_buffers)) << tag;
        EXPECT_EQ(r.planned_activation_bytes, dev(fsdp::MemCategory::activations)) << tag;
      }
    }
  }
}

// Document masking through the trainer (data.attn_mask_type = "block_causal", documents
// ending at each space of the byte text: data.eos_token_id = 32), with and without
// reset_position_ids, and with data.eod_mask_loss: FULL_SHARD and HYBRID_SHARD over the world equal
// a 1-rank NO_SHARD run with the same mask, the mask changes the losses from the causal run's, and
// the memory plan (its document buffers) equals the measured peaks.
TEST(LlamaFsdp, DocumentMaskingShardsAsOneRank) {
  for (const char* reset : {"true", "false", "eod_mask_loss"}) {
    const bool eod = std::string(reset) == "eod_mask_loss";
    std::vector<std::string> docs = {
        "data.attn_mask_type=block_causal",
        std::string("data.reset_position_ids=") + (eod ? "true" : reset), "data.eos_token_id=32"};
    if (eod) docs.push_back("data.eod_mask_loss=true");  // a step's targets vary: all-reduced
    const std::string tag = std::string("reset ") + reset;
    Config r = llama_config(fresh_dir(std::string("llama_docs_ref_") + reset) + "/rank" +
                                std::to_string(world_rank()),
                            docs);
    r.fsdp.sharding_strategy = ShardingStrategy::NO_SHARD;
    const TrainResult ref = run(r, On::self);
    EXPECT_LT(ref.losses.back(), ref.losses.front()) << tag << ": it trains";
    EXPECT_NE(ref.losses.front(), reference(false).losses.front()) << tag << ": the mask acts";
    for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::HYBRID_SHARD}) {
      Config c = llama_config(
          fresh_dir(std::string("llama_docs_") + fsdp::to_string(s) + "_" + reset), docs);
      c.fsdp.sharding_strategy = s;
      c.mesh.shard_size = std::min(2, world_size());
      const TrainResult got = run(c, On::world);
      expect_close(got, ref, 1e-5, tag + " " + fsdp::to_string(s));
      expect_plan_equals_peak(got, tag + " " + fsdp::to_string(s));
    }
  }
}

// The bias update's rule (fsdp/train/router_bias.hpp): rate times the sign of the mean minus
// the count, 0 at the mean; a negative rate is refused.
TEST(RouterBias, DeltasFollowTheSignOfTheImbalance) {
  EXPECT_EQ(fsdp::router_bias_deltas({4, 0, 2, 2}, 0.5), (std::vector<float>{-0.5f, 0.5f, 0, 0}));
  EXPECT_EQ(fsdp::router_bias_deltas({3, 3, 3}, 0.25), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(fsdp::router_bias_deltas({1, 2}, 0.0), (std::vector<float>{0, 0}));
  EXPECT_THROW(fsdp::router_bias_deltas({1, 2}, -1e-3), fsdp::Error);
}

// Auxiliary-loss-free load balancing through the trainer (optim.moe_router_bias_update_rate):
// GLM-4.5's routers (6 experts in 3 groups, 2 a token) over 5 steps at rate 0.01. Each bias
// element ends a whole number of steps of 0.01 from 0, within 5 of them, and the biases move;
// FULL_SHARD and HYBRID_SHARD over the world equal a 1-rank NO_SHARD run (the counts are summed
// over the ranks); CPU offload (the update on the host thread) equals the device run bit for
// bit; at rate 0 the biases stay 0; a stopped and resumed run continues bit for bit.
TEST(RouterBias, UpdatesTheBiasesAsOneRankAndResumes) {
  const std::vector<std::string> glm = {
      "model.type=\"glm4_moe\"", "model.n_routed_experts=6", "model.num_experts_per_tok=2",
      "model.moe_intermediate_size=12", "model.n_group=3", "model.topk_group=2",
      "model.routed_scaling_factor=1.5", "model.num_hidden_layers=3", "optim.name=sgd"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), glm.begin(), glm.end());
    return extra;
  };
  auto biases = [](const TrainResult& r) {
    std::vector<float> b;
    for (const auto& [name, values] : r.params) {
      if (name.find("e_score_correction_bias") != std::string::npos) {
        b.insert(b.end(), values.begin(), values.end());
      }
    }
    return b;
  };
  Config r = llama_config(fresh_dir("router_bias_ref") + "/rank" + std::to_string(world_rank()),
                          with({"optim.moe_router_bias_update_rate=0.01"}));
  r.fsdp.sharding_strategy = ShardingStrategy::NO_SHARD;
  const TrainResult ref = run(r, On::self);
  const std::vector<float> b = biases(ref);
  ASSERT_EQ(b.size(), 12u);  // two sparse layers of 6
  bool moved = false;
  for (float x : b) {
    const double steps = x / 0.01;
    EXPECT_NEAR(steps, std::round(steps), 1e-3) << x;
    EXPECT_LE(std::abs(steps), 5.0 + 1e-3) << x;
    moved = moved || x != 0.0f;
  }
  EXPECT_TRUE(moved);
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::HYBRID_SHARD}) {
    Config c = llama_config(fresh_dir(std::string("router_bias_") + fsdp::to_string(s)),
                            with({"optim.moe_router_bias_update_rate=0.01"}));
    c.fsdp.sharding_strategy = s;
    c.mesh.shard_size = std::min(2, world_size());
    const TrainResult got = run(c, On::world);
    expect_close(got, ref, 1e-5, fsdp::to_string(s));
    EXPECT_EQ(biases(got), b) << fsdp::to_string(s);
  }
  const TrainResult device = run(
      llama_config(fresh_dir("router_bias_device"), with({"optim.moe_router_bias_update_rate=0.01"})),
      On::world);
  const TrainResult offload =
      run(llama_config(fresh_dir("router_bias_offload"),
                       with({"optim.moe_router_bias_update_rate=0.01", "fsdp.cpu_offload=true"})),
          On::world);
  EXPECT_EQ(offload.losses, device.losses);
  for (const auto& [name, values] : device.params) EXPECT_EQ(offload.params.at(name), values) << name;
  const TrainResult off = run(llama_config(fresh_dir("router_bias_off"), with({})), On::world);
  for (float x : biases(off)) EXPECT_EQ(x, 0.0f);
  // Resume: stopped after step 3 of 6 and resumed, bit for bit.
  Config c = llama_config(fresh_dir("router_bias_full"),
                          with({"optim.moe_router_bias_update_rate=0.01"}));
  c.train.max_steps = 6;
  c.checkpoint.every = 3;
  const TrainResult full = run(c, On::world);
  c.train.run_dir = fresh_dir("router_bias_part");
  run(c, On::world, /*stop_after=*/3);
  const TrainResult second = run(c, On::world, 0, /*resume=*/true);
  ASSERT_EQ(second.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], full.losses[i + 3]) << "step " << i + 4;
  for (const auto& [name, values] : full.params) EXPECT_EQ(second.params.at(name), values) << name;
}

// --resume may switch document masking on (docs/checkpoint.md "Resume checks"): a run stopped
// after 3 causal steps resumes with block_causal (no refusal), its step 4 differs from the
// uninterrupted causal run's (the mask acts from there) and it goes on training.
TEST(LlamaFsdp, ResumeMaySwitchDocumentMaskingOn) {
  Config c = llama_config(fresh_dir("llama_switch_docs"));
  c.train.max_steps = 6;
  c.checkpoint.every = 3;
  const TrainResult first = run(c, On::world, /*stop_after=*/3);
  ASSERT_EQ(first.losses.size(), 3u);
  Config d = c;
  d.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  d.data.reset_position_ids = true;
  d.data.eos_token_id = 32;
  const TrainResult docs = run(d, On::world, 0, /*resume=*/true);
  ASSERT_EQ(docs.losses.size(), 3u);
  Config full = c;
  full.train.run_dir = fresh_dir("llama_switch_docs_causal");
  const TrainResult causal = run(full, On::world);
  EXPECT_NE(docs.losses.front(), causal.losses[3]) << "the mask acts from step 4";
  EXPECT_LT(docs.losses.back(), first.losses.front());
}

// A step whose update is skipped (a non-finite gradient under train.skip_nonfinite) moves no
// router bias either: the parameters after a skipped step 3 equal those after step 2, the
// biases included, while a clean step 3 moves them (so the comparison can fail).
TEST(RouterBias, ASkippedStepLeavesTheBiases) {
  Config c = llama_config(fresh_dir("router_bias_skip2"),
                          {"model.type=\"glm4_moe\"", "model.n_routed_experts=6",
                           "model.num_experts_per_tok=2", "model.moe_intermediate_size=12",
                           "model.n_group=3", "model.topk_group=2", "model.num_hidden_layers=3",
                           "optim.moe_router_bias_update_rate=0.01", "train.skip_nonfinite=true"});
  fsdp::TrainOptions o;
  o.inject_overflow_steps = {3};
  o.inject_rank = world_size() - 1;
  const TrainResult two = run(c, On::world, /*stop_after=*/2, false, o);
  c.train.run_dir = fresh_dir("router_bias_skip3");
  const TrainResult three = run(c, On::world, /*stop_after=*/3, false, o);
  EXPECT_EQ(three.nonfinite_steps, std::vector<int64_t>{3});
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  ASSERT_TRUE(two.params.count(bias));
  for (const auto& [name, values] : two.params) EXPECT_EQ(three.params.at(name), values) << name;
  c.train.run_dir = fresh_dir("router_bias_clean3");
  const TrainResult clean = run(c, On::world, /*stop_after=*/3);
  EXPECT_NE(clean.params.at(bias), two.params.at(bias));
}

TEST(LlamaFsdp, MergeWritesHfLlamaNamesAndConfig) {
  Config c = llama_config(fresh_dir("llama_merge"));
  const TrainResult got = run(c, On::world);
  auto check = [&] {
    const auto latest = fsdp::ckpt::find_latest(c.train.run_dir);
    ASSERT_TRUE(latest.has_value());
    const std::string out = c.train.run_dir + "/hf";
    fsdp::ckpt::merge_to_hf(*latest, out);
    const fsdp::safetensors::Reader st(out + "/model.safetensors");
    EXPECT_EQ(st.names().size(), got.params.size());
    for (const auto& [name, values] : got.params) {
      // Our names are HF's; the embedding and head lose their vocabulary padding (256 rows:
      // none at pad_vocab_multiple 128).
      EXPECT_EQ(st.read_f32(name), values) << name;
    }
    EXPECT_TRUE(got.params.count("lm_head.weight"));
    EXPECT_TRUE(got.params.count("model.layers.1.self_attn.k_proj.weight"));
    std::ifstream in(out + "/config.json");
    const nlohmann::json hf = nlohmann::json::parse(in);
    EXPECT_EQ(hf["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(hf["num_key_value_heads"], 2);
    EXPECT_EQ(hf["head_dim"], 4);
    EXPECT_EQ(hf["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(hf["rope_scaling"]["original_max_position_embeddings"], 8);
    EXPECT_EQ(hf["tie_word_embeddings"], false);
    const fsdp::ModelFamily& family = fsdp::model_family("llama");
    EXPECT_EQ(family.canonical(family.from_hf_config(hf, "config.json")), family.canonical(c.model));
  };
  if (world_rank() == 0) check();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Mistral, Qwen2, Qwen3, OLMo 2, Phi-3 and Gemma 3 (the same model under their HF classes:
// Mistral's and Phi-3's sliding window of 5 and Qwen2's of 4 on its second layer, all shorter
// than the 12-token sequences; Qwen2's q/k/v biases, Qwen3's per-head q/k norms at head_dim
// 6 != 16 / 4, OLMo 2's output norms and whole-row q/k norms, Phi-3's fused qkv_proj and
// gate_up_proj, which a shard boundary may cut anywhere; Gemma 3's four (1 + w) norms a layer,
// a sliding then a global layer with their own RoPE, the scaled and tied embedding with the
// space byte as padding row; SmolLM3's second layer without RoPE, sliding over 5; Granite's
// four multipliers; OLMo 3's first layer sliding over 5 with unscaled RoPE; Qwen3-MoE's,
// Mixtral's and OLMoE's routed experts): FULL_SHARD over
// the world equals one
// rank's NO_SHARD (each class its own wrap class), and the merge names the class, with the
// class's extra tensors in model.safetensors.
TEST(LlamaFsdp, OtherClassesShardAsOneRankAndMergeUnderTheirNames) {
  struct Case {
    const char* type;
    std::vector<std::string> keys;
    const char* architecture;
    const char* extra;  // a tensor Llama's config would not have ("" = none)
  };
  for (const Case& k : {Case{"mistral", {"model.sliding_window=5"}, "MistralForCausalLM", ""},
                        Case{"qwen2",
                             {"model.use_sliding_window=true", "model.sliding_window=4",
                              "model.max_window_layers=1"},
                             "Qwen2ForCausalLM", "model.layers.1.self_attn.v_proj.bias"},
                        Case{"qwen3", {"model.head_dim=6"}, "Qwen3ForCausalLM",
                             "model.layers.0.self_attn.k_norm.weight"},
                        Case{"olmo2", {}, "Olmo2ForCausalLM",
                             "model.layers.1.post_feedforward_layernorm.weight"},
                        Case{"phi3",  // Phi-4-mini's RoPE: partial, LongRoPE's long factors
                             {"model.sliding_window=5", "model.partial_rotary_factor=0.5",
                              "model.rope_scaling.rope_type=\"longrope\"",
                              "model.rope_scaling.short_factor=[1.5]",
                              "model.rope_scaling.long_factor=[3.0]",
                              "model.original_max_position_embeddings=4"},
                             "Phi3ForCausalLM",
                             "model.layers.1.mlp.gate_up_proj.weight"},
                        Case{"gemma3_text",
                             {"model.sliding_window=5", "model.sliding_window_pattern=2",
                              "model.query_pre_attn_scalar=3", "model.head_dim=6",
                              "model.pad_token_id=32"},
                             "Gemma3ForCausalLM",
                             "model.layers.1.pre_feedforward_layernorm.weight"},
                        Case{"smollm3",
                             {"model.no_rope_layer_interval=2", "model.use_sliding_window=true",
                              "model.sliding_window=5"},
                             "SmolLM3ForCausalLM", ""},
                        Case{"granite",
                             {"model.embedding_multiplier=3.0", "model.residual_multiplier=0.5",
                              "model.attention_multiplier=0.2", "model.logits_scaling=4.0"},
                             "GraniteForCausalLM", ""},
                        Case{"olmo3", {"model.sliding_window_pattern=2", "model.sliding_window=5"},
                             "Olmo3ForCausalLM", "model.layers.1.post_feedforward_layernorm.weight"},
                        // SGD: AdamW's first updates are about lr * sign(g), so the ~1e-8
                        // summation-order differences of the near-zero gradients the caps
                        // produce become 2e-5 of the parameters; under SGD 1 and 2 ranks
                        // agree to 1e-8 (with or without the caps).
                        Case{"gemma2",
                             {"model.sliding_window=5", "model.query_pre_attn_scalar=3",
                              "model.head_dim=6", "model.attn_logit_softcapping=2.0",
                              "model.final_logit_softcapping=5.0", "model.pad_token_id=32",
                              "optim.name=\"sgd\""},
                             "Gemma2ForCausalLM",
                             "model.layers.1.pre_feedforward_layernorm.weight"},
                        Case{"gemma", {"model.head_dim=6", "model.pad_token_id=32"},
                             "GemmaForCausalLM", "model.layers.1.post_attention_layernorm.weight"},
                        Case{"exaone4",
                             {"model.sliding_window_pattern=2", "model.sliding_window=5",
                              "model.head_dim=6"},
                             "Exaone4ForCausalLM", "model.layers.1.self_attn.k_norm.weight"},
                        // Mixture of experts: 4 experts, 2 per token; a shard boundary may cut
                        // an expert's tensors anywhere
                        Case{"qwen3_moe",
                             {"model.num_experts=4", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=12", "model.norm_topk_prob=true",
                              "model.head_dim=6"},
                             "Qwen3MoeForCausalLM",
                             "model.layers.1.mlp.experts.3.down_proj.weight"},
                        Case{"mixtral",
                             {"model.num_local_experts=4", "model.num_experts_per_tok=2",
                              "model.sliding_window=5"},
                             "MixtralForCausalLM",
                             "model.layers.1.block_sparse_moe.experts.3.w2.weight"},
                        Case{"olmoe", {"model.num_experts=4", "model.num_experts_per_tok=2"},
                             "OlmoeForCausalLM", "model.layers.0.mlp.gate.weight"},
                        Case{"qwen2_moe",
                             {"model.num_experts=4", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=12",
                              "model.shared_expert_intermediate_size=20"},
                             "Qwen2MoeForCausalLM",
                             "model.layers.1.mlp.shared_expert_gate.weight"},
                        // GLM-4.5: layer 0 dense, 6 experts in 3 groups (2 kept), scaled
                        // weights, 2 shared experts, q/k/v biases, half of each head rotated
                        Case{"glm4_moe",
                             {"model.n_routed_experts=6", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=12", "model.n_group=3",
                              "model.topk_group=2", "model.routed_scaling_factor=1.5",
                              "model.n_shared_experts=2", "model.first_k_dense_replace=1",
                              "model.attention_bias=true"},
                             "Glm4MoeForCausalLM",
                             "model.layers.1.mlp.gate.e_score_correction_bias"},
                        // DeepSeek-V3: GLM-4.5's block with Multi-head Latent Attention
                        // (compressed queries, interleaved rope pairs, values 6 of 8 wide)
                        Case{"deepseek_v3",
                             {"model.n_routed_experts=6", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=12", "model.n_group=3",
                              "model.topk_group=2", "model.first_k_dense_replace=1",
                              "model.q_lora_rank=6", "model.kv_lora_rank=8",
                              "model.qk_nope_head_dim=4", "model.qk_rope_head_dim=4",
                              "model.v_head_dim=6", "model.attention_bias=true",
                              "model.num_key_value_heads=4"},
                             "DeepseekV3ForCausalLM",
                             "model.layers.1.self_attn.kv_a_layernorm.weight"},
                        // DeepSeek-V2: MLA with a plain q_proj, softmax routing scaled by 1.5
                        Case{"deepseek_v2",
                             {"model.n_routed_experts=4", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=12", "model.routed_scaling_factor=1.5",
                              "model.first_k_dense_replace=1", "model.q_lora_rank=0",
                              "model.kv_lora_rank=8", "model.qk_nope_head_dim=4",
                              "model.qk_rope_head_dim=4", "model.v_head_dim=6",
                              "model.num_key_value_heads=4"},
                             "DeepseekV2ForCausalLM", "model.layers.1.self_attn.q_proj.weight"},
                        // gpt-oss: sinks, biases everywhere, packed experts, layer 0 sliding
                        Case{"gpt_oss",
                             {"model.num_local_experts=4", "model.num_experts_per_tok=2",
                              "model.sliding_window=5"},
                             "GptOssForCausalLM", "model.layers.1.mlp.experts.gate_up_proj"},
                        // Llama 4: layer 0 dense with chunked RoPE and q/k norms, layer 1
                        // sparse and NoPE with its temperature, one expert a token
                        Case{"llama4_text",
                             {"model.num_local_experts=4", "model.intermediate_size_mlp=40",
                              "model.interleave_moe_layer_step=2",
                              "model.no_rope_layer_interval=2", "model.attention_chunk_size=5",
                              "model.floor_scale=4", "model.attn_scale=0.5"},
                             "Llama4ForCausalLM",
                             "model.layers.1.feed_forward.shared_expert.up_proj.weight"},
                        // Qwen3.5: layer 0 linear attention (Gated DeltaNet), layer 1 gated
                        // full attention with half of each head rotated
                        Case{"qwen3_5_text",
                             {"model.full_attention_interval=2", "model.linear_num_key_heads=1",
                              "model.linear_num_value_heads=2", "model.linear_key_head_dim=4",
                              "model.linear_value_head_dim=3", "model.partial_rotary_factor=0.5"},
                             "Qwen3_5ForCausalLM", "model.layers.0.linear_attn.A_log"},
                        // Qwen3.5-MoE: the same layers, each MLP Qwen2-MoE's sparse block
                        Case{"qwen3_5_moe_text",
                             {"model.full_attention_interval=2", "model.linear_num_key_heads=1",
                              "model.linear_num_value_heads=2", "model.linear_key_head_dim=4",
                              "model.linear_value_head_dim=3", "model.partial_rotary_factor=0.5",
                              "model.num_experts=4", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=12",
                              "model.shared_expert_intermediate_size=20"},
                             "Qwen3_5MoeForCausalLM",
                             "model.layers.0.mlp.shared_expert_gate.weight"}}) {
    std::vector<std::string> keys = k.keys;
    keys.push_back(std::string("model.type=\"") + k.type + "\"");
    Config one = llama_config(fresh_dir(std::string(k.type) + "_one") + "/rank" +
                                  std::to_string(world_rank()),
                              keys);
    one.fsdp.sharding_strategy = ShardingStrategy::NO_SHARD;
    const TrainResult ref = run(one, On::self);
    EXPECT_LT(ref.losses.back(), ref.losses.front()) << k.type << " trains";
    Config c = llama_config(fresh_dir(std::string(k.type) + "_world"), keys);
    c.fsdp.sharding_strategy = ShardingStrategy::FULL_SHARD;
    const TrainResult got = run(c, On::world);
    expect_close(got, ref, 1e-5, k.type);
    if (std::string(k.extra) != "") EXPECT_TRUE(got.params.count(k.extra)) << k.extra;
    // (DeepSeek-V3's attention_bias is on o_proj too; gpt-oss's always)
    EXPECT_EQ(got.params.count("model.layers.0.self_attn.o_proj.bias"),
              std::string(k.type) == "deepseek_v3" || std::string(k.type) == "gpt_oss" ? 1u : 0u)
        << k.type;
    if (std::string(k.type) == "glm4_moe") {  // the dense layer 0; the router's bias never trained
      EXPECT_TRUE(got.params.count("model.layers.0.mlp.gate_proj.weight"));
      EXPECT_FALSE(got.params.count("model.layers.0.mlp.gate.weight"));
      for (float v : got.params.at(k.extra)) ASSERT_EQ(v, 0.f) << k.extra;
    }
    // metrics.jsonl: a Mixture-of-Experts run's expert load on every step (the max over the
    // ranks), between balanced (1) and one expert taking every token (E / K = 2); none else
    const std::string type = k.type;
    const bool moe = type == "qwen3_moe" || type == "mixtral" || type == "olmoe" ||
                     type == "qwen2_moe" || type == "glm4_moe" || type == "deepseek_v3" ||
                     type == "deepseek_v2" || type == "gpt_oss" || type == "llama4_text" ||
                     type == "qwen3_5_moe_text";
    const double max_load = type == "glm4_moe" || type == "deepseek_v3" ? 3.0
                            : type == "llama4_text"                      ? 4.0
                                                                         : 2.0;  // E / K
    if (world_rank() == 0) {
      std::ifstream metrics(c.train.run_dir + "/metrics.jsonl");
      std::string line;
      int lines = 0;
      while (std::getline(metrics, line)) {
        const nlohmann::json m = nlohmann::json::parse(line);
        ++lines;
        EXPECT_EQ(m.contains("moe_max_expert_load"), moe) << k.type << ": " << line;
        if (moe) {
          const double load = m.value("moe_max_expert_load", 0.0);
          EXPECT_GE(load, 1.0) << k.type;
          EXPECT_LE(load, max_load) << k.type;
        }
      }
      EXPECT_EQ(lines, static_cast<int>(got.losses.size())) << k.type;
    }
    if (world_rank() == 0) {
      const auto latest = fsdp::ckpt::find_latest(c.train.run_dir);
      ASSERT_TRUE(latest.has_value());
      const std::string out = c.train.run_dir + "/hf";
      fsdp::ckpt::merge_to_hf(*latest, out);
      const fsdp::safetensors::Reader st(out + "/model.safetensors");
      EXPECT_EQ(st.names().size(), got.params.size()) << k.type;
      std::ifstream in(out + "/config.json");
      const nlohmann::json hf = nlohmann::json::parse(in);
      EXPECT_EQ(hf["architectures"][0], k.architecture);
      EXPECT_EQ(hf["model_type"], k.type);
      const fsdp::ModelFamily& family = fsdp::model_family(k.type);
      EXPECT_EQ(family.canonical(family.from_hf_config(hf, "config.json")),
                family.canonical(c.model));
      // init_from's check: the same [model] passes; another head_dim is named with the value
      // the file holds (4, which the canonical form spells 0) and the key's. (Caught here: an
      // exception out of rank 0's part would leave the other ranks in the next case's
      // collectives, a hang instead of a failure.)
      try {
        fsdp::ckpt::check_hf_config(out, c.model);
      } catch (const std::exception& e) {
        ADD_FAILURE() << k.type << ": " << e.what();
      }
      // (DeepSeek-V3's heads share nothing: its kv_lora_rank instead)
      const bool mla = std::string(k.type) == "deepseek_v3" || std::string(k.type) == "deepseek_v2";
      fsdp::ModelConfig other = c.model;
      other.set(mla ? "kv_lora_rank" : "num_key_value_heads", int64_t{mla ? 12 : 4});
      try {
        fsdp::ckpt::check_hf_config(out, other);
        ADD_FAILURE() << k.type << ": a config.json of another shape was accepted";
      } catch (const fsdp::Error& e) {
        EXPECT_NE(std::string(e.what()).find(mla ? "kv_lora_rank = 8 but model.kv_lora_rank = 12"
                                                 : "num_key_value_heads = 2 but "
                                                   "model.num_key_value_heads = 4"),
                  std::string::npos)
            << e.what();
      }
      if (std::string(k.type) == "mistral") {
        other = c.model;
        other.set("head_dim", int64_t{8});
        try {
          fsdp::ckpt::check_hf_config(out, other);
          ADD_FAILURE() << "head_dim 8 accepted against the file's 4";
        } catch (const fsdp::Error& e) {
          EXPECT_NE(std::string(e.what()).find("head_dim = 4 but model.head_dim = 8"), std::string::npos)
              << e.what();
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace

namespace {

// A pairs file (docs/data.md's seq2seq schema) of text_dataset()'s causal-LM windows: example
// i of a split is the window [i*L, i*L + L + 1) of its tokens, its first `prompt` tokens the
// prompt and the rest the completion. Written by rank 0; all ranks wait.
std::string window_pairs(const std::string& name, int64_t L, int64_t prompt) {
  const std::string path = fresh_dir(name) + "/pairs.h5";
  if (world_rank() == 0) {
    const std::string text = "Sharded data parallel training: all-gather, compute, reshard. ";
    std::vector<int32_t> bytes;
    for (int i = 0; i < 60; ++i) bytes.insert(bytes.end(), text.begin(), text.end());
    const auto train_tokens = static_cast<int64_t>(bytes.size()) * 9 / 10;  // as text_dataset()
    auto windows = [&](int64_t begin, int64_t end) {
      fsdp::data::PairExamples ex;
      for (int64_t i = 0; begin + i * L + L + 1 <= end; ++i) {
        const auto* w = bytes.data() + begin + i * L;
        ex.add(std::vector<int32_t>(w, w + prompt), std::vector<int32_t>(w + prompt, w + L + 1));
      }
      return ex;
    };
    fsdp::data::PairSplit split{windows(0, train_tokens),
                                windows(train_tokens, static_cast<int64_t>(bytes.size()))};
    fsdp::data::write_pairs_file(path, split, "test_llama_fsdp");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// A pairs file of varied lengths for packing: example i of a split is 2 + i % 11 tokens of
// the text (a 2-token prompt, the rest the completion), taken one after the other.
std::string varied_pairs(const std::string& name) {
  const std::string path = fresh_dir(name) + "/pairs.h5";
  if (world_rank() == 0) {
    const std::string text = "Sharded data parallel training: all-gather, compute, reshard. ";
    std::vector<int32_t> bytes;
    for (int i = 0; i < 40; ++i) bytes.insert(bytes.end(), text.begin(), text.end());
    auto examples = [&](int64_t begin, int64_t end) {
      fsdp::data::PairExamples ex;
      for (int64_t at = begin, i = 0; at + 2 + i % 11 <= end; at += 2 + i % 11, ++i) {
        const auto* w = bytes.data() + at;
        ex.add(std::vector<int32_t>(w, w + 2), std::vector<int32_t>(w + 2, w + 2 + i % 11));
      }
      return ex;
    };
    const auto cut = static_cast<int64_t>(bytes.size()) * 4 / 5;
    fsdp::data::PairSplit split{examples(0, cut), examples(cut, static_cast<int64_t>(bytes.size()))};
    fsdp::data::write_pairs_file(path, split, "test_llama_fsdp");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

}  // namespace

// data.objective = "sft" (TRL's completion-only loss on prompt-completion pairs). With empty
// prompts, each example's completion is text_dataset()'s causal-LM window of the same index,
// so every SFT row equals the causal_lm row, the step's target count is the same (all-reduced
// here, computed there) and the runs agree bit for bit: every loss, the validation loss and
// the parameters, over the world. With 5-token prompts only L - 4 targets a row count: the
// loss differs, and the run still trains.
TEST(LlamaFsdp, SftOnWholeWindowsIsTheCausalLmRun) {
  const int64_t L = 12;
  auto config = [&](const std::string& dir) {
    Config c = llama_config(fresh_dir(dir), {"model.vocab_size=300"});  // the pairs' 259 ids
    c.eval.every = 5;
    return c;
  };
  Config lm = config("sft_causal_lm");
  const TrainResult want = run(lm, On::world);
  Config sft = config("sft_whole");
  sft.data.objective = fsdp::Objective::sft;
  sft.data.path = window_pairs("sft_pairs_whole", L, 0);
  const TrainResult got = run(sft, On::world);
  ASSERT_EQ(got.losses.size(), 5u);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.val_losses, want.val_losses);
  ASSERT_FALSE(got.val_losses.empty());
  EXPECT_EQ(got.params, want.params);

  Config prompted = config("sft_prompted");
  prompted.data.objective = fsdp::Objective::sft;
  prompted.data.path = window_pairs("sft_pairs_prompted", L, 5);
  const TrainResult p = run(prompted, On::world);
  ASSERT_EQ(p.losses.size(), 5u);
  EXPECT_NE(p.losses.front(), want.losses.front());
  EXPECT_LT(p.losses.back(), p.losses.front());
}

// data.packing (TRL's packing with padding_free): SFT examples of 2-12 tokens packed into
// rows of 12 by best-fit decreasing, each attending only to itself with its own positions. The
// validation loss before any step (eval.on_start) equals the unpacked run's: the same
// examples and targets, batched otherwise (to rounding); packed runs train, and FULL_SHARD
// over the world equals a 1-rank NO_SHARD run; the plan counts the document buffers.
TEST(LlamaFsdp, SftPackingKeepsTheLossAndShardsAsOneRank) {
  const std::string pairs = varied_pairs("sft_varied_pairs");
  auto config = [&](const std::string& dir, bool packing) {
    Config c = llama_config(dir, {"model.vocab_size=300", "data.objective=sft",
                                  "eval.on_start=true"});
    c.data.path = pairs;
    if (packing) {
      c.data.packing = true;
      c.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
      c.data.reset_position_ids = true;
    }
    return c;
  };
  const TrainResult rows = run(config(fresh_dir("sft_unpacked"), false), On::world);
  const TrainResult packed = run(config(fresh_dir("sft_packed"), true), On::world);
  ASSERT_FALSE(rows.val_losses.empty());
  ASSERT_FALSE(packed.val_losses.empty());
  EXPECT_EQ(packed.val_losses.front().first, 0);
  EXPECT_NEAR(packed.val_losses.front().second, rows.val_losses.front().second,
              1e-6 * rows.val_losses.front().second);
  EXPECT_LT(packed.losses.back(), packed.losses.front()) << "it trains";
  expect_plan_equals_peak(packed, "sft packing");
  Config r = config(fresh_dir("sft_packed_ref") + "/rank" + std::to_string(world_rank()), true);
  r.fsdp.sharding_strategy = ShardingStrategy::NO_SHARD;
  const TrainResult ref = run(r, On::self);
  Config f = config(fresh_dir("sft_packed_full"), true);
  f.mesh.shard_size = std::min(2, world_size());
  expect_close(run(f, On::world), ref, 1e-5, "sft packing FULL_SHARD");
}
