// model.fused_linear_cross_entropy (issue 32 item 3; Liger-Kernel's fused linear
// cross-entropy): the causal LMs' LM head and cross-entropy over chunks of rows, no
// [tokens, vocabulary] logits kept. Run by ctest under mpirun at 1 and 2 ranks.
//  - GPT-2 and Llama (tied and untied), fp32 and bf16 activations, one rank and the world,
//    chunk sizes that divide B*T and do not, 1, B*T, more than B*T and auto: the training
//    loss and the evaluation loss equal the unfused head's (the row losses are the same; only
//    the fp64 sum is regrouped by chunk), every unit's gradient shard equals the unfused one
//    except the LM-head weight's, which is close (its sum over rows is split by chunk), and
//    the activations measured equal the activation table, (B*T - chunk) * Vp elements below
//    the unfused model's;
//  - last_logits() throws, naming the key;
//  - through the trainer (GPT-2 and Llama, FULL_SHARD, fp32 and bf16): a few steps' losses,
//    the validation loss and the final parameters close to the unfused run's, the memory
//    plan equal to the measured peak category by category, and the planned activations
//    lower by exactly the logits rows the chunk drops;
//  - the keys parse (--set), reject a negative chunk, and T5 refuses the key.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/model/gpt2.hpp"
#include "fsdp/model/llama.hpp"
#include "model_fixture.hpp"
#include "train_util.hpp"

