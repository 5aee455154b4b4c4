// Tensor-core alignment of every GEMM of a training step (issue 20): with bf16 activations,
// each of M, N, K and the leading dimensions lda, ldb, ldc must be a multiple of 8 (16 bytes),
// or cuBLAS(Lt) falls back to slower kernels. A model's GEMMs are recorded by running one
// training micro-batch (forward, loss, backward) of the full-size model on GemmRecorder, a
// kernel set that computes nothing and keeps the shape and dtypes of each gemm(), over the
// memory plan's CountingRuntime (fsdp/backend/counting_runtime.hpp), through hooks that hand
// out fake parameter views: the GPT-2 124M shape costs milliseconds.
//  - GPT-2 124M (768 wide, 12 heads of 64, vocab 50257) and GPT-2 1.5B (1600 wide, 25 heads of
//    64) with the default model.pad_vocab_multiple = 128 (50257 -> 50304): no misaligned GEMM;
//    with pad_vocab_multiple = 1 the three LM-head GEMMs are listed (so the check can fail);
//  - t5-small (inputs/t5_small.toml: d_model 512, d_kv 64, d_ff 2048, 8 heads, 6 + 6 blocks,
//    tied) with its ByT5 vocabulary 384, the published 32128, and the SentencePiece size 32100
//    (-> 32128 with pad 128), and ByT5-small (1472 wide, gated-gelu, untied): none misaligned
//    with pad 128; 32100 unpadded lists the LM-head GEMMs.
// Batch rows are a multiple of 8 here (micro-batch x sequence length); the token counts of a
// real run are the data config's, not the model's, and are not checked.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/backend/counting_runtime.hpp"
#include "fsdp/backend/kernels.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/model/model.hpp"

namespace {

using fsdp::DType;
using fsdp::ModelConfig;
using fsdp::TensorView;

// One Kernels::gemm call: C[M,N] = op(A)[M,K] @ op(B)[K,N], row-major as Kernels::gemm
// stores its operands, with the leading dimensions (row strides) that follow.
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  DType a = DType::f32, b = DType::f32, c = DType::f32;
  int64_t lda() const { return trans_a ? M : K; }  // A stored [K,M] if trans_a, else [M,K]
  int64_t ldb() const { return trans_b ? K : N; }  // B stored [N,K] if trans_b, else [K,N]
  int64_t ldc() const { return N; }                // C [M,N]
  // Any operand stored in 16 bits (bf16, fp16): what tensor cores run.
  bool sixteen_bit() const {
    auto half = [](DType t) { return t == DType::bf16 || t == DType::f16; };
    return half(a) || half(b) || half(c);
  }
};

// "gemm(trans_a=0, trans_b=1, M=1024, N=50257, K=768, lda=768, ldb=768, ldc=50257, bf16 x bf16 -> bf16)"
std::string to_string(const GemmCall& g) {
  std::ostringstream os;
  os << "gemm(trans_a=" << g.trans_a << ", trans_b=" << g.trans_b << ", M=" << g.M << ", N=" << g.N
     << ", K=" << g.K << ", lda=" << g.lda() << ", ldb=" << g.ldb() << ", ldc=" << g.ldc() << ", "
     << fsdp::to_string(g.a) << " x " << fsdp::to_string(g.b) << " -> " << fsdp::to_string(g.c) << ")";
  return os.str();
}

// The calls among `gemms` with a 16-bit operand and any of M, N, K, lda, ldb, ldc not a
// multiple of `multiple` (8: 16 bytes of bf16/fp16, the alignment cuBLAS(Lt) needs for its
// tensor-core kernels, NVIDIA's "Matrix Multiplication Background" guide), in call order.
std::vector<GemmCall> misaligned_gemms(const std::vector<GemmCall>& gemms, int64_t multiple = 8) {
  std::vector<GemmCall> out;
  for (const GemmCall& g : gemms) {
    if (!g.sixteen_bit()) continue;
    for (int64_t d : {g.M, g.N, g.K, g.lda(), g.ldb(), g.ldc()}) {
      if (d % multiple != 0) {
        out.push_back(g);
        break;
      }
    }
  }
  return out;
}

// Kernels that compute nothing and record every gemm() call, on a CountingRuntime.
class GemmRecorder final : public fsdp::Kernels {
 public:
  const std::vector<GemmCall>& gemms() const { return gemms_; }

