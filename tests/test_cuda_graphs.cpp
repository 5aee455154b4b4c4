// train.cuda_graphs on the CPU twin (fsdp/model/graphed_kernels.hpp): GraphedKernels records
// the model's kernel calls into segments ended by the hooks, the runtime and flush(), runs a
// record's first sighting eagerly, captures its second and replays the rest.
//  - Segments: results equal the direct calls; eager, capture, replay in that order; a changed
//    pointer or scalar is a new record (eager again, never a stale replay); one-call segments
//    stay eager; max_graphs evicts the least recently launched graph; a capture that fails is
//    reported once and the segments run eagerly from then on.
//  - Ordering: a runtime call or a hook ends the segment first, so what the model enqueues
//    around its kernels keeps its place (a zero fill after a GEMM zeroes its result; a hook
//    sees the kernels before it done).
//  - Every Kernels call is recorded as one call: the calls with default bodies (pairs of
//    calls) are overridden, so the CUDA backend's fused version is what a graph captures.
//  - Training: GPT-2, T5, Llama and Gemma 2 (and the other classes below, document masking
//    among them) with train.cuda_graphs = "on" equal "off" bit for
//    bit (losses, validation losses, parameters) at 1, 2 and 4 ranks, FULL_SHARD with
//    micro-batches, at least 40% of the kernel calls inside graphs; also with activation
//    checkpointing and CPU offload (GPT-2) and the fused linear + cross-entropy (Llama); a
//    graphed run stopped and resumed equals an eager run.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/model/graphed_kernels.hpp"
#include "t5_util.hpp"
#include "train_util.hpp"

using fsdp::DeviceBuffer;
using fsdp::DType;
using fsdp::GraphedKernels;
using fsdp::KernelGraphStats;
using fsdp::MemCategory;
using fsdp::TensorView;
using namespace test_util;

namespace {

struct Fixture {
  std::unique_ptr<fsdp::Backend> be = fsdp::make_cpu_backend(1);
  DeviceBuffer a = buf({1.f, 2.f, 3.f, 4.f}), b = buf({5.f, 6.f, 7.f, 8.f});
  DeviceBuffer c = buf({0.f, 0.f, 0.f, 0.f}), d = buf({0.f, 0.f, 0.f, 0.f});