namespace {

using fsdp::DType;
using fsdp::MemCategory;
using namespace test_util;

constexpr int64_t kB = 2, kT = 6, kBT = kB * kT;

fsdp::Gpt2Config tiny_gpt2() {
  fsdp::Gpt2Config m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 16;
  m.n_positions = 8;
  m.vocab_size = 200;  // padded to 256: the padding columns take part in every chunk
  return m;
}

fsdp::LlamaConfig tiny_llama(bool tied) {
  fsdp::LlamaConfig m;
  m.num_hidden_layers = 2;
  m.hidden_size = 16;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.intermediate_size = 24;
  m.max_position_embeddings = 8;
  m.vocab_size = 100;  // padded to 128
  m.tie_word_embeddings = tied;
  return m;
}

fsdp::FsdpConfig wrap(const char* cls) {
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {cls};
  return fc;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every element of this rank's shards += N(0, 0.3): logits well away from uniform, so the
// cross-entropy's gradient is not tiny.
template <class F>
void perturb_shards(F& f) {
  std::mt19937 gen(7u + static_cast<unsigned>(f.comm.rank()));
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (int64_t i = 0; i < f.engine.shard_numel(u); ++i) p[i] += nd(gen);
  }
}

// Chunk rows to try for B*T = 12: 1, dividing (4), not dividing (5), B*T, more than B*T, and
// 0 = auto (one chunk here: the auto chunk is at least 256 rows).
const int64_t kChunks[] = {1, 4, 5, kBT, 100, 0};

// Tolerances, measured and justified. The chunked head computes each row's logits and dx
// with a GEMM over its chunk of rows instead of all of them: the same dot products, but
// whether a BLAS sums a row the same way for any number of rows in the call is its own
// choice. OpenBLAS's SkylakeX sgemm kernels do (every check below was then bit-equal but the
// head weight's gradient); its Haswell/Zen kernels, which 0.3.21 picks on AMD CPUs, AVX-512
// ones included, do not (each fp32 row within a few ulps).
//  - loss: a reassociated dot product of C = 16 terms per logit, at most ~C * 2^-24 = 9.5e-7
//    relative, then the per-chunk fp64 sums (~12 * 2^-53); measured on an AMD EPYC with
//    Haswell kernels: fp32 8.9e-9, bf16 1.7e-16 (its rounding to bf16 absorbs it): 1e-6;
//  - the head weight's gradient: dW = sum over rows of dlogits^T x becomes a sum over chunks
//    of such sums (beta = 1). fp32: a reassociation of at most 12 fp32 terms, ~R * 2^-24
//    (measured: 3.3e-7 at most): 1e-6; bf16: each chunk's sum is added into the bf16
//    gradient buffer, one bf16 rounding (2^-9 relative) per chunk, as Liger's torch.addmm
//    into grad_weight (measured: 3.8e-3 at most, at chunk 1): 1e-2;
//  - every gradient below the head: the same dx rows up to that GEMM's order (a dot product
//    over the 256 padded vocabulary columns, ~V * 2^-24 = 1.5e-5 at worst) and what the
//    backward makes of them. Measured: fp32 3.8e-7, bf16 0 (bit-equal with SkylakeX's
//    kernels): fp32 1e-5; bf16 1e-2, one bf16 rounding flipped per element at most.
double loss_tol(DType) { return 1e-6; }
double head_grad_tol(DType d) { return d == DType::f32 ? 1e-6 : 1e-2; }
double below_head_tol(DType d) { return d == DType::f32 ? 1e-5 : 1e-2; }

// Model-level check of one family: `off` and `on` fixtures from the same options but the key.
// `head_unit`: the FSDP unit holding the LM-head weight; C: the hidden size.
template <class Model, class Cfg>
void expect_chunked_head_equals_unfused(const Cfg& model, int64_t C, const fsdp::FsdpConfig& fc,
                                        int head_unit, const std::string& family) {
  using Fixture = CausalLmFixture<Model, Cfg>;
  struct {
    double loss_f32 = 0, loss_bf16 = 0, head_f32 = 0, head_bf16 = 0, below_f32 = 0, below_bf16 = 0;
  } worst;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (MPI_Comm comm : {MPI_COMM_SELF, MPI_COMM_WORLD}) {
      for (int64_t chunk : kChunks) {
        const std::string what = family + " " + std::string(fsdp::to_string(dtype)) +
                                 (comm == MPI_COMM_SELF ? " one rank" : " world") + " chunk " +
                                 std::to_string(chunk);
        CausalLmOptions<Cfg> o;
        o.model = model;
        o.mp.param_dtype = dtype;
        o.comm = comm;
        o.B = kB;
        o.T = kT;
        const Cfg plain = model;
        Fixture off(o, fc);
        o.model.fused_lce = {true, chunk};
        Fixture on(o, fc);
        perturb_shards(off);
        perturb_shards(on);
        for (int step = 0; step < 2; ++step) {  // the second pass reuses the buffers
          const double loss_off = off.loss_and_grads(), loss_on = on.loss_and_grads();
          ASSERT_TRUE(std::isfinite(loss_off)) << what;
          EXPECT_NEAR(loss_on, loss_off, loss_tol(dtype) * std::abs(loss_off)) << what;
          double& wl = dtype == DType::f32 ? worst.loss_f32 : worst.loss_bf16;
          wl = std::max(wl, std::abs(loss_on - loss_off) / std::abs(loss_off));
          for (int u = 0; u < off.engine.num_units(); ++u) {
            const int64_t n = off.engine.shard_numel(u);
            const float* a = off.engine.shard_grad(u).f32();
            const float* b = on.engine.shard_grad(u).f32();
            const std::vector<float> va(a, a + n), vb(b, b + n);
            if (u == head_unit) {
              const double d = rel_diff(vb, va);
              EXPECT_LE(d, head_grad_tol(dtype)) << what << ": unit " << u;
              double& w = dtype == DType::f32 ? worst.head_f32 : worst.head_bf16;
              w = std::max(w, d);
            } else {
              // Below the head, the same dx rows (dlogits @ W per row) up to the GEMM's
              // summation order, and what follows from them.
              const double d = rel_diff(vb, va);
              EXPECT_LE(d, below_head_tol(dtype)) << what << ": unit " << u;
              double& w = dtype == DType::f32 ? worst.below_f32 : worst.below_bf16;
              w = std::max(w, d);
            }
          }
          EXPECT_NEAR(on.loss(), off.loss(), loss_tol(dtype) * std::abs(loss_off)) << what << " eval";
        }
        // The activation table follows the key, and is what was allocated.
        const int64_t Vp = model.padded_vocab();
        const int64_t rows = o.model.fused_lce.chunk_for(kBT, C, Vp);
        const int64_t want_off = Model::activation_bytes(plain, kB, kT, dtype, false);
        const int64_t want_on = Model::activation_bytes(o.model, kB, kT, dtype, false);
        EXPECT_EQ(static_cast<int64_t>(off.be->memory().peak(MemCategory::activations)), want_off)
            << what;
        EXPECT_EQ(static_cast<int64_t>(on.be->memory().peak(MemCategory::activations)), want_on)
            << what;
        EXPECT_EQ(want_off - want_on,
                  (kBT - rows) * Vp * static_cast<int64_t>(fsdp::dtype_size(dtype)))
            << what;
        EXPECT_THROW(on.model.last_logits(), fsdp::Error) << what;
        EXPECT_NO_THROW(off.model.last_logits()) << what;
      }
    }
  }
  if (world_rank() == 0) {
    std::printf("%s: largest relative differences to the unfused head, fp32 / bf16: loss %.3g / "
                "%.3g, head weight gradient %.3g / %.3g, the gradients below it %.3g / %.3g\n",
                family.c_str(), worst.loss_f32, worst.loss_bf16, worst.head_f32, worst.head_bf16,
                worst.below_f32, worst.below_bf16);
  }
}