  fsdp::DeviceRuntime& runtime() override { return runtime_; }
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float, const TensorView& A,
            const TensorView& B, float, const TensorView& C) override {
    gemms_.push_back({trans_a, trans_b, M, N, K, A.dtype, B.dtype, C.dtype});
  }
  void add_bias(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void bias_backward(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void add(const TensorView&, const TensorView&, const TensorView&) override {}
  void scale(const TensorView&, float) override {}
  void embedding_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         int64_t, int64_t, int64_t) override {}
  void embedding_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          int64_t, int64_t, int64_t) override {}
  void layernorm_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&, int64_t, int64_t, float) override {}
  void layernorm_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          int64_t, int64_t) override {}
  void add_bias_residual(const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t) override {}
  void add_layernorm_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                             int64_t, int64_t, float) override {}
  void add_rmsnorm_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, const TensorView&, int64_t, int64_t, float) override {}
  void gelu_forward(const TensorView&, const TensorView&) override {}
  void gelu_backward(const TensorView&, const TensorView&, const TensorView&) override {}
  void bias_gelu_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t) override {}
  void gelu_bias_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          int64_t, int64_t) override {}
  void attention_forward(const TensorView&, const TensorView&, const TensorView&, int64_t, int64_t,
                         int64_t, int64_t, const TensorView&) override {}
  void attention_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, int64_t, int64_t, int64_t, int64_t,
                          const TensorView&) override {}
  void cross_entropy_forward_backward(const TensorView&, const TensorView&, const TensorView&,
                                      int64_t, int64_t, int64_t, float, float) override {}
  void cross_entropy_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t, int64_t, float) override {}
  void embedding_lookup_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                                int64_t) override {}
  void embedding_lookup_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                                 int64_t) override {}
  void rmsnorm_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                       int64_t, int64_t, float) override {}
  void rmsnorm_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void relu_forward(const TensorView&, const TensorView&) override {}
  void relu_backward(const TensorView&, const TensorView&, const TensorView&) override {}
  void mul(const TensorView&, const TensorView&, const TensorView&) override {}
  void geglu_forward(const TensorView&, const TensorView&, const TensorView&) override {}
  void geglu_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                      const TensorView&) override {}
  void position_bias_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t, int64_t) override {}
  void position_bias_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                              int64_t, int64_t) override {}
  void mha_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                   const TensorView&, const TensorView&, const TensorView&, int64_t, int64_t,
                   int64_t, int64_t, int64_t, float, bool) override {}
  void mha_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    int64_t, int64_t, int64_t, int64_t, int64_t, float, bool) override {}
  void rope_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    int64_t, int64_t, int64_t, int64_t, int64_t) override {}
  void rope_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                     int64_t, int64_t, int64_t, int64_t, int64_t) override {}
  void swiglu_forward(const TensorView&, const TensorView&, const TensorView&) override {}
  void swiglu_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                       const TensorView&) override {}
  void gqa_attention_forward(const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&, int64_t, int64_t, int64_t,
                             int64_t, int64_t, float, int64_t, float,
                             const TensorView&) override {}
  void gqa_attention_backward(const TensorView&, const TensorView&, const TensorView&,
                              const TensorView&, const TensorView&, const TensorView&,
                              const TensorView&, const TensorView&, const TensorView&, int64_t,
                              int64_t, int64_t, int64_t, int64_t, float, int64_t, float,
                              const TensorView&) override {}
  void moe_router_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                          int64_t, int64_t, bool) override {}
  void moe_router_backward(const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, int64_t, int64_t, int64_t, bool) override {}
  void strided_copy(const TensorView&, const Strided&, const TensorView&, const Strided&,
                    int64_t, int64_t, int64_t, bool) override {}
  void causal_conv1d_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t, int64_t, int64_t, const TensorView&) override {}
  void causal_conv1d_backward(const TensorView&, const TensorView&, const TensorView&,
                              const TensorView&, const TensorView&, int64_t, int64_t, int64_t,
                              int64_t, const TensorView&) override {}
  void gated_delta_rule_forward(const TensorView&, const TensorView&, const TensorView&,
                                const TensorView&, const TensorView&, const TensorView&, int64_t,
                                int64_t, int64_t, int64_t, int64_t, int64_t,
                                const TensorView&) override {}
  void gated_delta_rule_backward(const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, const TensorView&, int64_t, int64_t, int64_t,
                                 int64_t, int64_t, int64_t, const TensorView&) override {}
  void sigmoid_gate_forward(const TensorView&, const TensorView&, const TensorView&) override {}
  void sigmoid_gate_backward(const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&) override {}
  void clamped_swiglu_forward(const TensorView&, const TensorView&, float, float) override {}
  void clamped_swiglu_backward(const TensorView&, const TensorView&, const TensorView&, float,
                               float) override {}
  void attention_sink_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                              int64_t, int64_t, int64_t) override {}
  void attention_sink_backward(const TensorView&, const TensorView&, const TensorView&,
                               const TensorView&, const TensorView&, int64_t, int64_t, int64_t,
                               int64_t) override {}
  void moe_sigmoid_router_forward(const TensorView&, const TensorView&, const TensorView&,
                                  const TensorView&, int64_t, int64_t, int64_t,
                                  const SigmoidRouting&) override {}
  void moe_sigmoid_router_backward(const TensorView&, const TensorView&, const TensorView&,
                                   const TensorView&, int64_t, int64_t, int64_t,
                                   const SigmoidRouting&) override {}
  void moe_combine_forward(const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, int64_t, int64_t, int64_t) override {}
  void moe_combine_backward(const TensorView&, const TensorView&, const TensorView&,
                            const TensorView&, const TensorView&, const TensorView&, int64_t,
                            int64_t, int64_t) override {}
  void moe_router_prob_sums(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void moe_aux_loss(const TensorView&, const TensorView&, const TensorView&, int64_t,
                    double) override {}
  void moe_aux_loss_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t) override {}
  void moe_shared_gate_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                               int64_t) override {}
  void moe_shared_gate_backward(const TensorView&, const TensorView&, const TensorView&,
                                const TensorView&, const TensorView&, int64_t, int64_t) override {}

 private:
  fsdp::CountingRuntime runtime_;
  std::vector<GemmCall> gemms_;
};