  DeviceBuffer buf(const std::vector<float>& v) {
    DeviceBuffer x = DeviceBuffer::floats(*be, static_cast<int64_t>(v.size()), MemCategory::other);
    be->copy_from_host(x.view(), v.data());
    return x;
  }
  std::vector<float> read(const DeviceBuffer& x) {
    std::vector<float> v(static_cast<std::size_t>(x.view().numel()));
    be->copy_to_host(v.data(), x.view());
    return v;
  }
  // out = (A @ B) * s + A, A and B as [2,2]: two calls.
  void segment(fsdp::Kernels& k, const DeviceBuffer& out, float s) {
    k.gemm(false, false, 2, 2, 2, 1.f, a.view({2, 2}), b.view({2, 2}), 0.f, out.view({2, 2}));
    k.scale(out.view(), s);
    k.add(out.view(), out.view(), a.view());
  }
};

void expect_stats(const KernelGraphStats& s, int64_t eager, int64_t captures, int64_t replays,
                  const std::string& what) {
  EXPECT_EQ(s.eager, eager) << what;
  EXPECT_EQ(s.captures, captures) << what;
  EXPECT_EQ(s.replays, replays) << what;
  EXPECT_EQ(s.segments, eager + captures + replays) << what;
}

TEST(GraphedKernels, EagerThenCaptureThenReplayEqualTheDirectCalls) {
  Fixture f;
  f.segment(*f.be, f.d, 0.5f);
  const std::vector<float> want = f.read(f.d);
  EXPECT_EQ(want, (std::vector<float>{10.5f, 13.f, 24.5f, 29.f}));  // [[19,22],[43,50]]/2 + a
  GraphedKernels g(*f.be);
  for (int i = 0; i < 4; ++i) {
    f.be->fill_zero(f.c.view());
    f.segment(g, f.c, 0.5f);
    EXPECT_EQ(f.read(f.c), std::vector<float>(4, 0.f)) << "recorded, not run, before flush";
    g.flush();
    EXPECT_EQ(f.read(f.c), want) << "pass " << i;
  }
  expect_stats(g.stats(), 1, 1, 2, "one record four times");
  EXPECT_EQ(g.stats().calls, 12);
  EXPECT_EQ(g.stats().graphed_calls, 9);
  EXPECT_EQ(g.graphs(), 1);
}

TEST(GraphedKernels, AChangedPointerOrScalarIsANewRecordNeverAStaleReplay) {
  Fixture f;
  GraphedKernels g(*f.be);
  for (int i = 0; i < 2; ++i) {  // captured
    f.segment(g, f.c, 0.5f);
    g.flush();
  }
  f.segment(g, f.d, 0.5f);  // another output buffer: eager, and d is written, c is not
  f.be->fill_zero(f.c.view());
  g.flush();
  EXPECT_EQ(f.read(f.d), (std::vector<float>{10.5f, 13.f, 24.5f, 29.f}));
  EXPECT_EQ(f.read(f.c), std::vector<float>(4, 0.f));
  f.segment(g, f.c, 2.f);  // another scalar
  g.flush();
  EXPECT_EQ(f.read(f.c), (std::vector<float>{39.f, 46.f, 89.f, 104.f}));
  expect_stats(g.stats(), 3, 1, 0, "three records");
}

TEST(GraphedKernels, RuntimeCallsAndHooksEndTheSegmentFirst) {
  Fixture f;
  GraphedKernels g(*f.be);
  f.segment(g, f.c, 0.5f);
  g.runtime().fill_zero(f.c.view());  // after the kernels, so c ends zero
  g.flush();
  EXPECT_EQ(f.read(f.c), std::vector<float>(4, 0.f));
  g.add(f.c.view(), f.a.view(), f.a.view());
  g.runtime().copy_from_host(f.d.view(), std::vector<float>{1.f, 1.f, 1.f, 1.f}.data());
  g.add(f.c.view(), f.c.view(), f.d.view());  // c = 2a, then + d after the copy
  g.flush();
  EXPECT_EQ(f.read(f.c), (std::vector<float>{3.f, 5.f, 7.f, 9.f}));

  // A hook sees every kernel recorded before it done.
  struct Probe final : fsdp::ModuleHooks {
    Fixture& f;
    std::vector<std::vector<float>> seen;
    explicit Probe(Fixture& x) : f(x) {}
    void pre_forward(int) override { seen.push_back(f.read(f.c)); }
    void post_forward(int) override { seen.push_back(f.read(f.c)); }
    void pre_backward(int) override { seen.push_back(f.read(f.c)); }
    void post_backward(int) override { seen.push_back(f.read(f.c)); }
    TensorView param(int) override { return {}; }
    TensorView grad(int) override { return {}; }
    bool training() const override { return true; }
  } probe(f);
  fsdp::ModuleHooks& h = g.hooks(probe);
  f.segment(g, f.c, 0.5f);
  h.pre_forward(0);
  g.scale(f.c.view(), 2.f);
  g.scale(f.c.view(), 2.f);
  h.post_forward(0);
  g.scale(f.c.view(), 0.5f);
  g.scale(f.c.view(), 0.5f);
  h.pre_backward(0);
  g.add(f.c.view(), f.c.view(), f.c.view());
  h.post_backward(0);
  ASSERT_EQ(probe.seen.size(), 4u);
  EXPECT_EQ(probe.seen[0], (std::vector<float>{10.5f, 13.f, 24.5f, 29.f}));
  EXPECT_EQ(probe.seen[1], (std::vector<float>{42.f, 52.f, 98.f, 116.f}));
  EXPECT_EQ(probe.seen[2], (std::vector<float>{10.5f, 13.f, 24.5f, 29.f}));
  EXPECT_EQ(probe.seen[3], (std::vector<float>{21.f, 26.f, 49.f, 58.f}));
}

TEST(GraphedKernels, OneCallSegmentsStayEagerAndEvictionKeepsResultsRight) {
  Fixture f;
  GraphedKernels one(*f.be);
  for (int i = 0; i < 3; ++i) {
    one.scale(f.c.view(), 1.f);
    one.flush();
  }
  expect_stats(one.stats(), 3, 0, 0, "one-call segments");

  GraphedKernels g(*f.be, GraphedKernels::Options{2, 1});  // one graph at most
  for (int i = 0; i < 3; ++i) {
    for (const DeviceBuffer* out : {&f.c, &f.d}) {
      f.be->fill_zero(out->view());
      f.segment(g, *out, 0.5f);
      g.flush();
      EXPECT_EQ(f.read(*out), (std::vector<float>{10.5f, 13.f, 24.5f, 29.f})) << i;
    }
  }
  // pass 1: c and d eager; pass 2: c captured, d captured (evicting c); pass 3: c eager (its
  // sighting was spent on the capture), d replayed.
  expect_stats(g.stats(), 3, 2, 1, "alternating records, one graph");
  EXPECT_EQ(g.stats().evictions, 1);
  EXPECT_EQ(g.graphs(), 1);
}

// A backend whose capture fails (here a GraphedKernels, whose capture_graph throws): the
// failure is reported once, that segment and every later one run eagerly, results stay right.
TEST(GraphedKernels, AFailedCaptureFallsBackToEagerOnce) {
  Fixture f;
  GraphedKernels refusing(*f.be);  // runs what it is given at its own flush()
  std::vector<std::string> told;
  GraphedKernels::Options o;
  o.on_capture_failure = [&](const std::string& why) { told.push_back(why); };
  GraphedKernels g(refusing, o);
  for (int i = 0; i < 3; ++i) {
    f.be->fill_zero(f.c.view());
    f.segment(g, f.c, 0.5f);
    g.flush();
    refusing.flush();
    EXPECT_EQ(f.read(f.c), (std::vector<float>{10.5f, 13.f, 24.5f, 29.f})) << i;
  }
  expect_stats(g.stats(), 3, 0, 0, "capture refused at the second sighting");
  EXPECT_TRUE(g.stats().capture_failed);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_NE(told[0].find("captured by the backend it wraps"), std::string::npos) << told[0];
}

// Each call with a default body in Kernels (a pair of other calls) is one recorded call, so
// the backend's own version of it (a cuBLASLt epilogue on CUDA) is what runs and is captured.
TEST(GraphedKernels, CallsWithDefaultBodiesAreRecordedWhole) {
  Fixture f;
  GraphedKernels g(*f.be);
  const TensorView A = f.a.view({2, 2}), B = f.b.view({2, 2}), C = f.c.view({2, 2});
  const TensorView D = f.d.view({2, 2}), bias = f.a.view().slice(0, 2);
  int64_t calls = 0;
  auto one_call = [&](const char* what) {
    EXPECT_EQ(g.stats().calls, calls + 1) << what;
    calls = g.stats().calls;
  };
  g.gemm_bias(false, false, 2, 2, 2, A, B, bias, C);
  one_call("gemm_bias");
  g.gemm_bias_gelu(false, false, 2, 2, 2, A, B, bias, C, D);
  one_call("gemm_bias_gelu");
  g.gemm_dgelu_bias_grad(false, false, 2, 2, 2, A, B, C, D, f.b.view().slice(0, 2));
  one_call("gemm_dgelu_bias_grad");
  g.gemm_weight_bias_grad(false, 2, 2, 2, A, B, C, f.b.view().slice(0, 2));
  one_call("gemm_weight_bias_grad");
  g.gemm_relu(false, false, 2, 2, 2, A, B, C);
  one_call("gemm_relu");
  g.flush();
  EXPECT_THROW(g.capture_graph([] {}), fsdp::Error);
}

// min_graphed: the fraction of the calls graphed at least (MoE: its experts' row counts change
// every step, so the expert segments record anew and run eagerly).
void expect_same_run(const TrainResult& on, const TrainResult& off, const std::string& what,
                     double min_graphed = 0.4) {
  ASSERT_EQ(on.losses.size(), off.losses.size()) << what;
  EXPECT_EQ(on.losses, off.losses) << what;
  EXPECT_EQ(on.val_losses, off.val_losses) << what;
  for (const auto& [name, values] : off.params) {
    EXPECT_EQ(on.params.at(name), values) << what << " " << name;
  }
  EXPECT_GT(on.graphs.replays, 0) << what;
  // 6 steps of two micro-batches: each segment's first sighting runs eagerly, its second is
  // captured; with CPU offload, units come back in a few different blocks.
  EXPECT_GE(static_cast<double>(on.graphs.graphed_calls),
            min_graphed * static_cast<double>(on.graphs.calls))
      << what;
  EXPECT_EQ(off.graphs.calls, 0) << what;
}

Config graphed(Config c, const std::string& name, bool on) {
  c.train.cuda_graphs = on ? fsdp::CudaGraphs::on : fsdp::CudaGraphs::off;
  c.train.run_dir = fresh_dir("graphs_" + name + (on ? "_on" : "_off"));
  c.train.max_steps = 6;
  c.eval.every = 3;
  return c;
}

TEST(CudaGraphsCpuTwin, GraphedTrainingEqualsEagerBitForBit) {
  const int world = world_size();
  auto sharded = [&](Config c) {
    c.fsdp.sharding_strategy = fsdp::ShardingStrategy::FULL_SHARD;
    c.train.micro_batch_size = c.train.global_batch_size / world / 2;  // two micro-batches
    return c;
  };
  const std::vector<std::pair<std::string, Config>> models = {
      {"gpt2", sharded(small_config(""))},
      {"t5", sharded(t5_config(""))},
      {"llama", sharded(llama_config("", {"mixed_precision.param_dtype=\"bf16\""}))},
      // the attention's and the loss's soft-caps among the recorded arguments
      {"gemma2_softcaps",
       sharded(llama_config("", {"model.type=\"gemma2\"", "model.sliding_window=5",
                                 "model.attn_logit_softcapping=2.0",
                                 "model.final_logit_softcapping=5.0"}))},
      // mixture of experts: the routing's copy to the host ends its segment; the segments
      // whose expert row counts change between steps record anew (eager), never replay stale
      {"qwen3_moe_aux",
       sharded(llama_config("", {"model.type=\"qwen3_moe\"", "model.num_experts=4",
                                 "model.num_experts_per_tok=2", "model.moe_intermediate_size=12",
                                 "model.output_router_logits=true",
                                 "model.router_aux_loss_coef=0.1"}))},
      // GLM-4.5: a dense layer 0 before the sparse ones; the sigmoid router's groups and
      // scale among the recorded arguments
      {"glm4_moe_groups",
       sharded(llama_config("", {"model.type=\"glm4_moe\"", "model.n_routed_experts=6",
                                 "model.num_experts_per_tok=2", "model.moe_intermediate_size=12",
                                 "model.n_group=3", "model.topk_group=2",
                                 "model.routed_scaling_factor=1.5", "model.num_hidden_layers=3",
                                 "mixed_precision.param_dtype=\"bf16\""}))},
      // DeepSeek-V3: MLA's strided copies among the recorded calls
      {"deepseek_v3_mla",
       sharded(llama_config("", {"model.type=\"deepseek_v3\"", "model.n_routed_experts=4",
                                 "model.num_experts_per_tok=2", "model.moe_intermediate_size=12",
                                 "model.n_group=1", "model.topk_group=1", "model.q_lora_rank=6",
                                 "model.kv_lora_rank=8", "model.qk_nope_head_dim=4",
                                 "model.qk_rope_head_dim=4", "model.v_head_dim=6",
                                 "model.num_key_value_heads=4"}))},
      // gpt-oss: the sinks' and the clamped SwiGLU's kernels, the packed experts' GEMMs
      {"gpt_oss_sinks",
       sharded(llama_config("", {"model.type=\"gpt_oss\"", "model.num_local_experts=4",
                                 "model.num_experts_per_tok=2", "model.sliding_window=5",
                                 "mixed_precision.param_dtype=\"bf16\""}))},
      // Llama 4: chunked attention calls, the temperature table, input-scaled routing
      {"llama4_chunks",
       sharded(llama_config("", {"model.type=\"llama4_text\"", "model.num_local_experts=4",
                                 "model.intermediate_size_mlp=40",
                                 "model.interleave_moe_layer_step=2",
                                 "model.no_rope_layer_interval=2", "model.attention_chunk_size=5",
                                 "model.floor_scale=4"}))},
      // document masking with reset positions (Gemma 3: two RoPE tables gathered per token):
      // the documents' uploads between the segments, their buffers among the arguments
      {"gemma3_documents",
       sharded(llama_config("", {"model.type=\"gemma3_text\"", "model.sliding_window=5",
                                 "data.attn_mask_type=\"block_causal\"",
                                 "data.reset_position_ids=true", "data.eos_token_id=32"}))},
      // Llama 4's: one call a layer with the chunks' starts in the documents'
      {"llama4_documents",
       sharded(llama_config("", {"model.type=\"llama4_text\"", "model.num_local_experts=4",
                                 "model.intermediate_size_mlp=40",
                                 "model.interleave_moe_layer_step=2",
                                 "model.no_rope_layer_interval=2", "model.attention_chunk_size=5",
                                 "model.floor_scale=4", "data.attn_mask_type=\"block_causal\"",
                                 "data.eos_token_id=32"}))},
      // GPT-2's: wpe read at the documents' positions (two lookups and an add)
      {"gpt2_documents",
       sharded(small_run(kSmallGpt2, "", {"data.attn_mask_type=\"block_causal\"",
                                          "data.reset_position_ids=true",
                                          "data.eos_token_id=32"}))},
      // every block recomputed in backward, the optimizer on the host
      {"gpt2_recompute_offload",
       sharded(small_run(kSmallGpt2, "", {"fsdp.activation_checkpointing=true",
                                          "fsdp.cpu_offload=true"}))},
      // the loss over vocabulary chunks; only the first of 3 layers recomputing (into the set
      // the second keeps; the third has its own)
      {"llama_fused_ce_recompute_first",
       sharded(llama_config("", {"model.fused_linear_cross_entropy=true",
                                 "model.fused_linear_cross_entropy_chunk_rows=8",
                                 "model.num_hidden_layers=3", "fsdp.activation_checkpointing=true",
                                 "fsdp.recompute_num_layers=1"}))},
  };
  for (const auto& [name, c] : models) {
    const TrainResult off = run(graphed(c, name, false), On::world);
    const TrainResult on = run(graphed(c, name, true), On::world);
    expect_same_run(on, off, name + " at " + std::to_string(world) + " ranks",
                    name.rfind("qwen3_moe", 0) == 0 || name.rfind("glm4_moe", 0) == 0 ||
                            name.rfind("deepseek_v3", 0) == 0 || name.rfind("gpt_oss", 0) == 0 ||
                            name.rfind("llama4", 0) == 0
                        ? 0.2
                        : 0.4);
  }
}

// Stopped after step 3 with graphs on and resumed with them: the checkpoint and the resumed
// steps equal an eager run's bit for bit (graphs change nothing a checkpoint holds). Five
// resumed steps: a fresh model's first step allocates its blocks (its records may be its
// own), the next is seen once, the one after captured, so replays start by the fourth.
TEST(CudaGraphsCpuTwin, ResumedGraphedRunEqualsAnEagerRun) {
  Config c = small_config("");
  c.train.max_steps = 8;
  c.checkpoint.every = 3;
  c.train.cuda_graphs = fsdp::CudaGraphs::off;
  c.train.run_dir = fresh_dir("graphs_resume_eager");
  const TrainResult eager = run(c, On::world);
  c.train.cuda_graphs = fsdp::CudaGraphs::on;
  c.train.run_dir = fresh_dir("graphs_resume_graphed");
  run(c, On::world, /*stop_after=*/3);
  const TrainResult resumed = run(c, On::world, 0, /*resume=*/true);
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses[i], eager.losses[i + 3]) << "step " << i + 4;
  for (const auto& [name, values] : eager.params) {
    EXPECT_EQ(resumed.params.at(name), values) << name;
  }
  EXPECT_GT(resumed.graphs.replays, 0);
}

}  // namespace