TEST(FusedLinearCrossEntropy, AutoChunkIsLigersHeuristicWithAFloor) {
  const fsdp::FusedLinearCrossEntropy auto_rows{true, 0};
  // Llama 3 8B at 1 x 8192: ceil(128256 / 4096) = 32, 8192 / 32 = 256 rows.
  EXPECT_EQ(auto_rows.chunk_for(8192, 4096, 128256), 256);
  // Llama 3 8B at 8 x 8192: 65536 / 32 = 2048 rows.
  EXPECT_EQ(auto_rows.chunk_for(65536, 4096, 128256), 2048);
  // GPT-2 124M at 32 x 1024: ceil(50304 / 768) = 66, 32768 / 66 -> 497 -> 512 rows.
  EXPECT_EQ(auto_rows.chunk_for(32768, 768, 50304), 512);
  // GPT-2 124M at 8 x 1024: Liger's 125 -> 128 rows, raised to the floor of 256.
  EXPECT_EQ(auto_rows.chunk_for(8192, 768, 50304), fsdp::FusedLinearCrossEntropy::kMinAutoChunkRows);
  EXPECT_EQ(auto_rows.chunk_for(3, 16, 256), 3);   // at most the rows
  EXPECT_EQ(auto_rows.chunk_for(5, 512, 256), 5);
  const fsdp::FusedLinearCrossEntropy fixed{true, 100};
  EXPECT_EQ(fixed.chunk_for(12, 16, 256), 12);
  EXPECT_EQ(fixed.chunk_for(1000, 16, 256), 100);
  EXPECT_EQ((fsdp::FusedLinearCrossEntropy{false, 100}.logits_rows(1000, 16, 256)), 1000);
  for (int64_t r = 1; r < 5000; r += 7) {  // nondecreasing: a smaller batch fits the buffer
    EXPECT_LE(auto_rows.chunk_for(r, 64, 50304), auto_rows.chunk_for(r + 7, 64, 50304)) << r;
  }
}

TEST(FusedLinearCrossEntropy, Gpt2EqualsUnfusedHead) {
  // Units: the root (wte, wpe, ln_f) = 0, each GPT2Block its own.
  expect_chunked_head_equals_unfused<fsdp::Gpt2Model>(tiny_gpt2(), 16, wrap("GPT2Block"), 0,
                                                      "gpt2");
}

TEST(FusedLinearCrossEntropy, LlamaEqualsUnfusedHead) {
  // Units: the root (embed_tokens, norm, lm_head) = 0, each LlamaDecoderLayer its own.
  for (bool tied : {false, true}) {
    expect_chunked_head_equals_unfused<fsdp::LlamaModel>(
        tiny_llama(tied), 16, wrap("LlamaDecoderLayer"), 0, tied ? "llama tied" : "llama untied");
  }
  // Granite's logits divided by logits_scaling: the chunks scale their logits as the head does.
  fsdp::LlamaConfig granite = tiny_llama(true);
  granite.arch = fsdp::LlamaArch::granite;
  granite.logits_scaling = 4.0;
  granite.residual_multiplier = 0.5;
  expect_chunked_head_equals_unfused<fsdp::LlamaModel>(granite, 16, wrap("GraniteDecoderLayer"), 0,
                                                       "granite tied, logits_scaling 4");
  // Gemma 2's final soft-cap: each chunk's loss caps its logits as the unchunked head's does.
  fsdp::LlamaConfig gemma2 = tiny_llama(false);
  gemma2.arch = fsdp::LlamaArch::gemma2;
  gemma2.sliding_window = 3;
  gemma2.final_logit_softcapping = 2.0;
  gemma2.attn_logit_softcapping = 1.0;
  expect_chunked_head_equals_unfused<fsdp::LlamaModel>(gemma2, 16, wrap("Gemma2DecoderLayer"), 0,
                                                       "gemma2 untied, soft-caps 2 and 1");
}