// Parameter and gradient views at fake addresses (the GemmRecorder reads nothing).
class FakeHooks final : public fsdp::ModuleHooks {
 public:
  FakeHooks(const std::vector<fsdp::ModuleDecl>& modules, DType dtype) : dtype_(dtype) {
    for (const auto& m : modules)
      for (const auto& p : m.params) numel_.push_back(p.numel());
  }
  void pre_forward(int) override {}
  void post_forward(int) override {}
  void pre_backward(int) override {}
  void post_backward(int) override {}
  fsdp::TensorView param(int p) override { return view(p); }
  fsdp::TensorView grad(int p) override { return view(p); }
  bool training() const override { return true; }

 private:
  fsdp::TensorView view(int p) const {
    return {reinterpret_cast<void*>(std::uintptr_t{1} << 40), dtype_, {numel_.at(static_cast<std::size_t>(p))}};
  }
  DType dtype_;
  std::vector<int64_t> numel_;
};

// Every GEMM of one bf16 training micro-batch of `config`'s model on [B, L] inputs and
// [B, target_len] targets (target_len = L for a decoder-only model).
std::vector<GemmCall> step_gemms(const ModelConfig& config, int64_t B, int64_t L, int64_t target_len) {
  GemmRecorder kernels;
  const fsdp::ModelFamily& family = fsdp::model_family(config.type);
  auto model = family.create(config, kernels, DType::bf16, false);
  FakeHooks hooks(model->modules(), DType::bf16);
  fsdp::data::Batch batch;
  batch.B = B;
  batch.L = L;
  batch.target_len = target_len;
  batch.inputs.assign(static_cast<std::size_t>(B * L), 5);
  batch.targets.assign(static_cast<std::size_t>(B * target_len), 7);
  const fsdp::TensorView loss(reinterpret_cast<void*>(std::uintptr_t{1} << 41), DType::f64, {1});
  model->forward_backward(batch, 1.0f, hooks, loss);
  return kernels.gemms();
}

std::string listing(const std::vector<GemmCall>& gemms) {
  std::string s;
  for (const GemmCall& g : gemms) s += "\n  " + to_string(g);
  return s;
}

ModelConfig gpt2(int64_t layers, int64_t heads, int64_t width, int64_t pad) {
  ModelConfig c = fsdp::model_defaults("gpt2");
  c.set("n_layer", layers);
  c.set("n_head", heads);
  c.set("n_embd", width);
  c.set("n_positions", int64_t{1024});
  c.set("vocab_size", int64_t{50257});
  c.pad_vocab_multiple = pad;
  return c;
}

ModelConfig t5(int64_t vocab, int64_t pad) {
  // inputs/t5_small.toml's model.
  const fsdp::Config c = fsdp::load_config(std::string(FSDP_SOURCE_DIR) + "/inputs/t5_small.toml", {});
  ModelConfig m = c.model;
  m.set("vocab_size", vocab);
  m.pad_vocab_multiple = pad;
  return m;
}