// ---- through the trainer ----

// A small untied MHA Llama (the GPT-2 is train_util.hpp's kSmallGpt2: tied, vocab 256).
constexpr const char* kSmallLlama = R"(
[model]
type = "llama"
num_hidden_layers = 2
hidden_size = 16
num_attention_heads = 2
intermediate_size = 32
max_position_embeddings = 16
vocab_size = 256
)";

// 5 AdamW steps (warmup, clipping) of FULL_SHARD over the world, evaluation every 2 steps:
// the fused runs' losses, validation losses and final parameters against the unfused run's.
// Tolerances (relative; measured over chunks 4 to 32 rows at 1 and 2 ranks: fp32 losses
// 3.3e-9, parameters 7.8e-7; bf16 losses 1.4e-4, parameters 2.9e-3): fp32 losses 1e-6 and parameters 1e-5, the tolerance
// tests/test_llama_fsdp.cpp allows a change of reduction order (here only the head weight's
// gradient is summed differently, ~5e-8 relative); bf16 losses 1e-3 and parameters 1e-2: the
// head gradient's extra bf16 roundings (~4e-3 relative on that tensor, above) pass through
// AdamW, whose first updates are ~lr * sign(g): a component near 0 whose sign the rounding
// flips moves by 2 lr, and every parameter follows from the next step on.
TEST(FusedLinearCrossEntropy, TrainerRunsMatchAndPlanEqualsPeak) {
  struct Family {
    const char* name;
    const char* toml;
    int64_t C, Vp;
  };
  for (const Family& fam : {Family{"gpt2", kSmallGpt2, 16, 256}, Family{"llama", kSmallLlama, 16, 256}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::string base = std::string(fam.name) + " " + std::string(fsdp::to_string(dtype));
      auto config = [&](const std::string& dir, std::vector<std::string> overrides) {
        Config c = small_run(fam.toml, fresh_dir(dir), std::move(overrides));
        c.fsdp.sharding_strategy = fsdp::ShardingStrategy::FULL_SHARD;
        c.mixed_precision.param_dtype = dtype;
        c.eval.every = 2;
        return c;
      };
      const std::string tag = std::string(fam.name) + "_" + std::string(fsdp::to_string(dtype));
      const TrainResult off = run(config("flce_off_" + tag, {}), On::world);
      expect_plan_equals_peak(off, base + " unfused");
      const int64_t rows = 8 / world_size() * 12;  // this rank's micro-batch x seq_len
      for (int64_t chunk : {int64_t{0}, int64_t{7}, int64_t{32}}) {  // auto: one chunk here
        const std::string what = base + " chunk " + std::to_string(chunk);
        const TrainResult on =
            run(config("flce_on_" + tag + "_" + std::to_string(chunk),
                       {"model.fused_linear_cross_entropy=true",
                        "model.fused_linear_cross_entropy_chunk_rows=" + std::to_string(chunk)}),
                On::world);
        expect_plan_equals_peak(on, what);
        const int64_t kept = fsdp::FusedLinearCrossEntropy{true, chunk}.chunk_for(rows, fam.C, fam.Vp);
        EXPECT_EQ(off.planned_activation_bytes - on.planned_activation_bytes,
                  (rows - kept) * fam.Vp * static_cast<int64_t>(fsdp::dtype_size(dtype)))
            << what;
        const double tol = dtype == DType::f32 ? 1e-6 : 1e-3;
        const double param_tol = dtype == DType::f32 ? 1e-5 : 1e-2;
        ASSERT_EQ(on.losses.size(), off.losses.size()) << what;
        double worst = 0;
        for (std::size_t i = 0; i < off.losses.size(); ++i) {
          EXPECT_NEAR(on.losses[i], off.losses[i], tol * off.losses[i]) << what << " step " << i + 1;
          worst = std::max(worst, std::abs(on.losses[i] - off.losses[i]) / off.losses[i]);
        }
        // The first step's loss: the same parameters, only the head's GEMMs (above).
        EXPECT_NEAR(on.losses[0], off.losses[0], loss_tol(dtype) * off.losses[0])
            << what << ": the first step's loss";
        EXPECT_LT(on.losses.back(), on.losses.front()) << what << ": it trains";
        ASSERT_EQ(on.val_losses.size(), off.val_losses.size()) << what;
        ASSERT_FALSE(off.val_losses.empty()) << what;
        for (std::size_t i = 0; i < off.val_losses.size(); ++i) {
          EXPECT_NEAR(on.val_losses[i].second, off.val_losses[i].second,
                      tol * off.val_losses[i].second)
              << what << " validation " << i;
        }
        std::vector<float> a, b;
        for (const auto& [name, values] : off.params) {
          a.insert(a.end(), on.params.at(name).begin(), on.params.at(name).end());
          b.insert(b.end(), values.begin(), values.end());
        }
        const double pd = rel_diff(a, b);
        EXPECT_LE(pd, param_tol) << what << ": parameters";
        if (world_rank() == 0) {
          std::printf("%s: losses rel diff <= %.3g, parameters rel diff %.3g, activations "
                      "%lld -> %lld bytes\n",
                      what.c_str(), worst, pd, static_cast<long long>(off.planned_activation_bytes),
                      static_cast<long long>(on.planned_activation_bytes));
        }
      }
    }
  }
}

// ---- the keys ----

TEST(FusedLinearCrossEntropy, KeysParseAndT5RefusesThem) {
  const std::string gpt2 = std::string(kSmallGpt2) + "[data]\nsource = \"synthetic\"\nseq_len = 12\n";
  const Config on = fsdp::parse_config(
      gpt2, "k.toml",
      {"model.fused_linear_cross_entropy=true", "model.fused_linear_cross_entropy_chunk_rows=64"});
  EXPECT_TRUE(on.model.fused_linear_cross_entropy);
  EXPECT_EQ(on.model.fused_linear_cross_entropy_chunk_rows, 64);
  const fsdp::Gpt2Config g = fsdp::Gpt2Config::from(on.model);
  EXPECT_TRUE(g.fused_lce.enabled);
  EXPECT_EQ(g.fused_lce.chunk_rows, 64);
  // Printed after the family's keys, and read back.
  const std::string text = fsdp::to_toml(on);
  EXPECT_NE(text.find("fused_linear_cross_entropy = true\nfused_linear_cross_entropy_chunk_rows = 64\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(fsdp::parse_config(text, "again.toml", {}).model, on.model);
  const Config off = fsdp::parse_config(gpt2, "k.toml", {});
  EXPECT_FALSE(off.model.fused_linear_cross_entropy);
  EXPECT_EQ(off.model.fused_linear_cross_entropy_chunk_rows, 0);
  // The checkpoint's model config does not carry it (an execution knob, as
  // fsdp.activation_checkpointing): resuming with or without it restores the same model.
  EXPECT_EQ(fsdp::model_config_json(on.model), fsdp::model_config_json(off.model));
  try {
    fsdp::parse_config(gpt2, "k.toml", {"model.fused_linear_cross_entropy_chunk_rows=-1"});
    ADD_FAILURE() << "a negative chunk was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.fused_linear_cross_entropy_chunk_rows: -1 is out of range"),
              std::string::npos)
        << e.what();
  }
  try {
    fsdp::parse_config("[model]\ntype = \"t5\"\n[data]\nsource = \"synthetic\"\n", "t5.toml",
                       {"model.fused_linear_cross_entropy=true"});
    ADD_FAILURE() << "t5 accepted model.fused_linear_cross_entropy";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.fused_linear_cross_entropy: true is not supported "
                                         "for model.type = \"t5\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