TEST(GemmAlignment, Gpt2ShapesArePaddedToMultiplesOf8) {
  struct Case {
    const char* name;
    int64_t layers, heads, width;
  };
  for (const Case& k : {Case{"GPT-2 124M", 12, 12, 768}, Case{"GPT-2 1.5B", 48, 25, 1600}}) {
    const std::vector<GemmCall> gemms = step_gemms(gpt2(k.layers, k.heads, k.width, 128), 4, 1024, 1024);
    // Per block c_attn, attn.c_proj, c_fc and mlp.c_proj forward, and their d input and
    // d weight (12); the LM head's logits, d wte and d ln_f output (3).
    EXPECT_EQ(gemms.size(), static_cast<std::size_t>(12 * k.layers + 3)) << k.name;
    const auto bad = misaligned_gemms(gemms);
    EXPECT_TRUE(bad.empty()) << k.name << " pad 128:" << listing(bad);
    bool lm_head = false;  // the LM head runs at the padded width 50304
    for (const GemmCall& g : gemms) lm_head = lm_head || g.N == 50304 || g.M == 50304 || g.K == 50304;
    EXPECT_TRUE(lm_head) << k.name;

    // Unpadded, 50257 misaligns exactly the LM head: logits, d wte, d ln_f output.
    const auto unpadded = misaligned_gemms(step_gemms(gpt2(k.layers, k.heads, k.width, 1), 4, 1024, 1024));
    ASSERT_EQ(unpadded.size(), 3u) << k.name << listing(unpadded);
    for (const GemmCall& g : unpadded) {
      EXPECT_TRUE(g.N == 50257 || g.M == 50257 || g.K == 50257) << to_string(g);
    }
  }
}

TEST(GemmAlignment, T5SmallShapesArePaddedToMultiplesOf8) {
  // micro_batch_size 32 of inputs/t5_small.toml, max_input_len 512, max_target_len 64.
  for (int64_t vocab : {int64_t{384}, int64_t{32128}, int64_t{32100}}) {
    const std::vector<GemmCall> gemms = step_gemms(t5(vocab, 128), 32, 512, 64);
    EXPECT_GT(gemms.size(), 100u);
    const auto bad = misaligned_gemms(gemms);
    EXPECT_TRUE(bad.empty()) << "t5-small vocab " << vocab << " pad 128:" << listing(bad);
  }
  const auto unpadded = misaligned_gemms(step_gemms(t5(32100, 1), 32, 512, 64));
  ASSERT_EQ(unpadded.size(), 3u) << listing(unpadded);

  // ByT5-small (google/byt5-small: d_model 1472, d_ff 3584, 6 heads of 64, gated-gelu,
  // untied LM head, 12 + 4 blocks, vocab 384).
  ModelConfig byt5 = t5(384, 128);
  byt5.set("d_model", int64_t{1472});
  byt5.set("d_ff", int64_t{3584});
  byt5.set("num_heads", int64_t{6});
  byt5.set("num_layers", int64_t{12});
  byt5.set("num_decoder_layers", int64_t{4});
  byt5.set("feed_forward_proj", std::string("gated-gelu"));
  byt5.set("tie_word_embeddings", false);
  const auto bad = misaligned_gemms(step_gemms(byt5, 8, 1024, 192));
  EXPECT_TRUE(bad.empty()) << "byt5-small:" << listing(bad);
}

TEST(GemmAlignment, MisalignedGemmsListsOnly16BitCallsWithAnOddDimension) {
  const std::vector<GemmCall> calls = {
      {false, true, 64, 50257, 768, DType::bf16, DType::bf16, DType::bf16},  // N odd
      {false, true, 64, 50257, 768, DType::f32, DType::f32, DType::f32},     // fp32: no tensor-core rule
      {true, false, 50304, 768, 64, DType::bf16, DType::bf16, DType::f32},   // aligned
      {false, false, 64, 768, 36, DType::f16, DType::f16, DType::f16},       // K = lda = 36
  };
  const auto bad = misaligned_gemms(calls);
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(bad[0].N, 50257);
  EXPECT_EQ(bad[1].K, 36);
  EXPECT_EQ(bad[1].lda(), 36);
  EXPECT_EQ(to_string(calls[0]),
            "gemm(trans_a=0, trans_b=1, M=64, N=50257, K=768, lda=768, ldb=768, ldc=50257, bf16 x bf16 -> bf16)");
}

}  // namespace
