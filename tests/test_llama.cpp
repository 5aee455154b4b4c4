// Llama model tests: logits, loss and every gradient against the stored float64 PyTorch
// reference of HF LlamaForCausalLM (tools/llama_reference.py, tests/data/llama/: 1 and 3
// layers, MHA / GQA / MQA, tied and untied, rope_theta 1e4 and 5e5 with llama3 scaling, with
// and without biases; and MistralForCausalLM, Qwen2ForCausalLM's q/k/v biases,
// Qwen3ForCausalLM's per-head q/k norms, Olmo2ForCausalLM, Phi3ForCausalLM's fused
// projections and Gemma3ForCausalLM, each from its own config.json), a finite-difference
// check of every parameter tensor, the model built
// from each fixture's config.json (init_from's path), activation checkpointing bit-identical
// on one rank and sharded over the world, the activation plan equal to what is allocated, and
// the llama3 frequency scaling's three regimes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/llama.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/train/router_bias.hpp"
#include "model_fixture.hpp"
#include "reference_file.hpp"

namespace {

fsdp::LlamaConfig tiny_model() {
  fsdp::LlamaConfig m;
  m.num_hidden_layers = 2;
  m.hidden_size = 16;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.intermediate_size = 24;
  m.max_position_embeddings = 16;
  m.vocab_size = 11;
  return m;
}

// One unit per decoder layer: LlamaDecoderLayer, Qwen3DecoderLayer, ...
fsdp::FsdpConfig llama_wrap(fsdp::LlamaArch arch = fsdp::LlamaArch::llama) {
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {std::string(fsdp::llama_arch_prefix(arch)) + "DecoderLayer"};
  return fc;
}

// The tiny GQA Llama by default (model_fixture.hpp).
struct ModelOptions : test_util::CausalLmOptions<fsdp::LlamaConfig> {
  ModelOptions() { model = tiny_model(); }
};

struct Fixture : test_util::CausalLmFixture<fsdp::LlamaModel, fsdp::LlamaConfig> {
  explicit Fixture(const ModelOptions& o = {}) : CausalLmFixture(o, llama_wrap(o.model.arch)) {}
  Fixture(const ModelOptions& o, const fsdp::FsdpConfig& fc) : CausalLmFixture(o, fc) {}
};

// Gemma 3's tiny model: GQA, 2 layers sliding then global (pattern 2, window 3 < T), a local
// RoPE period far from the global one and a score scale != head_dim^-1/2.
void make_gemma(fsdp::LlamaConfig& m) {
  m.arch = fsdp::LlamaArch::gemma3_text;
  m.query_pre_attn_scalar = 6;
  m.sliding_window = 3;
  m.sliding_window_pattern = 2;
  m.rope_theta = 1e6;
  m.rope_local_base_freq = 100;
}

// Gemma 2's tiny model: Gemma 3's sizes without q_norm / k_norm, layer 0 sliding over 3
// positions, layer 1 global, one RoPE, and soft-caps that bend its scores and logits.
void make_gemma2(fsdp::LlamaConfig& m) {
  m.arch = fsdp::LlamaArch::gemma2;
  m.query_pre_attn_scalar = 6;
  m.sliding_window = 3;
  m.sliding_window_pattern = 2;
  m.attn_logit_softcapping = 1.0;
  m.final_logit_softcapping = 2.0;
}

// EXAONE 4's tiny model: layer 0 slides over 3 positions with RoPE, layer 1 is global without
// RoPE (NoPE); per-head q/k norms, norms on the sublayers' outputs.
void make_exaone4(fsdp::LlamaConfig& m) {
  m.arch = fsdp::LlamaArch::exaone4;
  m.sliding_window_pattern = 2;
  m.sliding_window = 3;
}

// SmolLM3's tiny model: layer 1 of 2 has no RoPE (no_rope_layer_interval 2) and, when
// `window`, slides over 3 positions (use_sliding_window).
void make_smollm3(fsdp::LlamaConfig& m, bool window = true) {
  m.arch = fsdp::LlamaArch::smollm3;
  m.no_rope_layer_interval = 2;
  m.use_sliding_window = window;
  m.sliding_window = 3;
}

// Granite's tiny model: its four multipliers away from 1 (Granite 3's are 12, 0.22, 1/128, 8).
void make_granite(fsdp::LlamaConfig& m) {
  m.arch = fsdp::LlamaArch::granite;
  m.embedding_multiplier = 3.0;
  m.residual_multiplier = 0.5;
  m.attention_multiplier = 0.2;
  m.logits_scaling = 4.0;
}

// Qwen3.5's tiny model: layer 0 linear attention (Gated DeltaNet: 1 key head of 4, 2 value
// heads of 3, a conv of 3 taps), layer 1 gated full attention with half of each head rotated
// (Qwen3.5-MoE's layers too).
void make_qwen35(fsdp::LlamaConfig& m, fsdp::LlamaArch arch = fsdp::LlamaArch::qwen3_5_text) {
  m.arch = arch;
  m.full_attention_interval = 2;
  m.partial_rotary_factor = 0.5;
  m.linear_num_key_heads = 1;
  m.linear_num_value_heads = 2;
  m.linear_key_head_dim = 4;
  m.linear_value_head_dim = 3;
  m.linear_conv_kernel_dim = 3;
}

// Phi-3 with Phi-4-mini's RoPE on the tiny model: half of each head rotated (partial_rotary_
// factor 0.5 of 4 columns: one frequency), LongRoPE's long factor (T > 4) and its scale.
void make_phi3_longrope(fsdp::LlamaConfig& m) {
  m.arch = fsdp::LlamaArch::phi3;
  m.partial_rotary_factor = 0.5;
  m.rope_type = fsdp::LlamaConfig::RopeType::longrope;
  m.original_max_position_embeddings = 4;
  m.rope_short_factor = {1.5};
  m.rope_long_factor = {2.0};
}

// OLMo 3's tiny model: layer 0 slides over 3 positions with unscaled RoPE, layer 1 is global.
void make_olmo3(fsdp::LlamaConfig& m) {
  m.arch = fsdp::LlamaArch::olmo3;
  m.sliding_window_pattern = 2;
  m.sliding_window = 3;
}

// The Mixture-of-Experts classes' tiny model: 4 experts, each token routed to 2 (Qwen3-MoE's
// experts 12 wide, Mixtral's and OLMoE's intermediate_size 24), top-k weights renormalised
// unless `normalize` is false (Mixtral always renormalises).
// `aux`: with the load-balancing loss (output_router_logits, router_aux_loss_coef 0.1).
void make_moe(fsdp::LlamaConfig& m, fsdp::LlamaArch arch, bool normalize = true,
              bool aux = false) {
  m.arch = arch;
  m.output_router_logits = aux;
  m.router_aux_loss_coef = 0.1;
  m.num_experts = 4;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 12;
  m.shared_expert_intermediate_size = 20;  // Qwen2-MoE's
  m.norm_topk_prob = normalize;
  if (arch == fsdp::LlamaArch::glm4_moe || arch == fsdp::LlamaArch::deepseek_v3) {
    // GLM-4.5's: layer 0 dense, 6 experts in 3 groups of which each token's best 2 are kept,
    // weights scaled by 1.5, 2 shared experts (24 wide), half of each head rotated
    m.num_experts = 6;
    m.n_group = 3;
    m.topk_group = 2;
    m.routed_scaling_factor = 1.5;
    m.n_shared_experts = 2;
    m.first_k_dense_replace = 1;
    m.partial_rotary_factor = 0.5;
  }
  if (arch == fsdp::LlamaArch::deepseek_v2) {  // DeepSeek-V2's block: softmax top-k, scaled
    m.num_experts = 6;
    m.routed_scaling_factor = 1.5;
    m.n_shared_experts = 2;
    m.first_k_dense_replace = 1;
  }
  if (arch == fsdp::LlamaArch::llama4_text) {
    // Llama 4's tiny model: one expert a token; layer 0 dense with RoPE in chunks of 3 and q/k
    // L2 norms, layer 1 sparse and NoPE with its queries' temperature (floor_scale 2: positions
    // 1 .. T scaled)
    m.num_experts_per_tok = 1;
    m.intermediate_size_mlp = 40;
    m.interleave_moe_layer_step = 2;
    m.no_rope_layer_interval = 2;
    m.attention_chunk_size = 3;
    m.floor_scale = 2;
    m.attn_scale = 0.5;
  }
  if (arch == fsdp::LlamaArch::qwen3_5_moe_text) make_qwen35(m, arch);  // (Qwen2-MoE's block)
  if (arch == fsdp::LlamaArch::gpt_oss) {  // gpt-oss: layer 0 slides over 3 positions
    m.sliding_window = 3;
    m.rope_type = fsdp::LlamaConfig::RopeType::default_;
  }
  if (arch == fsdp::LlamaArch::deepseek_v3 || arch == fsdp::LlamaArch::deepseek_v2) {
    // DeepSeek-V3's and V2's attention: queries compressed to 6, keys and values to 8; heads of 4 +
    // 4 columns (the rope pairs interleaved), values 6 wide
    m.num_key_value_heads = 0;
    m.q_lora_rank = 6;
    m.kv_lora_rank = 8;
    m.qk_nope_head_dim = 4;
    m.qk_rope_head_dim = 4;
    m.v_head_dim = 6;
    m.rope_interleave = true;
  }
}
bool is_moe(fsdp::LlamaArch arch) {
  return arch == fsdp::LlamaArch::qwen3_moe || arch == fsdp::LlamaArch::mixtral ||
         arch == fsdp::LlamaArch::olmoe || arch == fsdp::LlamaArch::qwen2_moe ||
         arch == fsdp::LlamaArch::glm4_moe || arch == fsdp::LlamaArch::deepseek_v3 ||
         arch == fsdp::LlamaArch::deepseek_v2 || arch == fsdp::LlamaArch::gpt_oss ||
         arch == fsdp::LlamaArch::llama4_text || arch == fsdp::LlamaArch::qwen3_5_moe_text;
}

// Whether parameter `name` is a router's e_score_correction_bias (GLM-4.5, DeepSeek-V3): HF's
// buffer, never trained (a zero gradient; not counted among HF's parameters).
bool is_router_bias(const std::string& name) {
  const std::string suffix = ".mlp.gate.e_score_correction_bias";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's num_parameters of `g`, and the values of its routers' bias buffers beside them.
std::pair<int64_t, int64_t> parameters_and_buffers(const fsdp::LlamaConfig& g) {
  int64_t params = 0, buffers = 0;
  for (const auto& m : fsdp::llama_modules(g)) {
    for (const auto& p : m.params)
      (is_router_bias(p.name) ? buffers : params) += p.unpadded_numel();
  }
  return {params, buffers};
}

// Every element of this rank's shards += N(0, 0.3) (norm weights != 1, biases != 0); the
// routers' e_score_correction_bias (GLM-4.5, DeepSeek-V3) by a tenth of that, as a sigmoid
// routing's choices differ by less: larger biases would send every token to the same experts.
void perturb_shards(Fixture& f, unsigned seed = 7) {
  std::mt19937 gen(seed + static_cast<unsigned>(f.comm.rank()));
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    const int64_t n = f.engine.shard_numel(u), begin = f.engine.shard_index() * n;
    for (int64_t i = 0; i < n; ++i) p[i] += nd(gen);
    for (const auto& e : f.engine.layout(u).entries) {  // (the shard's part of each bias)
      const int64_t lo = std::max(e.offset, begin),
                    hi = std::min(e.offset + e.spec.numel(), begin + n);
      if (is_router_bias(e.spec.name)) {
        for (int64_t i = lo; i < hi; ++i) p[i - begin] *= 0.1f;
      }
      // Qwen3.5's A_log (initialised to log U(0.01, 16)): exp(A_log) near 0.4, so the linear
      // layers' state decays slowly enough for its gates to carry gradients finite
      // differences can see (with A up to 16 the state forgets each step and they vanish)
      const std::string a_log = "linear_attn.A_log";
      if (e.spec.name.size() > a_log.size() &&
          e.spec.name.compare(e.spec.name.size() - a_log.size(), a_log.size(), a_log) == 0) {
        for (int64_t i = lo; i < hi; ++i) p[i - begin] = -1.f + 0.1f * static_cast<float>(i % 3);
      }
    }
  }
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The values of parameter `name` on this rank (a one-rank fixture holds every parameter).
std::vector<float> param_values(Fixture& f, const std::string& name) {
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* p = f.engine.shard_param(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      if (e.spec.name == name) return {p + e.offset, p + e.offset + e.spec.numel()};
    }
  }
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

// Each row of layer l's routing scores of the last forward (fp32 activations), as (-score,
// expert) pairs sorted ascending: the experts in the routing's order, ties to the lower one.
// The score is the router logit (the softmax keeps its order) or, under sigmoid_routing(),
// the choice sigmoid(logit) + e_score_correction_bias with the groups left out set to 0; then
// *group_gap gets the smallest gap between the topk_group-th and the next group score.
// Empty when the layer has no logits to read (a dense layer, a recomputed one).
std::vector<std::vector<std::pair<float, int64_t>>> ranked_experts(
    Fixture& f, const fsdp::LlamaConfig& m, int64_t l, float* group_gap = nullptr) {
  const int64_t E = m.num_experts;
  const fsdp::TensorView v = f.model.router_logits(l);
  if (v.data == nullptr || v.dtype != fsdp::DType::f32) return {};
  std::vector<float> z(static_cast<std::size_t>(v.numel()));
  f.be->copy_to_host(z.data(), v);
  const std::vector<float> bias = m.selection_bias()
                                      ? param_values(f, "model.layers." + std::to_string(l) +
                                                            ".mlp.gate.e_score_correction_bias")
                                      : std::vector<float>(static_cast<std::size_t>(E), 0.f);
  if (group_gap) *group_gap = std::numeric_limits<float>::infinity();
  std::vector<std::vector<std::pair<float, int64_t>>> rows(
      static_cast<std::size_t>(v.numel() / E));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::vector<float> c(z.begin() + static_cast<std::ptrdiff_t>(r * E),
                         z.begin() + static_cast<std::ptrdiff_t>((r + 1) * E));
    if (m.sigmoid_routing()) {
      for (int64_t e = 0; e < E; ++e) c[e] = 1.f / (1.f + std::exp(-c[e])) + bias[e];
      const int64_t G = m.n_group, per = E / G;
      std::vector<std::pair<float, int64_t>> groups;
      for (int64_t g = 0; g < G && G > 1; ++g) {
        std::vector<float> in(c.begin() + g * per, c.begin() + (g + 1) * per);
        std::sort(in.rbegin(), in.rend());
        groups.emplace_back(-(in[0] + in[1]), g);
      }
      std::sort(groups.begin(), groups.end());
      for (std::size_t j = static_cast<std::size_t>(m.topk_group); j < groups.size(); ++j) {
        if (group_gap) {
          *group_gap = std::min(*group_gap, groups[j].first - groups[j - 1].first);
        }
        for (int64_t e = groups[j].second * per; e < (groups[j].second + 1) * per; ++e) c[e] = 0;
      }
    }
    for (int64_t e = 0; e < E; ++e) rows[r].emplace_back(-c[static_cast<std::size_t>(e)], e);
    std::sort(rows[r].begin(), rows[r].end());
  }
  return rows;
}

// Whether the last forward of `f` (an MoE model, fp32 activations) routed every token of every
// layer with a margin: its K-th and (K+1)-th router logits at least `gap` apart, and each
// expert chosen by some token. Finite differences and fp32-vs-fp64 comparisons need both: a
// near tie flips under a perturbation, and an idle expert has no gradient to check.
bool clear_routing(Fixture& f, const fsdp::LlamaConfig& m, double gap) {
  const int64_t E = m.num_experts, K = m.num_experts_per_tok;
  const auto k = static_cast<std::size_t>(K);
  // (GLM-4.5's choices are sigmoids, whose slope is at most 1/4; a perturbed embedding moves
  // them most: `gap / 2` in them)
  const double choice_gap = m.sigmoid_routing() ? gap / 2 : gap;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    if (!m.layer_sparse(l)) continue;
    float group_gap = 0;
    const auto rows = ranked_experts(f, m, l, &group_gap);
    if (rows.empty() || group_gap < choice_gap) return false;
    std::vector<int> used(static_cast<std::size_t>(E), 0);
    for (const auto& row : rows) {
      if (K < E && row[k].first - row[k - 1].first < choice_gap) return false;
      for (std::size_t j = 0; j < k; ++j) used[static_cast<std::size_t>(row[j].second)] = 1;
    }
    if (std::find(used.begin(), used.end(), 0) != used.end()) return false;
  }
  return true;
}

// Directional finite differences of every parameter tensor, for a few shapes of the family.
TEST(Llama, FiniteDifferenceGradientOfEveryParameter) {
  using fsdp::LlamaArch;
  struct Case {
    const char* what;
    int64_t kv_heads;
    bool tied, attention_bias, mlp_bias, llama3;
    LlamaArch arch = LlamaArch::llama;
    int64_t head_dim = 0;
    bool longrope = false;  // make_phi3_longrope
    bool aux = false;       // MoE: the load-balancing loss
  };
  for (const Case& c :
       {Case{"GQA untied", 2, false, false, false, false},
        Case{"MQA tied, biases, llama3", 1, true, true, true, true},
        Case{"MHA untied, attention bias", 4, false, true, false, false},
        Case{"Qwen2 GQA untied (q/k/v biases)", 2, false, false, false, false, LlamaArch::qwen2},
        Case{"Qwen3 MQA tied, head_dim 6, llama3", 1, true, false, false, true, LlamaArch::qwen3,
             6},
        Case{"Qwen3 GQA untied, attention bias", 2, false, true, false, false, LlamaArch::qwen3},
        Case{"OLMo 2 GQA untied", 2, false, false, false, false, LlamaArch::olmo2},
        Case{"OLMo 2 MQA tied, attention bias, llama3", 1, true, true, false, true,
             LlamaArch::olmo2},
        Case{"Phi-3 GQA untied (fused qkv_proj, gate_up_proj)", 2, false, false, false, false,
             LlamaArch::phi3},
        Case{"Phi-3 MQA tied", 1, true, false, false, false, LlamaArch::phi3},
        Case{"Phi-3 GQA untied, LongRoPE, half of each head rotated", 2, false, false, false, false,
             LlamaArch::phi3, 0, true},
        Case{"Gemma 3 GQA tied, head_dim 6, sliding + global", 2, true, false, false, false,
             LlamaArch::gemma3_text, 6},
        Case{"Gemma 3 MQA untied, attention bias, llama3 (global)", 1, false, true, false, true,
             LlamaArch::gemma3_text},
        Case{"SmolLM3 GQA tied, llama3, NoPE layer 1 with a window", 2, true, false, false, true,
             LlamaArch::smollm3},
        // (no attention_bias: on a NoPE layer k_proj's bias shifts every score of a query
        // alike, so its gradient is exactly 0, as the test's "gradient vanished" would say)
        Case{"SmolLM3 MHA untied, MLP biases, NoPE layer 1", 4, false, false, true, false,
             LlamaArch::smollm3},
        Case{"Granite GQA untied, multipliers", 2, false, false, false, false, LlamaArch::granite},
        Case{"Granite MQA tied, multipliers, llama3", 1, true, false, false, true,
             LlamaArch::granite},
        Case{"OLMo 3 GQA untied, llama3 on the global layer, window 3", 2, false, false, false,
             true, LlamaArch::olmo3},
        Case{"Gemma 2 GQA tied, head_dim 6, sliding + global, soft-caps", 2, true, false, false,
             false, LlamaArch::gemma2, 6},
        Case{"Gemma 2 MQA untied, soft-caps, llama3", 1, false, false, false, true,
             LlamaArch::gemma2},
        Case{"Gemma GQA tied, head_dim 6", 2, true, false, false, false, LlamaArch::gemma, 6},
        Case{"Gemma MHA untied, attention bias, llama3", 4, false, true, false, true,
             LlamaArch::gemma},
        Case{"EXAONE 4 GQA untied, head_dim 6, llama3 on the sliding layer, NoPE global", 2,
             false, false, false, true, LlamaArch::exaone4, 6},
        Case{"EXAONE 4 MQA tied, no window (every layer rotated)", 1, true, false, false, false,
             LlamaArch::exaone4},
        Case{"Qwen3-MoE GQA untied, head_dim 6, 4 experts top 2 renormalised", 2, false, false,
             false, false, LlamaArch::qwen3_moe, 6},
        Case{"Qwen3-MoE MQA tied, llama3, top 2 not renormalised", 1, true, false, false, true,
             LlamaArch::qwen3_moe},
        Case{"Mixtral GQA untied, 4 experts top 2, window 3", 2, false, false, false, false,
             LlamaArch::mixtral},
        Case{"OLMoE MHA untied, attention bias, top 2 not renormalised", 4, false, true, false,
             false, LlamaArch::olmoe},
        Case{"Qwen3-MoE GQA untied, load-balancing loss", 2, false, false, false, false,
             LlamaArch::qwen3_moe, 0, false, true},
        Case{"Mixtral MQA tied, load-balancing loss", 1, true, false, false, true,
             LlamaArch::mixtral, 0, false, true},
        Case{"Qwen2-MoE GQA untied, shared expert, not renormalised", 2, false, false, false,
             false, LlamaArch::qwen2_moe},
        Case{"Qwen2-MoE MQA tied, shared expert, load-balancing loss, llama3", 1, true, false,
             false, true, LlamaArch::qwen2_moe, 0, false, true},
        Case{"GLM-4.5 GQA untied, q/k/v biases, layer 0 dense, 2 of 3 groups, not renormalised",
             2, false, true, false, false, LlamaArch::glm4_moe},
        Case{"GLM-4.5 MQA tied, q/k norms, llama3, renormalised", 1, true, false, false, true,
             LlamaArch::glm4_moe},
        Case{"DeepSeek-V3 untied, MLA with compressed queries, interleaved rope pairs, biases",
             4, false, true, false, false, LlamaArch::deepseek_v3},
        Case{"DeepSeek-V3 tied, MLA with q_proj, rotate-half, yarn with mscale", 4, true, false,
             false, false, LlamaArch::deepseek_v3},
        Case{"DeepSeek-V2 untied, MLA with compressed queries, softmax top 2 scaled, biases", 4,
             false, true, false, false, LlamaArch::deepseek_v2},
        Case{"gpt-oss GQA untied, sinks, window 3, packed experts with biases", 2, false, false,
             false, false, LlamaArch::gpt_oss},
        Case{"gpt-oss MQA tied, llama3, load-balancing loss", 1, true, false, false, true,
             LlamaArch::gpt_oss, 0, false, true},
        Case{"Llama 4 GQA untied, chunks of 3, q/k L2 norms, dense + sparse NoPE with temperature",
             2, false, false, false, false, LlamaArch::llama4_text},
        Case{"Llama 4 MQA tied, llama3, no q/k norms, both layers sparse with RoPE", 1, true,
             false, false, true, LlamaArch::llama4_text},
        Case{"Qwen3.5 GQA untied, linear + gated full attention, attention bias", 2, false, true,
             false, false, LlamaArch::qwen3_5_text},
        Case{"Qwen3.5 MQA tied, llama3, linear + gated full attention", 1, true, false, false,
             true, LlamaArch::qwen3_5_text},
        Case{"Qwen3.5-MoE GQA untied, linear + gated full, 4 experts top 2, shared expert, "
             "load-balancing loss",
             2, false, false, false, false, LlamaArch::qwen3_5_moe_text, 0, false, true}}) {
    ModelOptions o;
    if (is_moe(c.arch)) {
      make_moe(o.model, c.arch, /*normalize=*/!c.tied && !c.attention_bias, c.aux);
    }
    if (c.arch == LlamaArch::mixtral) o.model.sliding_window = 3;
    if (c.arch == LlamaArch::gemma3_text) make_gemma(o.model);
    if (c.arch == LlamaArch::gemma2) make_gemma2(o.model);
    if (c.arch == LlamaArch::gemma) o.model.pad_token_id = 3;  // a padding row, as Gemma's 0
    if (c.arch == LlamaArch::exaone4) {
      make_exaone4(o.model);
      if (c.tied) o.model.sliding_window = 0;  // HF's null
    }
    if (c.arch == LlamaArch::smollm3) make_smollm3(o.model, /*window=*/c.tied);
    if (c.arch == LlamaArch::granite) make_granite(o.model);
    if (c.arch == LlamaArch::olmo3) make_olmo3(o.model);
    if (c.arch == LlamaArch::qwen3_5_text) make_qwen35(o.model);
    if (c.longrope) make_phi3_longrope(o.model);
    if (c.arch == LlamaArch::glm4_moe) o.model.use_qk_norm = c.tied;
    if (c.arch == LlamaArch::llama4_text && c.tied) {  // (3 experts: each chosen by some token)
      o.model.num_experts = 3;
      o.model.use_qk_norm = false;
      o.model.interleave_moe_layer_step = 1;
      o.model.no_rope_layer_interval = 4;
    }
    if (c.arch == LlamaArch::deepseek_v3) {  // (GLM-4.5's cases keep the groups)
      o.model.n_group = 1;
      o.model.topk_group = 1;
    }
    if (c.arch == LlamaArch::deepseek_v3 && c.tied) {
      o.model.q_lora_rank = 0;
      o.model.rope_interleave = false;
      o.model.rope_type = fsdp::LlamaConfig::RopeType::yarn;
      o.model.rope_factor = 4.0;
      o.model.rope_original_max_position_embeddings = 4;
      o.model.rope_mscale = 1.0;
      o.model.rope_mscale_all_dim = 0.8;
    }
    o.model.arch = c.arch;
    o.model.head_dim = c.head_dim;
    o.model.num_key_value_heads = c.kv_heads;
    o.model.tie_word_embeddings = c.tied;
    o.model.attention_bias = c.attention_bias;
    o.model.mlp_bias = c.mlp_bias;
    if (c.llama3) {
      o.model.rope_type = fsdp::LlamaConfig::RopeType::llama3;
      o.model.rope_theta = 5e5;
      o.model.rope_original_max_position_embeddings = 8;
      o.model.rope_low_freq_factor = 0.01;
      o.model.rope_high_freq_factor = 0.1;
    }
    // MoE: the first perturbation whose routing is clear (clear_routing)
    unsigned seed = 5;
    while (is_moe(c.arch)) {
      Fixture probe(o);
      perturb_shards(probe, seed);
      probe.loss();
      if (clear_routing(probe, o.model, 0.05)) break;
      ASSERT_LT(++seed, 100u) << c.what << ": no clear routing";
    }
    Fixture f(o);
    perturb_shards(f, seed);
    f.loss_and_grads();
    std::mt19937 gen(11);
    std::normal_distribution<float> nd(0.f, 1.f);
    int checked = 0;
    for (int u = 0; u < f.engine.num_units(); ++u) {
      float* p = f.engine.shard_param(u).f32();
      const float* g = f.engine.shard_grad(u).f32();
      const std::vector<float> grad(g, g + f.engine.shard_numel(u));
      for (const auto& e : f.engine.layout(u).entries) {
        const int64_t n = e.spec.unpadded_numel();  // pad rows: zero gradient, checked below
        std::vector<float> d(static_cast<std::size_t>(n));
        for (auto& x : d) x = nd(gen);
        double analytic = 0, norm_g = 0, norm_d = 0;
        for (int64_t i = 0; i < n; ++i) {
          analytic += static_cast<double>(grad[e.offset + i]) * d[i];
          norm_g += static_cast<double>(grad[e.offset + i]) * grad[e.offset + i];
          norm_d += static_cast<double>(d[i]) * d[i];
        }
        for (int64_t i = n; i < e.spec.numel(); ++i) {
          ASSERT_EQ(grad[e.offset + i], 0.f) << c.what << ": " << e.spec.name << " pad " << i;
        }
        if (is_router_bias(e.spec.name)) {
          // GLM-4.5's buffer: no gradient (it moves the routing only, which is held clear)
          EXPECT_EQ(norm_g, 0.0) << c.what << ": " << e.spec.name;
          ++checked;
          continue;
        }
        const float h = 2e-3f;
        std::vector<float> saved(p + e.offset, p + e.offset + n);
        for (int64_t i = 0; i < n; ++i) p[e.offset + i] = saved[i] + h * d[i];
        const double lp = f.loss();
        for (int64_t i = 0; i < n; ++i) p[e.offset + i] = saved[i] - h * d[i];
        const double lm = f.loss();
        std::copy(saved.begin(), saved.end(), p + e.offset);
        const double numeric = (lp - lm) / (2 * h);
        const double scale = std::sqrt(norm_g * norm_d);
        EXPECT_GT(scale, 1e-6) << c.what << ": " << e.spec.name << ": gradient vanished";
        EXPECT_NEAR(analytic, numeric, 3e-3 * scale + 1e-6) << c.what << ": " << e.spec.name;
        ++checked;
      }
    }
    const bool gemma = c.arch == LlamaArch::gemma3_text;
    const int per_layer =
        (c.arch == LlamaArch::phi3 ? 6 : 9) + (c.attention_bias ? 4 : 0) +
        (c.arch == LlamaArch::qwen2 || c.arch == LlamaArch::qwen2_moe ? 3 : 0) +
        (c.arch == LlamaArch::qwen2_moe ? 4 : 0) +  // the shared expert and its gate
        (c.arch == LlamaArch::qwen3 || c.arch == LlamaArch::olmo2 || c.arch == LlamaArch::olmo3 ||
                 c.arch == LlamaArch::exaone4
             ? 2
             : 0) +
        (gemma ? 4 : 0) + (c.arch == LlamaArch::gemma2 ? 2 : 0) + (c.mlp_bias ? 3 : 0) +
        // the router and 3 projections per expert instead of the MLP's 3; q/k norms
        (is_moe(c.arch) ? 1 + 3 * o.model.num_experts - 3 : 0) +
        (c.arch == LlamaArch::qwen3_moe || c.arch == LlamaArch::olmoe ? 2 : 0);
    // GLM-4.5: layer 0 dense (q/k/v biases or q/k norms), layer 1 sparse with the router's
    // bias and the shared experts
    const int glm_dense = 9 + (c.attention_bias ? 3 : 0) + (c.tied ? 2 : 0);
    // DeepSeek-V3: MLA's projections and norms (q_a_proj, q_a_layernorm, q_b_proj or q_proj;
    // kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; biases on q_a, kv_a and o)
    const int mla = (o.model.q_lora_rank > 0 ? 7 : 5) +
                    (c.attention_bias ? (o.model.q_lora_rank > 0 ? 3 : 2) : 0);
    const int ds_dense = mla + 3 + 2;
    const int experts = 3 * static_cast<int>(o.model.num_experts);
    const int layers =
        c.arch == LlamaArch::glm4_moe ? glm_dense + glm_dense - 3 + 2 + experts + 3
        : c.arch == LlamaArch::deepseek_v3 ? ds_dense + ds_dense - 3 + 2 + experts + 3
        : c.arch == LlamaArch::deepseek_v2 ? ds_dense + ds_dense - 3 + 1 + experts + 3
        // gpt-oss: q/k/v/o and their biases, sinks, the router and its bias, 4 packed expert
        // tensors, 2 norms
        : c.arch == LlamaArch::gpt_oss ? 2 * 17
        // Llama 4: q/k/v/o and 2 norms; a dense layer's MLP (3), a sparse one's router, 2
        // packed expert tensors and the shared expert's 3
        : c.arch == LlamaArch::llama4_text ? (c.tied ? 12 + 12 : 9 + 12)
        // Qwen3.5: a linear layer's 9 linear_attn tensors, the MLP's 3 and 2 norms; a full
        // layer's q/k/v/o (and biases), q/k norms, MLP and norms
        : c.arch == LlamaArch::qwen3_5_text ? 14 + 11 + (c.attention_bias ? 4 : 0)
        // Qwen3.5-MoE: each layer's MLP a router, 4 experts' 12, the shared expert's 3 and its
        // gate instead of 3
        : c.arch == LlamaArch::qwen3_5_moe_text ? 14 + 11 + 2 * (1 + 12 + 4 - 3)
                                            : 2 * per_layer;
    EXPECT_EQ(checked, 1 + layers + 1 + (c.tied ? 0 : 1)) << c.what;
  }
}

// tools/llama_reference.py's float64 torch Llama on the same float32 weights and batch, against
// our fp32 CPU model: logits, mean loss and every gradient. The model is built from the
// fixture's HF config.json (from_hf_config: init_from's path), the names mapped by the
// family's hf_tensor (fsdp_merge's mapping); the vocabulary (37) is padded to 128 rows.
void check_reference(const std::string& file) {
  test_util::ReferenceFile ref;
  test_util::read_reference(std::string(FSDP_TEST_DATA_DIR) + "/llama/" + file,
                            "tools/llama_reference.py", &ref);
  if (testing::Test::HasFatalFailure()) return;
  const auto batch = ref.as<int64_t>("batch");
  ASSERT_EQ(batch.size(), 2u) << file << ": batch B T";
  const nlohmann::json hf = nlohmann::json::parse(ref.config_json);
  const fsdp::ModelFamily& family = fsdp::model_family(hf.at("model_type").get<std::string>());
  const fsdp::ModelConfig mc = family.from_hf_config(hf, file);
  ModelOptions o;
  o.model = fsdp::LlamaConfig::from(mc);
  o.B = batch[0];
  o.T = batch[1];
  Fixture f(o);
  f.tokens = ref.as<int32_t>("tokens");
  f.targets = ref.as<int32_t>("targets");
  ASSERT_EQ(static_cast<int64_t>(f.tokens.size()), o.B * o.T);
  const double ref_loss = ref.scalar("loss");
  const int64_t V = o.model.vocab_size, Vp = o.model.padded_vocab(), BT = o.B * o.T;
  ASSERT_GT(Vp, V) << "the fixture should exercise the vocabulary padding";

  int set = 0;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      const auto hf = family.hf_tensor(mc, e.spec.name, e.spec.unpadded_shape());
      ASSERT_TRUE(hf) << e.spec.name << ": no Hugging Face name";
      ASSERT_FALSE(hf->transpose) << e.spec.name;
      ASSERT_TRUE(ref.params.count(hf->name)) << file << ": no " << hf->name;
      const auto& v = ref.params.at(hf->name);
      const int64_t n = e.spec.unpadded_numel();
      ASSERT_EQ(static_cast<int64_t>(v.size()), n) << hf->name;
      std::copy(v.begin(), v.end(), p + e.offset);
      ++set;
    }
  }
  EXPECT_EQ(set, static_cast<int>(ref.params.size())) << file << ": parameters the model does not declare";

  EXPECT_NEAR(f.loss(), ref_loss, 1e-5 * std::abs(ref_loss)) << file;
  const fsdp::TensorView lv = f.model.last_logits();
  ASSERT_EQ(lv.numel(), BT * Vp);
  std::vector<float> logits(static_cast<std::size_t>(lv.numel()));
  f.be->copy_to_host(logits.data(), lv);
  const std::vector<double> ref_logits = ref.as<double>("logits");
  ASSERT_EQ(static_cast<int64_t>(ref_logits.size()), BT * V);
  double diff = 0, norm = 0;
  // last_logits() are the head's output; Gemma 2's soft-cap is the loss kernel's (HF's logits
  // are after it).
  const double cap = o.model.logit_softcap();
  for (int64_t r = 0; r < BT; ++r) {
    for (int64_t c = 0; c < V; ++c) {
      const double want = ref_logits[static_cast<std::size_t>(r * V + c)];
      const double z = logits[static_cast<std::size_t>(r * Vp + c)];
      const double d = (cap > 0 ? cap * std::tanh(z / cap) : z) - want;
      diff += d * d;
      norm += want * want;
    }
  }
  EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << file << ": logits";
  EXPECT_NEAR(f.loss_and_grads(), ref_loss, 1e-5 * std::abs(ref_loss)) << file;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* g = f.engine.shard_grad(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      const auto hf = family.hf_tensor(mc, e.spec.name, e.spec.unpadded_shape());
      const auto& r = ref.grads.at(hf->name);
      const int64_t n = e.spec.unpadded_numel();
      double gd = 0, gn = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = g[e.offset + i] - r[static_cast<std::size_t>(i)];
        gd += d * d;
        gn += r[static_cast<std::size_t>(i)] * r[static_cast<std::size_t>(i)];
      }
      for (int64_t i = n; i < e.spec.numel(); ++i) {
        ASSERT_EQ(g[e.offset + i], 0.f) << file << ": " << e.spec.name << " pad element " << i;
      }
      // GLM-4.5's and DeepSeek-V3's router bias is a buffer: its gradient is 0, ours exactly
      if (is_router_bias(e.spec.name)) {
        EXPECT_EQ(gn, 0.0) << file << ": " << e.spec.name;
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[e.offset + i], 0.f) << e.spec.name << i;
        continue;
      }
      EXPECT_GT(gn, 0.0) << file << ": " << e.spec.name;
      // (+ 1e-6: a k_proj bias's gradient is a sum of nearly cancelling O(1) terms, whose norm,
      // ~0.02 here, is no scale for fp32's rounding of them: a Debug build's order of the sums
      // lands 2 % beyond 1e-5 of it)
      EXPECT_LE(std::sqrt(gd), 1e-5 * std::sqrt(gn) + 1e-6) << file << ": " << e.spec.name;
    }
  }
}

TEST(Llama, MatchesTorchReference) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(FSDP_TEST_DATA_DIR) + "/llama")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("reference_", 0) != 0) continue;
    SCOPED_TRACE(name);
    check_reference(name);
    ++files;
  }
  EXPECT_GE(files, 24) << "tests/data/llama: the fixtures of tools/llama_reference.py";
}

TEST(Llama, ActivationCheckpointingIsBitIdentical) {
  for (auto arch : {fsdp::LlamaArch::llama, fsdp::LlamaArch::qwen3, fsdp::LlamaArch::olmo2,
                    fsdp::LlamaArch::phi3, fsdp::LlamaArch::gemma3_text, fsdp::LlamaArch::smollm3,
                    fsdp::LlamaArch::granite, fsdp::LlamaArch::olmo3, fsdp::LlamaArch::gemma2,
                    fsdp::LlamaArch::gemma, fsdp::LlamaArch::exaone4, fsdp::LlamaArch::qwen3_moe,
                    fsdp::LlamaArch::mixtral, fsdp::LlamaArch::olmoe, fsdp::LlamaArch::qwen2_moe,
                    fsdp::LlamaArch::glm4_moe, fsdp::LlamaArch::deepseek_v3,
                    fsdp::LlamaArch::deepseek_v2, fsdp::LlamaArch::gpt_oss,
                    fsdp::LlamaArch::llama4_text, fsdp::LlamaArch::qwen3_5_text,
                    fsdp::LlamaArch::qwen3_5_moe_text})
    for (auto dtype : {fsdp::DType::f32, fsdp::DType::bf16}) {
      for (MPI_Comm comm : {MPI_COMM_SELF, MPI_COMM_WORLD}) {
        const std::string what = std::string(fsdp::llama_arch_prefix(arch)) + " " +
                                 std::string(fsdp::to_string(dtype)) +
                                 (comm == MPI_COMM_SELF ? " one rank" : " world");
        ModelOptions o;
        o.model = tiny_model();
        o.model.num_hidden_layers = 3;
        if (arch == fsdp::LlamaArch::gemma3_text) {
          make_gemma(o.model);
          o.model.pad_token_id = 3;  // a token of the batch: its embedding row is skipped
        }
        if (arch == fsdp::LlamaArch::smollm3) make_smollm3(o.model);
        if (arch == fsdp::LlamaArch::granite) make_granite(o.model);
        if (arch == fsdp::LlamaArch::olmo3) make_olmo3(o.model);
        if (arch == fsdp::LlamaArch::gemma2) make_gemma2(o.model);  // the soft-caps recomputed
        if (arch == fsdp::LlamaArch::gemma) o.model.pad_token_id = 3;
        if (arch == fsdp::LlamaArch::exaone4) make_exaone4(o.model);
        if (arch == fsdp::LlamaArch::qwen3_5_text) make_qwen35(o.model);
        // (Qwen3-MoE and OLMoE with the load-balancing loss: a recompute adds nothing to it)
        if (is_moe(arch)) {
          make_moe(o.model, arch, arch != fsdp::LlamaArch::olmoe,
                   /*aux=*/arch != fsdp::LlamaArch::mixtral);
        }
        o.model.arch = arch;
        o.mp.param_dtype = dtype;
        o.comm = comm;
        Fixture off(o);
        // Every layer on one rank; over the world the first of 3 (fsdp.recompute_num_layers:
        // layer 0 recomputes into the set layer 1 keeps, layer 2 has its own).
        o.activation_checkpointing = comm == MPI_COMM_SELF
                                         ? fsdp::ActivationCheckpointing(true)
                                         : fsdp::ActivationCheckpointing::first_blocks(1);
        Fixture on(o);
        perturb_shards(off);
        perturb_shards(on);
        for (int step = 0; step < 2; ++step) {
          const double loss_off = off.loss_and_grads(), loss_on = on.loss_and_grads();
          EXPECT_TRUE(std::isfinite(loss_off)) << what;
          EXPECT_TRUE(same_bits(loss_off, loss_on))
              << what << ": " << loss_off << " vs " << loss_on;
          double norm2 = 0;
          for (int u = 0; u < off.engine.num_units(); ++u) {
            const int64_t n = off.engine.shard_numel(u);
            const float* a = off.engine.shard_grad(u).f32();
            const float* b = on.engine.shard_grad(u).f32();
            EXPECT_EQ(std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(float)), 0)
                << what << ": unit " << u;
            for (int64_t i = 0; i < n; ++i) norm2 += static_cast<double>(a[i]) * a[i];
          }
          double total = norm2;
          MPI_Allreduce(&norm2, &total, 1, MPI_DOUBLE, MPI_SUM, comm);
          EXPECT_GT(total, 0.0) << what;
          EXPECT_TRUE(same_bits(off.loss(), on.loss())) << what;
        }
      }
    }
}

// Document masking (data.attn_mask_type = "block_causal", with and without
// reset_position_ids): one row packing documents of 5 and 7 tokens gives each document's
// logits, loss and gradients as that document run alone (HF's padding-free packing equals the
// padded batch): logits rows equal to rounding, the summed loss and the gradients (grad_scale
// 1: sums) equal to the two documents' sums. Without the reset RoPE reads the positions in the
// row, which changes nothing the relative rotation does not cancel: the same values to
// rounding. Classes with every attention path: GQA, per-head q/k norms, sliding layers with
// their own RoPE (Gemma 3), soft-caps (Gemma 2), partial RoPE (Phi-3 style), NoPE layers
// (SmolLM3), MLA (DeepSeek-V3), sinks and windows (gpt-oss), experts without the
// load-balancing loss (whose token sums the packing would mix), Llama 4 without chunks and
// with its temperature 1 at these positions (both read positions in the row, as HF's
// cache_position: DocumentMaskingLlama4ChunksAreTheRowsChunks checks them).
TEST(Llama, DocumentMaskingEqualsEachDocumentAlone) {
  const std::vector<int64_t> lengths = {5, 7};
  const int64_t T = 12;
  for (auto arch : {fsdp::LlamaArch::llama, fsdp::LlamaArch::qwen3, fsdp::LlamaArch::gemma3_text,
                    fsdp::LlamaArch::gemma2, fsdp::LlamaArch::phi3, fsdp::LlamaArch::smollm3,
                    fsdp::LlamaArch::deepseek_v3, fsdp::LlamaArch::gpt_oss,
                    fsdp::LlamaArch::qwen3_moe, fsdp::LlamaArch::llama4_text,
                    fsdp::LlamaArch::qwen3_5_text, fsdp::LlamaArch::qwen3_5_moe_text}) {
    for (bool reset : {true, false}) {
      const std::string what =
          std::string(fsdp::llama_arch_prefix(arch)) + (reset ? " reset" : " row positions");
      ModelOptions o;
      if (arch == fsdp::LlamaArch::gemma3_text) make_gemma(o.model);
      if (arch == fsdp::LlamaArch::gemma2) make_gemma2(o.model);
      if (arch == fsdp::LlamaArch::smollm3) make_smollm3(o.model);
      if (arch == fsdp::LlamaArch::phi3) o.model.partial_rotary_factor = 0.5;
      if (arch == fsdp::LlamaArch::qwen3_5_text) make_qwen35(o.model);
      if (is_moe(arch)) make_moe(o.model, arch, true, /*aux=*/false);
      if (arch == fsdp::LlamaArch::llama4_text) {
        o.model.attention_chunk_size = 0;
        o.model.floor_scale = 100;
      }
      o.model.arch = arch;
      o.B = 1;
      o.T = T;
      Fixture packed(o);
      perturb_shards(packed);
      std::vector<int32_t> positions;
      for (int64_t n : lengths) {
        for (int64_t t = 0; t < n; ++t) positions.push_back(static_cast<int32_t>(t));
      }
      packed.docs = {positions.data(), reset};
      const double packed_loss = packed.loss() * T;
      const fsdp::TensorView lv = packed.model.last_logits();
      const int64_t Vp = lv.shape[1];
      std::vector<float> logits(static_cast<std::size_t>(T * Vp));
      packed.be->copy_to_host(logits.data(), lv);
      packed.loss_and_grads(1.f);
      double doc_loss = 0;
      test_util::UnitGrads grads;
      int64_t t0 = 0;
      for (int64_t n : lengths) {
        o.T = n;
        Fixture alone(o);
        perturb_shards(alone);
        alone.tokens.assign(packed.tokens.begin() + t0, packed.tokens.begin() + t0 + n);
        alone.targets.assign(packed.targets.begin() + t0, packed.targets.begin() + t0 + n);
        doc_loss += alone.loss() * n;
        std::vector<float> l1(static_cast<std::size_t>(n * Vp));
        alone.be->copy_to_host(l1.data(), alone.model.last_logits());
        for (int64_t i = 0; i < n * Vp; ++i) {
          ASSERT_NEAR(logits[static_cast<std::size_t>(t0 * Vp + i)],
                      l1[static_cast<std::size_t>(i)], 2e-5)
              << what << ": logit " << i << " of the document at " << t0;
        }
        alone.loss_and_grads(1.f);
        test_util::add_grads(alone, grads);
        t0 += n;
      }
      EXPECT_NEAR(packed_loss, doc_loss, 1e-5 * std::abs(doc_loss)) << what;
      test_util::expect_grads_near(packed, grads, 2e-5, what);
    }
  }
}

// Auxiliary-loss-free load balancing's counts (Model::take_router_loads): GLM-4.5's and
// DeepSeek-V3's routers with a selection bias, one load per sparse layer named after its
// e_score_correction_bias, each summing to the (token, pick) pairs of the training forwards
// since the last call (two forwards: twice B*T*K); an evaluation forward adds nothing; a call
// resets; a recompute under activation checkpointing does not count again; routers without
// a selection bias (Qwen3-MoE) have none.
TEST(Llama, RouterLoadsCountTheTrainingRouting) {
  for (auto arch : {fsdp::LlamaArch::glm4_moe, fsdp::LlamaArch::deepseek_v3}) {
    ModelOptions o;
    make_moe(o.model, arch);
    o.model.num_hidden_layers = 3;  // layer 0 dense, 1 and 2 sparse
    Fixture plain(o);
    o.activation_checkpointing = fsdp::ActivationCheckpointing(true);
    Fixture recompute(o);
    const std::string what = fsdp::llama_arch_prefix(arch);
    for (Fixture* f : {&plain, &recompute}) {
      f->loss_and_grads();
      f->loss();  // evaluation: not counted
      f->loss_and_grads();
    }
    const auto loads = plain.model.take_router_loads();
    ASSERT_EQ(loads.size(), 2u) << what;
    const double pairs = static_cast<double>(2 * o.B * o.T * o.model.num_experts_per_tok);
    for (std::size_t i = 0; i < loads.size(); ++i) {
      EXPECT_EQ(loads[i].param, "model.layers." + std::to_string(i + 1) +
                                    ".mlp.gate.e_score_correction_bias")
          << what;
      ASSERT_EQ(static_cast<int64_t>(loads[i].counts.size()), o.model.num_experts) << what;
      double sum = 0;
      for (double c : loads[i].counts) sum += c;
      EXPECT_EQ(sum, pairs) << what << " layer " << i + 1;
    }
    EXPECT_EQ(recompute.model.take_router_loads().back().counts, loads.back().counts) << what;
    for (const auto& l : plain.model.take_router_loads()) {
      for (double c : l.counts) EXPECT_EQ(c, 0.0) << what << ": reset";
    }
    // The update lands on the named biases (zero before it): rate * sign(mean - count).
    const fsdp::RouterBiasUpdate update(plain.engine, loads, 0.5);
    for (int u = 0; u < plain.engine.num_units(); ++u) update.apply(u);
    const auto full = plain.engine.gather_full_params();
    bool moved = false;
    for (const auto& l : loads) {
      EXPECT_EQ(full.at(l.param), fsdp::router_bias_deltas(l.counts, 0.5)) << what << " " << l.param;
      for (float x : full.at(l.param)) moved = moved || x != 0.0f;
    }
    EXPECT_TRUE(moved) << what << ": some expert off the mean";
  }
  ModelOptions q;
  make_moe(q.model, fsdp::LlamaArch::qwen3_moe);
  Fixture f(q);
  f.loss_and_grads();
  EXPECT_TRUE(f.model.take_router_loads().empty());
}

// Positions that do not count up from 0 are refused, naming the entry.
TEST(Llama, DocumentMaskingRefusesBadPositions) {
  ModelOptions o;
  o.B = 1;
  Fixture f(o);
  for (const std::vector<int32_t>& bad : std::vector<std::vector<int32_t>>{
           {1, 2, 3, 4, 5, 6}, {0, 1, 2, 4, 5, 6}, {0, 1, 0, 2, 3, 4}, {0, -1, 0, 1, 2, 3}}) {
    f.docs = {bad.data(), true};
    try {
      f.loss();
      ADD_FAILURE() << "no throw";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("position_ids[0, "), std::string::npos) << e.what();
    }
  }
}

// Llama 4 under document masking attends in one call whose starts are the later of the
// document's and the chunk's (HF's chunked and packed-sequence overlays): with one document a
// row it equals the chunked calls of the run without documents (logits, loss, gradients, to
// rounding), chunks of 3 in rows of 8 with the NoPE layers' temperature; with documents the
// chunks still fall by position in the row (the mask differs from the documents' alone).
TEST(Llama, DocumentMaskingLlama4ChunksAreTheRowsChunks) {
  ModelOptions o;
  make_moe(o.model, fsdp::LlamaArch::llama4_text);
  o.B = 2;
  o.T = 8;
  for (bool reset : {false, true}) {
    Fixture plain(o), docs(o);
    perturb_shards(plain);
    perturb_shards(docs);
    std::vector<int32_t> positions;
    for (int64_t b = 0; b < o.B; ++b) {
      for (int64_t t = 0; t < o.T; ++t) positions.push_back(static_cast<int32_t>(t));
    }
    docs.docs = {positions.data(), reset};
    const double l0 = plain.loss(), l1 = docs.loss();
    EXPECT_NEAR(l1, l0, 1e-6 * std::abs(l0)) << "reset " << reset;
    const int64_t n = plain.model.last_logits().numel();
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
    plain.be->copy_to_host(a.data(), plain.model.last_logits());
    docs.be->copy_to_host(b.data(), docs.model.last_logits());
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], 2e-5) << i;
    plain.loss_and_grads();
    docs.loss_and_grads();
    test_util::UnitGrads want;
    test_util::add_grads(plain, want);
    test_util::expect_grads_near(docs, want, 2e-5, reset ? "reset" : "row positions");
  }
  // Two documents a row: the mask acts (a different loss from the one-document run).
  Fixture one(o), two(o);
  perturb_shards(one);
  perturb_shards(two);
  const std::vector<int32_t> whole = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> split = {0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 5};
  one.docs = {whole.data(), false};
  two.docs = {split.data(), false};
  EXPECT_GT(std::abs(one.loss() - two.loss()), 1e-6);
}

TEST(Llama, ActivationBytesArePlannedAndMeasured) {
  for (auto arch : {fsdp::LlamaArch::llama, fsdp::LlamaArch::qwen3, fsdp::LlamaArch::olmo2,
                    fsdp::LlamaArch::phi3, fsdp::LlamaArch::gemma3_text, fsdp::LlamaArch::smollm3,
                    fsdp::LlamaArch::granite, fsdp::LlamaArch::olmo3, fsdp::LlamaArch::gemma2,
                    fsdp::LlamaArch::gemma, fsdp::LlamaArch::exaone4, fsdp::LlamaArch::qwen3_moe,
                    fsdp::LlamaArch::mixtral, fsdp::LlamaArch::olmoe, fsdp::LlamaArch::qwen2_moe,
                    fsdp::LlamaArch::glm4_moe, fsdp::LlamaArch::deepseek_v3,
                    fsdp::LlamaArch::deepseek_v2, fsdp::LlamaArch::gpt_oss,
                    fsdp::LlamaArch::llama4_text, fsdp::LlamaArch::qwen3_5_text,
                    fsdp::LlamaArch::qwen3_5_moe_text})
    for (auto dtype : {fsdp::DType::f32, fsdp::DType::bf16}) {
      for (auto ckpt : {fsdp::ActivationCheckpointing(false), fsdp::ActivationCheckpointing(true),
                        fsdp::ActivationCheckpointing::first_blocks(2)}) {
        for (bool tied : {false, true}) {
          ModelOptions o;
          if (arch == fsdp::LlamaArch::gemma3_text) make_gemma(o.model);
          if (arch == fsdp::LlamaArch::smollm3) make_smollm3(o.model);
          if (arch == fsdp::LlamaArch::granite) make_granite(o.model);
          if (arch == fsdp::LlamaArch::olmo3) make_olmo3(o.model);
          if (arch == fsdp::LlamaArch::exaone4) make_exaone4(o.model);
          if (arch == fsdp::LlamaArch::qwen3_5_text) make_qwen35(o.model);
          if (is_moe(arch)) make_moe(o.model, arch, true, arch != fsdp::LlamaArch::mixtral);
          o.model.arch = arch;
          o.model.tie_word_embeddings = tied;
          o.model.num_hidden_layers = 3;
          o.mp.param_dtype = dtype;
          o.activation_checkpointing = ckpt;
          Fixture f(o);
          f.loss_and_grads();
          EXPECT_EQ(static_cast<int64_t>(f.be->memory().peak(fsdp::MemCategory::activations)),
                    fsdp::LlamaModel::activation_bytes(o.model, o.B, o.T, dtype, ckpt))
              << fsdp::llama_arch_prefix(arch) << " " << fsdp::to_string(dtype) << " recomputed "
              << ckpt.recomputed(3) << " tied " << tied;
        }
      }
    }
}

// The buffers of document masking (positions and starts; under reset_position_ids the
// per-token RoPE rows, two tables with Gemma 3's sliding layers; Llama 4's chunk starts) are
// in the plan.
TEST(Llama, DocumentMaskingActivationBytesArePlannedAndMeasured) {
  for (auto arch : {fsdp::LlamaArch::llama, fsdp::LlamaArch::gemma3_text,
                    fsdp::LlamaArch::deepseek_v3, fsdp::LlamaArch::llama4_text,
                    fsdp::LlamaArch::qwen3_5_text}) {
    for (bool reset : {false, true}) {
      ModelOptions o;
      if (arch == fsdp::LlamaArch::gemma3_text) make_gemma(o.model);
      if (arch == fsdp::LlamaArch::qwen3_5_text) make_qwen35(o.model);
      if (is_moe(arch)) make_moe(o.model, arch);
      o.model.arch = arch;
      Fixture f(o);
      const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 3, 4};
      f.docs = {positions.data(), reset};
      f.loss_and_grads();
      EXPECT_EQ(static_cast<int64_t>(f.be->memory().peak(fsdp::MemCategory::activations)),
                fsdp::LlamaModel::activation_bytes(o.model, o.B, o.T, fsdp::DType::f32, {},
                                                   {true, reset}))
          << fsdp::llama_arch_prefix(arch) << " reset " << reset;
      EXPECT_GT(fsdp::LlamaModel::activation_bytes(o.model, o.B, o.T, fsdp::DType::f32, {},
                                                   {true, reset}),
                fsdp::LlamaModel::activation_bytes(o.model, o.B, o.T, fsdp::DType::f32));
    }
  }
}

// Llama 3.1's scaling (transformers' _compute_llama3_parameters) at head_dim 8, theta 5e5:
// wavelengths 6.28, 167, 4443, 118k. Against original 8192 / low 1 / high 4 (bounds 8192 and
// 2048) the first two are kept, the third smoothed, the fourth divided by factor; with original
// 1024 / 1 / 32 (bounds 1024, 32) the first is kept, the second smoothed, the rest divided.
// Smoothed: (1 - s) f / factor + s f with s = (original / wavelength - low) / (high - low).
// The RoPE tests' model: 4 heads of head_dim 8 (4 frequencies) at base period `theta`.
fsdp::LlamaConfig rope_model(double theta) {
  fsdp::LlamaConfig c;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.rope_theta = theta;
  return c;
}

TEST(Llama, Llama3RopeScalingRegimes) {
  fsdp::LlamaConfig c = rope_model(5e5);
  const std::vector<double> plain = fsdp::llama_inv_freq(c);
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(plain[i], 1.0 / std::pow(5e5, 2.0 * i / 8.0));
  const double pi = 3.14159265358979323846;
  auto smoothed = [&](int i, double orig, double low, double high) {
    const double s = (orig / (2 * pi / plain[i]) - low) / (high - low);
    EXPECT_GT(s, 0.0);
    EXPECT_LT(s, 1.0);
    return (1 - s) * plain[i] / 8 + s * plain[i];
  };
  c.rope_type = fsdp::LlamaConfig::RopeType::llama3;
  c.rope_factor = 8;
  std::vector<double> s = fsdp::llama_inv_freq(c);
  EXPECT_DOUBLE_EQ(s[0], plain[0]);
  EXPECT_DOUBLE_EQ(s[1], plain[1]);
  EXPECT_NEAR(s[2], smoothed(2, 8192, 1, 4), 1e-15);
  EXPECT_DOUBLE_EQ(s[3], plain[3] / 8);
  c.rope_original_max_position_embeddings = 1024;
  c.rope_high_freq_factor = 32;
  s = fsdp::llama_inv_freq(c);
  EXPECT_DOUBLE_EQ(s[0], plain[0]);
  EXPECT_NEAR(s[1], smoothed(1, 1024, 1, 32), 1e-15);
  EXPECT_DOUBLE_EQ(s[2], plain[2] / 8);
  EXPECT_DOUBLE_EQ(s[3], plain[3] / 8);
  // Equal factors (Llama 4 Scout's 1 and 1): a cut-off at original / 1, no band between
  c.rope_high_freq_factor = 1;
  c.rope_original_max_position_embeddings = 1000;  // wavelengths ~6.3, ~167, ~4443, ~1.2e5
  s = fsdp::llama_inv_freq(c);
  EXPECT_DOUBLE_EQ(s[0], plain[0]);
  EXPECT_DOUBLE_EQ(s[1], plain[1]);
  EXPECT_DOUBLE_EQ(s[2], plain[2] / 8);
  EXPECT_DOUBLE_EQ(s[3], plain[3] / 8);
}

// YaRN (transformers' _compute_yarn_parameters) at head_dim 8, theta 1e4, original 2048,
// factor 4: beta_fast 32 and beta_slow 1 rotations sit at dimensions 1.008 and 2.51, truncated
// to [1, 3], so pair 2 is half interpolated; untruncated, (2 - 1.008) / (2.51 - 1.008) of it.
// cos and sin scale by 1 + 0.1 ln 4 unless attention_factor is given (and by 1 for factor <= 1).
// linear divides every frequency by its factor.
TEST(Llama, YarnAndLinearRopeScaling) {
  fsdp::LlamaConfig c = rope_model(1e4);
  const std::vector<double> plain = fsdp::llama_inv_freq(c);
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(c), 1.0);
  c.rope_type = fsdp::LlamaConfig::RopeType::linear;
  c.rope_factor = 2;
  std::vector<double> f = fsdp::llama_inv_freq(c);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[i], plain[i] / 2) << i;
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(c), 1.0);

  c.rope_type = fsdp::LlamaConfig::RopeType::yarn;
  c.rope_factor = 4;
  c.rope_original_max_position_embeddings = 2048;
  f = fsdp::llama_inv_freq(c);
  const double want_ratio[4] = {1, 1, 0.625, 0.25};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i] / plain[i], want_ratio[i], 1e-15) << i;
  EXPECT_DOUBLE_EQ(fsdp::llama_rope_attention_scaling(c), 1 + 0.1 * std::log(4.0));
  const double pi = 3.14159265358979323846;
  auto dim = [&](double r) { return 8 * std::log(2048 / (2 * pi * r)) / (2 * std::log(1e4)); };
  EXPECT_NEAR(dim(32), 1.008, 1e-3);
  EXPECT_NEAR(dim(1), 2.51, 1e-2);
  c.rope_truncate = false;
  f = fsdp::llama_inv_freq(c);
  const double ramp = (2 - dim(32)) / (dim(1) - dim(32));
  EXPECT_NEAR(f[1] / plain[1], 1 - 0.75 * std::max(0.0, (1 - dim(32)) / (dim(1) - dim(32))), 1e-15);
  EXPECT_NEAR(f[2] / plain[2], (1 - ramp) + ramp / 4, 1e-15);
  EXPECT_NEAR(f[3] / plain[3], 0.25, 1e-15);
  c.rope_attention_factor = 0.7;
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(c), 0.7);
  c.rope_attention_factor = 0;
  c.rope_factor = 0.5;
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(c), 1.0);
}

TEST(Llama, InitialisationFollowsHf) {
  ModelOptions o;
  o.model.attention_bias = true;
  fsdp::FsdpConfig fc = llama_wrap();
  fc.auto_wrap_policy = fsdp::AutoWrapPolicy::NO_WRAP;
  o.model.hidden_size = 64;
  o.model.intermediate_size = 96;
  Fixture f(o, fc);
  const auto params = f.engine.gather_full_params();
  auto stdev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += static_cast<double>(x) * x;
    }
    const double m = s / static_cast<double>(v.size());
    return std::sqrt(s2 / static_cast<double>(v.size()) - m * m);
  };
  std::vector<float> emb = params.at("model.embed_tokens.weight");
  ASSERT_EQ(emb.size(), 128u * 64u);
  for (std::size_t k = 11 * 64; k < emb.size(); ++k) ASSERT_EQ(emb[k], 0.f) << "pad " << k;
  emb.resize(11 * 64);
  EXPECT_NEAR(stdev(emb), 0.02, 0.004);
  EXPECT_NEAR(stdev(params.at("model.layers.0.mlp.down_proj.weight")), 0.02, 0.003);
  EXPECT_NEAR(stdev(params.at("model.layers.1.self_attn.q_proj.weight")), 0.02, 0.003);
  for (float x : params.at("model.layers.0.input_layernorm.weight")) EXPECT_EQ(x, 1.f);
  for (float x : params.at("model.norm.weight")) EXPECT_EQ(x, 1.f);
  for (float x : params.at("model.layers.0.self_attn.k_proj.bias")) EXPECT_EQ(x, 0.f);
  EXPECT_TRUE(params.count("lm_head.weight"));
}

}  // namespace

// `family` refuses config.json `hf` with an input error (exit 2) whose line holds `needle`.
void expect_refused(const fsdp::ModelFamily& family, const nlohmann::json& hf,
                    const std::string& needle) {
  try {
    family.from_hf_config(hf, "config.json");
    ADD_FAILURE() << "accepted: " << hf.dump();
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Phi-3's config.json: Phi-4 14B's and Phi-4-mini's (partial rotary embedding, LongRoPE) are
// read as written, in transformers 4's and 5's spellings; what fsdp_train does not implement
// (dropout, another rope type) and what disagrees with itself is refused by name.
TEST(Llama, Phi3ConfigJson) {
  const fsdp::ModelFamily& phi3 = fsdp::model_family("phi3");
  const nlohmann::json phi4 = {
      {"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}, {"vocab_size", 100352},
      {"hidden_size", 5120}, {"intermediate_size", 17920}, {"num_hidden_layers", 40},
      {"num_attention_heads", 40}, {"num_key_value_heads", 10},
      {"max_position_embeddings", 16384}, {"original_max_position_embeddings", 16384},
      {"rms_norm_eps", 1e-5}, {"rope_theta", 250000.0}, {"rope_scaling", nullptr},
      {"sliding_window", nullptr}, {"tie_word_embeddings", false}, {"hidden_act", "silu"},
      {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attention_dropout", 0.0},
      {"partial_rotary_factor", 1.0}, {"bos_token_id", 100257}, {"eos_token_id", 100265}};
  fsdp::LlamaConfig g = fsdp::LlamaConfig::from(phi3.from_hf_config(phi4, "phi4.json"));
  EXPECT_EQ(g.arch, fsdp::LlamaArch::phi3);
  EXPECT_EQ(g.kv_heads(), 10);
  EXPECT_EQ(g.head_size(), 128);
  EXPECT_EQ(g.rotary_dim(), 128);
  EXPECT_EQ(g.sliding_window, 0);
  EXPECT_EQ(g.rope_theta, 250000.0);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::default_);

  // Phi-4-mini's shape: 24 heads of 128, 96 of them rotated, LongRoPE from 4096 to 131072.
  std::vector<double> short_f, long_f;
  for (int i = 0; i < 48; ++i) {
    short_f.push_back(1.0 + 0.01 * i);
    long_f.push_back(1.0 + 0.5 * i);
  }
  nlohmann::json mini = phi4;
  mini.update({{"vocab_size", 200064}, {"hidden_size", 3072}, {"intermediate_size", 8192},
               {"num_hidden_layers", 32}, {"num_attention_heads", 24}, {"num_key_value_heads", 8},
               {"max_position_embeddings", 131072}, {"original_max_position_embeddings", 4096},
               {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.75},
               {"rope_scaling",
                {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}}},
               {"sliding_window", 262144}, {"tie_word_embeddings", true},
               {"pad_token_id", 199999}});
  const fsdp::ModelConfig mc = phi3.from_hf_config(mini, "phi4-mini.json");
  g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.rotary_dim(), 96);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::longrope);
  EXPECT_EQ(g.rope_short_factor, short_f);
  EXPECT_EQ(g.rope_long_factor, long_f);
  EXPECT_EQ(g.original_max_position_embeddings, 4096);
  // sqrt(1 + ln 32 / ln 4096) = sqrt(17 / 12): the same whichever list is used.
  EXPECT_DOUBLE_EQ(fsdp::llama_rope_attention_scaling(g),
                   std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  const std::vector<double> at4k = fsdp::llama_inv_freq(g, 4096);
  const std::vector<double> at8k = fsdp::llama_inv_freq(g, 4097);
  ASSERT_EQ(at4k.size(), 48u);
  ASSERT_EQ(at8k.size(), 48u);
  for (std::size_t i = 0; i < 48; ++i) {
    const double base = std::pow(10000.0, -2.0 * static_cast<double>(i) / 96.0);
    EXPECT_DOUBLE_EQ(at4k[i], base / short_f[i]) << i;
    EXPECT_DOUBLE_EQ(at8k[i], base / long_f[i]) << i;
  }
  // merge writes it back as transformers 4's Phi3Config takes it (three rope_scaling fields),
  // and reading that gives the same config.
  const nlohmann::json out = phi3.hf_config(mc);
  EXPECT_EQ(out["rope_scaling"],
            nlohmann::json(
                {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}}));
  EXPECT_EQ(out["partial_rotary_factor"], 0.75);
  EXPECT_EQ(out["original_max_position_embeddings"], 4096);
  EXPECT_EQ(fsdp::model_config_json(phi3.from_hf_config(out, "merged.json")),
            fsdp::model_config_json(mc));
  // transformers 5's spelling: one rope_parameters dict with the theta, type and the fraction.
  nlohmann::json v5 = mini;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0},
                           {"partial_rotary_factor", 0.75}, {"short_factor", short_f},
                           {"long_factor", long_f}, {"original_max_position_embeddings", 4096}};
  EXPECT_EQ(fsdp::model_config_json(phi3.from_hf_config(v5, "v5.json")),
            fsdp::model_config_json(mc));
  // Phi-3-128k's legacy "su" is longrope.
  nlohmann::json su = mini;
  su["rope_scaling"]["type"] = "su";
  EXPECT_EQ(fsdp::model_config_json(phi3.from_hf_config(su, "su.json")),
            fsdp::model_config_json(mc));

  auto refused = [&](const nlohmann::json& hf, const std::string& needle) {
    expect_refused(phi3, hf, needle);
  };
  nlohmann::json hf = phi4;
  hf["resid_pdrop"] = 0.1;
  refused(hf, "\"resid_pdrop\" 0.1 is not supported (expected 0.0)");
  hf = mini;
  hf["rope_scaling"]["factor"] = 16.0;  // transformers 5 would scale by it
  refused(hf, "\"rope_scaling.factor\" 16.0 is not supported (expected none, or "
              "max_position_embeddings / original_max_position_embeddings = 131072 / 4096)");
  hf["rope_scaling"]["factor"] = 32.0;  // the ratio itself is fine
  EXPECT_NO_THROW(phi3.from_hf_config(hf, "config.json"));
  hf = v5;
  hf["partial_rotary_factor"] = 0.5;
  refused(hf, "\"rope_parameters.partial_rotary_factor\" 0.75 is not supported (expected the "
              "top-level partial_rotary_factor 0.5)");
  hf = mini;
  hf["rope_scaling"]["type"] = "dynamic";
  refused(hf, "unknown value \"dynamic\" (expected one of default, longrope)");

  // A TOML's: another rope type, factor lists of the wrong length, an odd rotated width.
  auto toml_error = [](const std::string& model) {
    try {
      fsdp::parse_config("[data]\nsource = \"synthetic\"\n[model]\ntype = \"phi3\"\n" + model,
                         "input.toml", {});
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(toml_error("rope_scaling = { rope_type = \"yarn\" }\n")
                .find("model.rope_scaling.rope_type: unknown value \"yarn\" (expected one of "
                      "default, longrope)"),
            std::string::npos);
  // the default 4 heads of 32: 16 rotated columns, 8 frequencies
  EXPECT_NE(toml_error("rope_scaling = { rope_type = \"longrope\", short_factor = [1.0], "
                       "long_factor = [1, 1, 1, 1, 1, 1, 1, 1] }\npartial_rotary_factor = 0.5\n")
                .find("model.rope_scaling.short_factor: 1 numbers (expected rotary_dim / 2 = 8"),
            std::string::npos);
  EXPECT_NE(toml_error("rope_scaling = { short_factor = [1.0, -1.0] }\n")
                .find("model.rope_scaling.short_factor: element 1 = -1 is out of range"),
            std::string::npos);
  EXPECT_NE(toml_error("partial_rotary_factor = 0.3\n")
                .find("model.partial_rotary_factor: 0.3 rotates int(32 * 0.3) = 9 columns of each "
                      "head (expected an even number >= 2)"),
            std::string::npos);
  EXPECT_EQ(toml_error("rope_scaling = { rope_type = \"longrope\", short_factor = [1, 2, 3, 4, 5, "
                       "6, 7, 8, 9, 10, 11, 12], long_factor = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, "
                       "12] }\npartial_rotary_factor = 0.75\n"),
            "accepted");
  try {  // LongRoPE is Phi-3's
    fsdp::parse_config("[model]\ntype = \"llama\"\nrope_scaling = { rope_type = \"longrope\" }\n",
                       "input.toml", {});
    ADD_FAILURE() << "llama with longrope accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown value \"longrope\""), std::string::npos)
        << e.what();
  }
}

// Gemma3TextModel's initialisation: every RMSNorm weight 0 (the norms multiply by 1 + weight)
// and the padding token's embedding row 0 (nn.Embedding's padding_idx).
TEST(Llama, Gemma3InitialisesNormsToZeroAndThePaddingRow) {
  ModelOptions o;
  make_gemma(o.model);
  o.model.pad_token_id = 4;
  o.model.hidden_size = 64;
  fsdp::FsdpConfig fc = llama_wrap(o.model.arch);
  fc.auto_wrap_policy = fsdp::AutoWrapPolicy::NO_WRAP;
  Fixture f(o, fc);
  const auto params = f.engine.gather_full_params();
  for (const char* norm :
       {"model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.1.pre_feedforward_layernorm.weight",
        "model.layers.1.post_feedforward_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
        "model.norm.weight"}) {
    ASSERT_TRUE(params.count(norm)) << norm;
    for (float x : params.at(norm)) EXPECT_EQ(x, 0.f) << norm;
  }
  const std::vector<float>& emb = params.at("model.embed_tokens.weight");
  int zeros = 0, nonzero_rows = 0;
  for (int64_t r = 0; r < 11; ++r) {
    bool any = false;
    for (int64_t c = 0; c < 64; ++c) {
      const float x = emb[static_cast<std::size_t>(r * 64 + c)];
      if (r == 4) zeros += x == 0.f;
      any = any || x != 0.f;
    }
    nonzero_rows += any;
  }
  EXPECT_EQ(zeros, 64) << "row pad_token_id = 4";
  EXPECT_EQ(nonzero_rows, 10);
}

// A parameter's values (`grad`: its gradient) by name on one rank (the shard is the tensor).
std::vector<float> named(Fixture& f, const std::string& name, bool grad) {
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* p = grad ? f.engine.shard_grad(u).f32() : f.engine.shard_param(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      if (e.spec.name == name) return {p + e.offset, p + e.offset + e.spec.numel()};
    }
  }
  ADD_FAILURE() << "no parameter " << name;
  return {};
}
void set_named(Fixture& f, const std::string& name, const std::vector<float>& v) {
  for (int u = 0; u < f.engine.num_units(); ++u) {
    for (const auto& e : f.engine.layout(u).entries) {
      if (e.spec.name == name)
        std::copy(v.begin(), v.end(), f.engine.shard_param(u).f32() + e.offset);
    }
  }
}

// The padding row gets nothing from the lookup (nn.Embedding's padding_idx): untied, its
// gradient is 0; tied, it is exactly the LM head's part, the gradient an untied model with a
// copied lm_head gives lm_head's row (the model keeps the row across the lookup's backward).
TEST(Llama, Gemma3PaddingRowGetsNoLookupGradient) {
  ModelOptions o;
  make_gemma(o.model);
  o.model.tie_word_embeddings = false;
  o.model.pad_token_id = Fixture(o).tokens[2];  // a token of the batch
  const int64_t pad = o.model.pad_token_id, C = o.model.hidden_size;
  Fixture untied(o);
  o.model.tie_word_embeddings = true;
  Fixture tied(o);
  perturb_shards(tied);
  for (int u = 0; u < tied.engine.num_units(); ++u) {
    for (const auto& e : tied.engine.layout(u).entries) {
      set_named(untied, e.spec.name, named(tied, e.spec.name, false));
    }
  }
  set_named(untied, "lm_head.weight", named(tied, "model.embed_tokens.weight", false));
  EXPECT_TRUE(same_bits(untied.loss_and_grads(), tied.loss_and_grads()));
  auto row = [&](const std::vector<float>& g, int64_t r) {
    return std::vector<float>(g.begin() + r * C, g.begin() + (r + 1) * C);
  };
  const std::vector<float> emb_u = named(untied, "model.embed_tokens.weight", true);
  const std::vector<float> head_u = named(untied, "lm_head.weight", true);
  const std::vector<float> emb_t = named(tied, "model.embed_tokens.weight", true);
  EXPECT_EQ(row(emb_u, pad), std::vector<float>(static_cast<std::size_t>(C), 0.f));
  EXPECT_NE(row(emb_u, tied.tokens[0] == pad ? tied.tokens[1] : tied.tokens[0]),
            std::vector<float>(static_cast<std::size_t>(C), 0.f));
  EXPECT_EQ(row(emb_t, pad), row(head_u, pad));
  EXPECT_NE(row(emb_t, pad), std::vector<float>(static_cast<std::size_t>(C), 0.f));
}

// Gemma 3 1B's config.json (google/gemma-3-1b-pt, transformers 4.50's spelling) is read as
// written; transformers 5's rope_parameters and layer_types spellings give the same model;
// what fsdp_train does not implement is refused by name.
TEST(Llama, Gemma3ConfigJson) {
  const fsdp::ModelFamily& gemma = fsdp::model_family("gemma3_text");
  const nlohmann::json g1b = {{"architectures", {"Gemma3ForCausalLM"}},
                              {"attention_bias", false},
                              {"attention_dropout", 0.0},
                              {"attn_logit_softcapping", nullptr},
                              {"bos_token_id", 2},
                              {"cache_implementation", "hybrid"},
                              {"eos_token_id", 1},
                              {"final_logit_softcapping", nullptr},
                              {"head_dim", 256},
                              {"hidden_activation", "gelu_pytorch_tanh"},
                              {"hidden_size", 1152},
                              {"initializer_range", 0.02},
                              {"intermediate_size", 6912},
                              {"max_position_embeddings", 32768},
                              {"model_type", "gemma3_text"},
                              {"num_attention_heads", 4},
                              {"num_hidden_layers", 26},
                              {"num_key_value_heads", 1},
                              {"pad_token_id", 0},
                              {"query_pre_attn_scalar", 256},
                              {"rms_norm_eps", 1e-06},
                              {"rope_local_base_freq", 10000},
                              {"rope_scaling", nullptr},
                              {"rope_theta", 1000000},
                              {"sliding_window", 512},
                              {"sliding_window_pattern", 6},
                              {"torch_dtype", "bfloat16"},
                              {"use_cache", true},
                              {"vocab_size", 262144}};
  const fsdp::ModelConfig mc = gemma.from_hf_config(g1b, "gemma-3-1b.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::gemma3_text);
  EXPECT_EQ(g.head_size(), 256);
  EXPECT_EQ(g.kv_heads(), 1);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_EQ(g.sliding_window, 512);
  EXPECT_EQ(g.rope_local_base_freq, 1e4);
  for (int64_t l = 0; l < 26; ++l) {
    EXPECT_EQ(g.layer_window(l), (l + 1) % 6 == 0 ? 0 : 512) << l;
    EXPECT_EQ(g.layer_local_rope(l), (l + 1) % 6 != 0) << l;
  }
  EXPECT_DOUBLE_EQ(g.attention_scale(), 1.0 / 16);
  EXPECT_DOUBLE_EQ(g.embed_scale(), std::sqrt(1152.0));
  EXPECT_EQ(fsdp::llama_inv_freq(fsdp::llama_local_rope_config(g))[1], std::pow(1e4, -2.0 / 256));
  // fsdp_merge's config.json reads back to the same model.
  const nlohmann::json out = gemma.hf_config(mc);
  EXPECT_EQ(out.at("architectures"), nlohmann::json::array({"Gemma3ForCausalLM"}));
  EXPECT_EQ(out.at("layer_types").size(), 26u);
  EXPECT_EQ(out.at("layer_types")[5], "full_attention");
  EXPECT_FALSE(out.contains("hidden_act"));
  EXPECT_EQ(gemma.canonical(gemma.from_hf_config(out, "merged.json")), gemma.canonical(mc));
  // transformers 5: rope_parameters per layer type, layer_types instead of the pattern.
  nlohmann::json v5 = g1b;
  v5.erase("rope_theta");
  v5.erase("rope_local_base_freq");
  v5.erase("rope_scaling");
  v5.erase("sliding_window_pattern");
  v5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  v5["layer_types"] = out.at("layer_types");
  const fsdp::LlamaConfig g5 = fsdp::LlamaConfig::from(gemma.from_hf_config(v5, "v5.json"));
  EXPECT_EQ(g5.sliding_window_pattern, 6);
  EXPECT_EQ(g5.rope_theta, 1e6);
  EXPECT_EQ(g5.rope_local_base_freq, 1e4);
  EXPECT_EQ(g5.rope_type, fsdp::LlamaConfig::RopeType::linear);
  EXPECT_EQ(g5.rope_factor, 8.0);
  nlohmann::json none = g1b;
  none["pad_token_id"] = nullptr;
  EXPECT_EQ(fsdp::LlamaConfig::from(gemma.from_hf_config(none, "c.json")).pad_token_id, -1);
  auto refused = [&](const nlohmann::json& hf, const std::string& needle) {
    expect_refused(gemma, hf, needle);
  };
  nlohmann::json hf = g1b;
  hf["final_logit_softcapping"] = 30.0;  // Gemma 2's
  refused(hf, "config.json: \"final_logit_softcapping\" 30.0 is not supported (expected null)");
  hf = g1b;
  hf["hidden_activation"] = "gelu";
  refused(hf, "\"hidden_activation\" \"gelu\" is not supported");
  hf = g1b;
  hf["use_bidirectional_attention"] = true;  // EmbeddingGemma
  refused(hf, "\"use_bidirectional_attention\" true is not supported");
  hf = v5;
  hf["layer_types"][0] = "full_attention";
  refused(hf, "\"layer_types\"");
  hf = v5;
  hf["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  refused(hf, "rope_parameters.sliding_attention.rope_type");
  hf = v5;  // malformed, not a crash: one line naming the attribute
  hf["rope_parameters"]["full_attention"] = 5;
  refused(hf, "\"rope_parameters.full_attention\" 5 is not supported (expected a dict)");
  hf = v5;
  hf["rope_parameters"]["full_attention"]["rope_type"] = 3;
  refused(hf, "\"rope_parameters.full_attention.rope_type\" 3 is not supported");
  hf = g1b;
  hf["use_bidirectional_attention"] = "yes";
  refused(hf, "\"use_bidirectional_attention\" \"yes\" is not supported (expected false)");
  hf = g1b;
  hf["layer_types"] = "sliding";
  refused(hf, "\"layer_types\" \"sliding\" is not supported");
  try {
    fsdp::parse_config("[model]\ntype = \"gemma3_text\"\nvocab_size = 8\npad_token_id = 8\n",
                       "input.toml", {});
    ADD_FAILURE() << "pad_token_id outside the vocabulary accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.pad_token_id: 8 is out of range"),
              std::string::npos)
        << e.what();
  }
}

// Gemma 2 2B's config.json (google/gemma-2-2b, transformers 4.42's spelling) is read as
// written: its soft-caps, the even layers sliding with one RoPE, GeGLU, query_pre_attn_scalar;
// fsdp_merge's config.json reads back to the same model; null soft-caps are 0 and written null;
// layer_types other than the even layers sliding, and another activation, are refused.
TEST(Llama, Gemma2ConfigJson) {
  const fsdp::ModelFamily& gemma = fsdp::model_family("gemma2");
  const nlohmann::json g2b = {{"architectures", {"Gemma2ForCausalLM"}},
                              {"attention_bias", false},
                              {"attention_dropout", 0.0},
                              {"attn_logit_softcapping", 50.0},
                              {"bos_token_id", 2},
                              {"cache_implementation", "hybrid"},
                              {"eos_token_id", 1},
                              {"final_logit_softcapping", 30.0},
                              {"head_dim", 256},
                              {"hidden_act", "gelu_pytorch_tanh"},
                              {"hidden_activation", "gelu_pytorch_tanh"},
                              {"hidden_size", 2304},
                              {"initializer_range", 0.02},
                              {"intermediate_size", 9216},
                              {"max_position_embeddings", 8192},
                              {"model_type", "gemma2"},
                              {"num_attention_heads", 8},
                              {"num_hidden_layers", 26},
                              {"num_key_value_heads", 4},
                              {"pad_token_id", 0},
                              {"query_pre_attn_scalar", 256},
                              {"rms_norm_eps", 1e-06},
                              {"rope_theta", 10000.0},
                              {"sliding_window", 4096},
                              {"torch_dtype", "float32"},
                              {"use_cache", true},
                              {"vocab_size", 256000}};
  const fsdp::ModelConfig mc = gemma.from_hf_config(g2b, "gemma-2-2b.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::gemma2);
  EXPECT_EQ(g.head_size(), 256);
  EXPECT_EQ(g.kv_heads(), 4);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_FLOAT_EQ(g.attention_softcap(), 50.f);
  EXPECT_FLOAT_EQ(g.logit_softcap(), 30.f);
  for (int64_t l = 0; l < 26; ++l) {
    EXPECT_EQ(g.layer_window(l), l % 2 == 0 ? 4096 : 0) << l;
    EXPECT_FALSE(g.layer_local_rope(l)) << l;
    EXPECT_TRUE(g.layer_rope(l)) << l;
  }
  EXPECT_FALSE(g.qk_norm());
  EXPECT_TRUE(g.norm_after() && g.norm_before() && g.norm_weight_offset() && g.gelu_mlp());
  EXPECT_DOUBLE_EQ(g.attention_scale(), 1.0 / 16);
  EXPECT_DOUBLE_EQ(g.embed_scale(), std::sqrt(2304.0));
  // The module names are Gemma2ForCausalLM's state dict: four norms a layer, no q_norm.
  std::vector<std::string> layer0;
  for (const fsdp::ModuleDecl& m : fsdp::llama_modules(g)) {
    if (m.name != "model.layers.0") continue;
    EXPECT_EQ(m.cls, "Gemma2DecoderLayer");
    for (const auto& p : m.params) layer0.push_back(p.name);
  }
  const std::string l0 = "model.layers.0.";
  EXPECT_EQ(
      layer0,
      (std::vector<std::string>{
          l0 + "self_attn.q_proj.weight", l0 + "self_attn.k_proj.weight",
          l0 + "self_attn.v_proj.weight", l0 + "self_attn.o_proj.weight",
          l0 + "mlp.gate_proj.weight", l0 + "mlp.up_proj.weight", l0 + "mlp.down_proj.weight",
          l0 + "input_layernorm.weight", l0 + "post_attention_layernorm.weight",
          l0 + "pre_feedforward_layernorm.weight", l0 + "post_feedforward_layernorm.weight"}));
  const nlohmann::json out = gemma.hf_config(mc);
  EXPECT_EQ(out.at("architectures"), nlohmann::json::array({"Gemma2ForCausalLM"}));
  EXPECT_EQ(out.at("attn_logit_softcapping"), 50.0);
  EXPECT_EQ(out.at("final_logit_softcapping"), 30.0);
  EXPECT_EQ(out.at("hidden_activation"), "gelu_pytorch_tanh");
  EXPECT_EQ(out.at("layer_types")[0], "sliding_attention");
  EXPECT_EQ(out.at("layer_types")[1], "full_attention");
  EXPECT_FALSE(out.contains("sliding_window_pattern"));
  EXPECT_EQ(gemma.canonical(gemma.from_hf_config(out, "merged.json")), gemma.canonical(mc));
  // null soft-caps (HF's None) are 0: no cap, and written back as null
  nlohmann::json uncapped = g2b;
  uncapped["attn_logit_softcapping"] = nullptr;
  uncapped["final_logit_softcapping"] = nullptr;
  const fsdp::ModelConfig mu = gemma.from_hf_config(uncapped, "uncapped.json");
  EXPECT_EQ(fsdp::LlamaConfig::from(mu).attention_softcap(), 0.f);
  EXPECT_EQ(fsdp::LlamaConfig::from(mu).logit_softcap(), 0.f);
  EXPECT_TRUE(gemma.hf_config(mu).at("final_logit_softcapping").is_null());
  EXPECT_TRUE(gemma.hf_config(mu).at("attn_logit_softcapping").is_null());
  // transformers 5 spells layer_types out (the even layers sliding): accepted; any other list
  // is refused by name.
  nlohmann::json v5 = g2b;
  v5["layer_types"] = out.at("layer_types");
  EXPECT_EQ(gemma.canonical(gemma.from_hf_config(v5, "v5.json")), gemma.canonical(mc));
  v5["layer_types"][0] = "full_attention";
  expect_refused(gemma, v5, "\"layer_types\"");
  nlohmann::json hf = g2b;
  hf["hidden_activation"] = "gelu";
  expect_refused(gemma, hf, "\"hidden_activation\" \"gelu\" is not supported");
  hf = g2b;
  hf["attn_logit_softcapping"] = -1.0;
  expect_refused(gemma, hf, "attn_logit_softcapping");
}

// Gemma 7B's config.json as the Hub first had it (google/gemma-7b, transformers 4.38's
// spelling: hidden_act "gelu", no hidden_activation) reads as Gemma's tanh GeGLU, as does the
// later file with hidden_activation; Llama's layer (two norms, head_dim^-1/2, no window) with
// Gemma's norms and embedding; merged back to the same model, with both activation fields;
// other activations refused by name.
TEST(Llama, GemmaConfigJson) {
  const fsdp::ModelFamily& gemma = fsdp::model_family("gemma");
  const nlohmann::json g7b = {{"architectures", {"GemmaForCausalLM"}},
                              {"attention_bias", false},
                              {"attention_dropout", 0.0},
                              {"bos_token_id", 2},
                              {"eos_token_id", 1},
                              {"head_dim", 256},
                              {"hidden_act", "gelu"},
                              {"hidden_size", 3072},
                              {"initializer_range", 0.02},
                              {"intermediate_size", 24576},
                              {"max_position_embeddings", 8192},
                              {"model_type", "gemma"},
                              {"num_attention_heads", 16},
                              {"num_hidden_layers", 28},
                              {"num_key_value_heads", 16},
                              {"pad_token_id", 0},
                              {"rms_norm_eps", 1e-06},
                              {"rope_scaling", nullptr},
                              {"rope_theta", 10000.0},
                              {"torch_dtype", "bfloat16"},
                              {"use_cache", true},
                              {"vocab_size", 256000}};
  const fsdp::ModelConfig mc = gemma.from_hf_config(g7b, "gemma-7b.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::gemma);
  EXPECT_EQ(g.head_size(), 256);
  EXPECT_EQ(g.kv_heads(), 16);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_TRUE(g.gemma() && g.norm_weight_offset() && g.gelu_mlp() && g.norm_before());
  EXPECT_FALSE(g.norm_after() || g.qk_norm() || g.patterned_window() || g.local_rope());
  for (int64_t l = 0; l < 28; ++l) EXPECT_EQ(g.layer_window(l), 0) << l;
  EXPECT_EQ(g.attention_softcap(), 0.f);
  EXPECT_EQ(g.logit_softcap(), 0.f);
  EXPECT_DOUBLE_EQ(g.attention_scale(), 1.0 / 16);
  EXPECT_DOUBLE_EQ(g.embed_scale(), std::sqrt(3072.0));
  std::vector<std::string> layer0;
  for (const fsdp::ModuleDecl& m : fsdp::llama_modules(g)) {
    if (m.name == "model.embed_tokens") EXPECT_EQ(m.cls, "GemmaTextScaledWordEmbedding");
    if (m.name != "model.layers.0") continue;
    EXPECT_EQ(m.cls, "GemmaDecoderLayer");
    for (const auto& p : m.params) layer0.push_back(p.name);
  }
  ASSERT_EQ(layer0.size(), 9u);
  EXPECT_EQ(layer0[7], "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(layer0[8], "model.layers.0.post_attention_layernorm.weight");
  nlohmann::json later = g7b;  // the Hub's files now also say hidden_activation
  later["hidden_activation"] = "gelu_pytorch_tanh";
  EXPECT_EQ(gemma.canonical(gemma.from_hf_config(later, "later.json")), gemma.canonical(mc));
  const nlohmann::json out = gemma.hf_config(mc);
  EXPECT_EQ(out.at("architectures"), nlohmann::json::array({"GemmaForCausalLM"}));
  EXPECT_EQ(out.at("hidden_act"), "gelu_pytorch_tanh");
  EXPECT_EQ(out.at("hidden_activation"), "gelu_pytorch_tanh");
  for (const char* absent : {"layer_types", "sliding_window", "query_pre_attn_scalar",
                             "final_logit_softcapping", "attn_logit_softcapping"}) {
    EXPECT_FALSE(out.contains(absent)) << absent;
  }
  EXPECT_EQ(gemma.canonical(gemma.from_hf_config(out, "merged.json")), gemma.canonical(mc));
  nlohmann::json hf = g7b;
  hf["hidden_act"] = "silu";
  expect_refused(gemma, hf, "\"hidden_act\" \"silu\" is not supported");
  hf = later;
  hf["hidden_activation"] = "gelu";
  expect_refused(gemma, hf, "\"hidden_activation\" \"gelu\" is not supported");
}

// EXAONE 4.0 32B's config.json (LGAI-EXAONE/EXAONE-4.0-32B, transformers 4.54's spelling, its
// pattern as the string "LLLG" or the int 4, and with layer_types) reads as one model: three
// sliding layers with RoPE, then a global one without; the 1.2B's null window makes every
// layer global and rotated; fsdp_merge's config.json reads back; other patterns are refused.
TEST(Llama, Exaone4ConfigJson) {
  const fsdp::ModelFamily& exaone = fsdp::model_family("exaone4");
  const nlohmann::json e32b = {{"architectures", {"Exaone4ForCausalLM"}},
                               {"attention_dropout", 0.0},
                               {"bos_token_id", 1},
                               {"eos_token_id", 361},
                               {"head_dim", 128},
                               {"hidden_act", "silu"},
                               {"hidden_size", 5120},
                               {"initializer_range", 0.02},
                               {"intermediate_size", 27392},
                               {"max_position_embeddings", 131072},
                               {"model_type", "exaone4"},
                               {"num_attention_heads", 40},
                               {"num_hidden_layers", 64},
                               {"num_key_value_heads", 8},
                               {"pad_token_id", 0},
                               {"rms_norm_eps", 1e-05},
                               {"rope_scaling",
                                {{"factor", 16.0},
                                 {"high_freq_factor", 4.0},
                                 {"low_freq_factor", 1.0},
                                 {"original_max_position_embeddings", 8192},
                                 {"rope_type", "llama3"}}},
                               {"rope_theta", 1000000},
                               {"sliding_window", 4096},
                               {"sliding_window_pattern", "LLLG"},
                               {"tie_word_embeddings", false},
                               {"torch_dtype", "bfloat16"},
                               {"use_cache", true},
                               {"vocab_size", 102400}};
  const fsdp::ModelConfig mc = exaone.from_hf_config(e32b, "exaone-4.0-32b.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::exaone4);
  EXPECT_EQ(g.sliding_window_pattern, 4);
  EXPECT_EQ(g.head_size(), 128);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::llama3);
  EXPECT_TRUE(g.qk_norm() && g.qk_norm_per_head() && g.norm_after());
  EXPECT_FALSE(g.norm_before() || g.norm_weight_offset() || g.local_rope());
  for (int64_t l = 0; l < 64; ++l) {
    const bool global = (l + 1) % 4 == 0;
    EXPECT_EQ(g.layer_window(l), global ? 0 : 4096) << l;
    EXPECT_EQ(g.layer_rope(l), !global) << l;
  }
  nlohmann::json as_int = e32b;
  as_int["sliding_window_pattern"] = 4;
  EXPECT_EQ(exaone.canonical(exaone.from_hf_config(as_int, "int.json")), exaone.canonical(mc));
  const nlohmann::json out = exaone.hf_config(mc);
  EXPECT_EQ(out.at("architectures"), nlohmann::json::array({"Exaone4ForCausalLM"}));
  EXPECT_EQ(out.at("sliding_window_pattern"), 4);
  ASSERT_EQ(out.at("layer_types").size(), 64u);
  EXPECT_EQ(out.at("layer_types")[2], "sliding_attention");
  EXPECT_EQ(out.at("layer_types")[3], "full_attention");
  EXPECT_EQ(exaone.canonical(exaone.from_hf_config(out, "merged.json")), exaone.canonical(mc));
  // The 1.2B: no window (null), every layer global and rotated.
  nlohmann::json small = e32b;
  small["sliding_window"] = nullptr;
  small["sliding_window_pattern"] = nullptr;
  small["layer_types"] = nlohmann::json::array();
  for (int l = 0; l < 64; ++l) small["layer_types"].push_back("full_attention");
  const fsdp::ModelConfig ms = exaone.from_hf_config(small, "exaone-4.0-1.2b.json");
  const fsdp::LlamaConfig s1 = fsdp::LlamaConfig::from(ms);
  EXPECT_EQ(s1.sliding_window, 0);
  for (int64_t l = 0; l < 64; ++l) {
    EXPECT_EQ(s1.layer_window(l), 0) << l;
    EXPECT_TRUE(s1.layer_rope(l)) << l;
  }
  EXPECT_TRUE(exaone.hf_config(ms).at("sliding_window").is_null());
  EXPECT_EQ(exaone.canonical(exaone.from_hf_config(exaone.hf_config(ms), "m.json")),
            exaone.canonical(ms));
  nlohmann::json hf = e32b;
  hf["sliding_window_pattern"] = "LGLL";
  expect_refused(exaone, hf, "\"sliding_window_pattern\" \"LGLL\" is not supported");
}

// The expert load (Model::take_max_expert_load) is the largest (token, pick) count of one
// expert in one layer over the training micro-batches since the last call, times E / (B T K):
// recounted here from the router logits' top k (GLM-4.5's: of its group-limited sigmoid
// choices, its dense layer 0 counting nothing); an evaluation forward adds nothing; taking it
// resets it; a dense model reports 0.
TEST(Llama, MaxExpertLoadCountsTheTrainingRouting) {
  for (const auto arch : {fsdp::LlamaArch::qwen3_moe, fsdp::LlamaArch::glm4_moe}) {
  SCOPED_TRACE(fsdp::llama_arch_prefix(arch));
  ModelOptions o;
  make_moe(o.model, arch);
  if (arch == fsdp::LlamaArch::qwen3_moe) o.model.num_experts = 5;
  Fixture f(o);
  perturb_shards(f, 3);
  EXPECT_EQ(f.model.take_max_expert_load(), 0.0);
  f.loss();  // evaluation
  EXPECT_EQ(f.model.take_max_expert_load(), 0.0);
  f.loss_and_grads();
  const int64_t E = o.model.num_experts, K = o.model.num_experts_per_tok, BT = o.B * o.T;
  double want = 0;
  for (int64_t l = 0; l < o.model.num_hidden_layers; ++l) {
    const auto rows = ranked_experts(f, o.model, l);
    ASSERT_EQ(static_cast<int64_t>(rows.size()), o.model.layer_sparse(l) ? BT : 0) << l;
    std::vector<int64_t> count(static_cast<std::size_t>(E), 0);
    for (const auto& row : rows) {
      for (std::size_t j = 0; j < static_cast<std::size_t>(K); ++j) {
        ++count[static_cast<std::size_t>(row[j].second)];
      }
    }
    for (int64_t n : count) {
      want = std::max(want, static_cast<double>(n * E) / static_cast<double>(BT * K));
    }
  }
  EXPECT_GT(want, 1.0);
  EXPECT_EQ(f.model.take_max_expert_load(), want);
  EXPECT_EQ(f.model.take_max_expert_load(), 0.0);  // taken
  }
  Fixture dense{ModelOptions{}};
  dense.loss_and_grads();
  EXPECT_EQ(dense.model.take_max_expert_load(), 0.0);
}

// GLM-4.5-Air's config.json (zai-org/GLM-4.5-Air, transformers 4.54's spelling) reads as
// written: 106,852,245,504 parameters (HF's num_parameters; the routers' 45 x 128
// e_score_correction_bias values are buffers beside them), layer 0 dense and the others
// sparse with sigmoid routing, half of each 128-wide head rotated, q/k/v biases without
// o_proj's; its multi-token-prediction layer is not built (the merge writes
// num_nextn_predict_layers 0) and the merged config.json reads back to the same model;
// transformers 5's rope_parameters are read; impossible groups are refused by key.
TEST(Llama, Glm4MoeConfigJson) {
  const fsdp::ModelFamily& glm = fsdp::model_family("glm4_moe");
  const nlohmann::json air = {
      {"architectures", {"Glm4MoeForCausalLM"}}, {"attention_bias", true},
      {"attention_dropout", 0.0}, {"pad_token_id", 151329},
      {"eos_token_id", {151329, 151336, 151338}}, {"head_dim", 128}, {"hidden_act", "silu"},
      {"hidden_size", 4096}, {"partial_rotary_factor", 0.5}, {"initializer_range", 0.02},
      {"intermediate_size", 10944}, {"max_position_embeddings", 131072},
      {"model_type", "glm4_moe"}, {"moe_intermediate_size", 1408}, {"norm_topk_prob", true},
      {"num_attention_heads", 96}, {"n_group", 1}, {"topk_group", 1}, {"n_routed_experts", 128},
      {"n_shared_experts", 1}, {"routed_scaling_factor", 1.0}, {"num_experts_per_tok", 8},
      {"first_k_dense_replace", 1}, {"num_hidden_layers", 46}, {"num_key_value_heads", 8},
      {"rms_norm_eps", 1e-05}, {"rope_scaling", nullptr}, {"rope_theta", 1000000},
      {"num_nextn_predict_layers", 1}, {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"}, {"transformers_version", "4.54.0"}, {"use_cache", true},
      {"use_qk_norm", false}, {"vocab_size", 151552}};
  const fsdp::ModelConfig mc = glm.from_hf_config(air, "config.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  const auto [params, buffers] = parameters_and_buffers(g);
  EXPECT_EQ(params, 106852245504);
  EXPECT_EQ(buffers, 45 * 128);
  EXPECT_TRUE(g.moe());
  EXPECT_TRUE(g.sigmoid_routing());
  EXPECT_FALSE(g.layer_sparse(0));
  EXPECT_TRUE(g.layer_sparse(1));
  EXPECT_TRUE(g.layer_sparse(45));
  EXPECT_EQ(g.mlp_width(0), 10944);
  EXPECT_EQ(g.mlp_width(1), 1408);
  EXPECT_EQ(g.shared_size(), 1408);
  EXPECT_FALSE(g.shared_expert_gated());
  EXPECT_EQ(g.rotary_dim(), 64);
  EXPECT_TRUE(g.qkv_bias());
  EXPECT_FALSE(g.o_bias());
  EXPECT_FALSE(g.qk_norm());
  EXPECT_FALSE(g.aux_loss());
  EXPECT_EQ(g.pad_token_id, 151329);
  EXPECT_EQ(g.rope_theta, 1e6);
  const nlohmann::json out = glm.hf_config(mc);
  EXPECT_EQ(out.at("num_nextn_predict_layers"), 0);
  EXPECT_EQ(out.at("n_routed_experts"), 128);
  EXPECT_FALSE(out.contains("output_router_logits"));
  EXPECT_FALSE(out.contains("num_local_experts"));
  EXPECT_EQ(glm.canonical(glm.from_hf_config(out, "merged.json")), glm.canonical(mc));
  // Names: a dense layer's MLP, a sparse one's router, bias, experts and shared experts.
  for (const std::string name :
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.45.mlp.experts.127.down_proj.weight",
        "model.layers.45.mlp.shared_experts.up_proj.weight",
        "model.layers.3.self_attn.q_proj.bias"}) {
    EXPECT_TRUE(glm.hf_tensor(mc, name, {1}).has_value()) << name;
  }
  for (const std::string name :
       {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate_proj.weight",
        "model.layers.3.self_attn.o_proj.bias", "model.layers.46.mlp.gate.weight"}) {
    EXPECT_FALSE(glm.hf_tensor(mc, name, {1}).has_value()) << name;
  }
  // transformers 5: rope_theta and partial_rotary_factor in rope_parameters
  nlohmann::json v5 = air;
  v5.erase("rope_theta");
  v5.erase("partial_rotary_factor");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0},
                           {"partial_rotary_factor", 0.5}};
  EXPECT_EQ(glm.canonical(glm.from_hf_config(v5, "v5.json")), glm.canonical(mc));
  v5["partial_rotary_factor"] = 1.0;
  expect_refused(glm, v5, "\"rope_parameters.partial_rotary_factor\" 0.5 is not supported");
  // groups that do not divide the experts, more kept than there are
  auto key_error = [](const std::string& model, const std::string& needle) {
    try {
      fsdp::parse_config("[data]\nsource = \"synthetic\"\n[model]\ntype = \"glm4_moe\"\n" + model,
                         "input.toml", {});
      ADD_FAILURE() << "accepted: " << model;
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  key_error("n_routed_experts = 8\nn_group = 3\n",
            "model.n_group: 3 does not divide model.n_routed_experts = 8");
  key_error("n_routed_experts = 8\nn_group = 8\n", "into groups of at least 2 experts");
  key_error("n_routed_experts = 8\nn_group = 2\ntopk_group = 3\n",
            "model.topk_group: 3 exceeds model.n_group = 2");
  key_error("output_router_logits = true\n", "output_router_logits");
}

// DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3, its remote-code spelling: rope_scaling's
// legacy "type", integer yarn numbers, fp8 quantization_config) reads as written: 671,026,404,352
// parameters (the main model's published 671B; the routers' 58 x 256 bias values are buffers
// beside them), layers 0-2 dense, MLA with compressed queries, the scores scaled by
// 192^-1/2 (0.1 ln 40 + 1)^2 and cos / sin by 1 (mscale = mscale_all_dim); the merged
// config.json reads back to the same model; a null q_lora_rank is a plain q_proj;
// num_key_value_heads other than the heads, and values wider than the q/k heads, are refused.
TEST(Llama, DeepseekV3ConfigJson) {
  const fsdp::ModelFamily& ds = fsdp::model_family("deepseek_v3");
  const nlohmann::json v3 = {
      {"architectures", {"DeepseekV3ForCausalLM"}}, {"attention_bias", false},
      {"attention_dropout", 0.0}, {"aux_loss_alpha", 0.001}, {"bos_token_id", 0},
      {"eos_token_id", 1}, {"ep_size", 1}, {"first_k_dense_replace", 3}, {"hidden_act", "silu"},
      {"hidden_size", 7168}, {"initializer_range", 0.02}, {"intermediate_size", 18432},
      {"kv_lora_rank", 512}, {"max_position_embeddings", 163840}, {"model_type", "deepseek_v3"},
      {"moe_intermediate_size", 2048}, {"moe_layer_freq", 1}, {"n_group", 8},
      {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"norm_topk_prob", true},
      {"num_attention_heads", 128}, {"num_experts_per_tok", 8}, {"num_hidden_layers", 61},
      {"num_key_value_heads", 128}, {"num_nextn_predict_layers", 1}, {"q_lora_rank", 1536},
      {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
      {"quantization_config",
       {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
        {"weight_block_size", {128, 128}}}},
      {"rms_norm_eps", 1e-06},
      {"rope_scaling",
       {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 1.0},
        {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}, {"type", "yarn"}}},
      {"rope_theta", 10000}, {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
      {"seq_aux", true}, {"tie_word_embeddings", false}, {"topk_group", 4},
      {"topk_method", "noaux_tc"}, {"torch_dtype", "bfloat16"}, {"use_cache", true},
      {"v_head_dim", 128}, {"vocab_size", 129280}};
  const fsdp::ModelConfig mc = ds.from_hf_config(v3, "config.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  const auto [params, buffers] = parameters_and_buffers(g);
  EXPECT_EQ(params, 671026404352);
  EXPECT_EQ(buffers, 58 * 256);
  EXPECT_TRUE(g.mla());
  EXPECT_TRUE(g.sigmoid_routing());
  EXPECT_FALSE(g.layer_sparse(2));
  EXPECT_TRUE(g.layer_sparse(3));
  EXPECT_EQ(g.head_size(), 192);
  EXPECT_EQ(g.rotary_dim(), 64);
  EXPECT_EQ(g.kv_heads(), 128);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::yarn);
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_EQ(g.attention_scale(), static_cast<float>(std::pow(192.0, -0.5) * m * m));
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(g), 1.0);
  // MFU's FLOPs of one token: 6 x its 36.6G multiply-adds (the published 37B active: MLA's
  // projections, 8 routed and the shared expert, the router, the head) + its one score and value
  const double macs = 36624596992.0 + 61.0 * (128 * 192 + 128 * 128);
  EXPECT_DOUBLE_EQ(ds.train_flops_per_sample(mc, {1, 1}), 6 * macs);
  const nlohmann::json out = ds.hf_config(mc);
  EXPECT_EQ(out.at("num_key_value_heads"), 128);
  EXPECT_EQ(out.at("rope_scaling").at("mscale_all_dim"), 1.0);
  EXPECT_FALSE(out.contains("head_dim"));
  EXPECT_EQ(ds.canonical(ds.from_hf_config(out, "merged.json")), ds.canonical(mc));
  for (const std::string name :
       {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_layernorm.weight",
        "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.0.self_attn.kv_b_proj.weight", "model.layers.2.mlp.down_proj.weight",
        "model.layers.3.mlp.gate.e_score_correction_bias",
        "model.layers.60.mlp.experts.255.up_proj.weight"}) {
    EXPECT_TRUE(ds.hf_tensor(mc, name, {1}).has_value()) << name;
  }
  for (const std::string name : {"model.layers.0.self_attn.q_proj.weight",
                                 "model.layers.0.self_attn.k_proj.weight",
                                 "model.layers.61.self_attn.q_a_proj.weight"}) {
    EXPECT_FALSE(ds.hf_tensor(mc, name, {1}).has_value()) << name;
  }
  nlohmann::json hf = v3;  // DeepSeek-V2-Lite's and Moonlight's plain q_proj
  hf["q_lora_rank"] = nullptr;
  const fsdp::ModelConfig plain = ds.from_hf_config(hf, "lite.json");
  EXPECT_EQ(fsdp::LlamaConfig::from(plain).q_lora_rank, 0);
  EXPECT_TRUE(ds.hf_tensor(plain, "model.layers.0.self_attn.q_proj.weight", {1}).has_value());
  EXPECT_TRUE(ds.hf_config(plain).at("q_lora_rank").is_null());
  EXPECT_EQ(ds.canonical(ds.from_hf_config(ds.hf_config(plain), "m.json")), ds.canonical(plain));
  hf = v3;
  hf["num_key_value_heads"] = 16;
  expect_refused(ds, hf, "\"num_key_value_heads\" 16 is not supported (expected 128");
  try {
    fsdp::parse_config("[data]\nsource = \"synthetic\"\n[model]\ntype = \"deepseek_v3\"\n"
                       "qk_nope_head_dim = 4\nqk_rope_head_dim = 4\nv_head_dim = 12\n",
                       "input.toml", {});
    ADD_FAILURE() << "v_head_dim > qk head accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.v_head_dim: 12 exceeds"), std::string::npos)
        << e.what();
  }
}

// DeepSeek-V2-Lite's config.json (deepseek-ai/DeepSeek-V2-Lite) reads as written: 15,706,484,224
// parameters (the published 15.7B; no router bias: softmax routing), layer 0 dense, MLA with a
// plain q_proj, the scores scaled by 192^-1/2 alone (HF's DeepseekV2Attention has no mscale
// factor) and cos / sin by 1 (mscale = mscale_all_dim); norm_topk_prob is ignored as HF's class
// ignores it; group_limited_greedy routing is refused; the merged config.json reads back.
TEST(Llama, DeepseekV2ConfigJson) {
  const fsdp::ModelFamily& ds = fsdp::model_family("deepseek_v2");
  const nlohmann::json lite = {
      {"architectures", {"DeepseekV2ForCausalLM"}}, {"attention_bias", false},
      {"attention_dropout", 0.0}, {"aux_loss_alpha", 0.001}, {"bos_token_id", 100000},
      {"eos_token_id", 100001}, {"first_k_dense_replace", 1}, {"hidden_act", "silu"},
      {"hidden_size", 2048}, {"initializer_range", 0.02}, {"intermediate_size", 10944},
      {"kv_lora_rank", 512}, {"max_position_embeddings", 163840}, {"model_type", "deepseek_v2"},
      {"moe_intermediate_size", 1408}, {"moe_layer_freq", 1}, {"n_group", 1},
      {"n_routed_experts", 64}, {"n_shared_experts", 2}, {"norm_topk_prob", false},
      {"num_attention_heads", 16}, {"num_experts_per_tok", 6}, {"num_hidden_layers", 27},
      {"num_key_value_heads", 16}, {"pretraining_tp", 1}, {"q_lora_rank", nullptr},
      {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"rms_norm_eps", 1e-06},
      {"rope_scaling",
       {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 0.707},
        {"mscale_all_dim", 0.707}, {"original_max_position_embeddings", 4096}, {"type", "yarn"}}},
      {"rope_theta", 10000}, {"routed_scaling_factor", 1.0}, {"scoring_func", "softmax"},
      {"seq_aux", true}, {"tie_word_embeddings", false}, {"topk_group", 1},
      {"topk_method", "greedy"}, {"torch_dtype", "bfloat16"}, {"use_cache", true},
      {"v_head_dim", 128}, {"vocab_size", 102400}};
  const fsdp::ModelConfig mc = ds.from_hf_config(lite, "config.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  const auto [params, buffers] = parameters_and_buffers(g);
  EXPECT_EQ(params, 15706484224);
  EXPECT_EQ(buffers, 0);
  EXPECT_TRUE(g.mla());
  EXPECT_FALSE(g.sigmoid_routing());
  EXPECT_FALSE(g.normalize_top_k());
  EXPECT_EQ(g.q_lora_rank, 0);
  EXPECT_FALSE(g.layer_sparse(0));
  EXPECT_TRUE(g.layer_sparse(26));
  EXPECT_EQ(g.attention_scale(), static_cast<float>(std::pow(192.0, -0.5)));
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(g), 1.0);
  EXPECT_TRUE(ds.hf_tensor(mc, "model.layers.1.mlp.gate.weight", {1}).has_value());
  EXPECT_FALSE(ds.hf_tensor(mc, "model.layers.1.mlp.gate.e_score_correction_bias", {1}));
  EXPECT_EQ(ds.canonical(ds.from_hf_config(ds.hf_config(mc), "merged.json")), ds.canonical(mc));
  nlohmann::json hf = lite;
  hf["norm_topk_prob"] = true;  // (HF's DeepseekV2Moe never renormalises)
  EXPECT_FALSE(fsdp::LlamaConfig::from(ds.from_hf_config(hf, "n.json")).normalize_top_k());
  hf = lite;
  hf["topk_method"] = "group_limited_greedy";
  expect_refused(ds, hf, "\"topk_method\" \"group_limited_greedy\" is not supported (expected "
                         "\"greedy\")");
}

// openai/gpt-oss-20b's config.json (with its MXFP4 quantization_config: init_from dequantizes
// the experts, test_init_from's InitFromMxfp4) reads as written: 20,914,757,184 parameters (HF's
// count; the model card's 20.9B; 116,829,156,672 for gpt-oss-120b's 36 layers of 128 experts),
// every layer sparse with the router's bias and the packed experts, even layers sliding over 128
// positions, yarn 32x from 4096 not truncated, attention biases whatever attention_bias says; the
// merged config.json reads back; another quantization method, another swiglu_limit and another
// layer_types list are refused by name.
TEST(Llama, GptOssConfigJson) {
  const fsdp::ModelFamily& oss = fsdp::model_family("gpt_oss");
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < 24; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  const nlohmann::json published = {
      {"architectures", {"GptOssForCausalLM"}}, {"attention_bias", true},
      {"attention_dropout", 0.0}, {"eos_token_id", 200002}, {"experts_per_token", 4},
      {"head_dim", 64}, {"hidden_act", "silu"}, {"hidden_size", 2880},
      {"initial_context_length", 4096}, {"initializer_range", 0.02},
      {"intermediate_size", 2880}, {"layer_types", types}, {"max_position_embeddings", 131072},
      {"model_type", "gpt_oss"}, {"num_attention_heads", 64}, {"num_experts_per_tok", 4},
      {"num_hidden_layers", 24}, {"num_key_value_heads", 8}, {"num_local_experts", 32},
      {"output_router_logits", false}, {"pad_token_id", 199999}, {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 32.0},
        {"original_max_position_embeddings", 4096}, {"rope_type", "yarn"}, {"truncate", false}}},
      {"rope_theta", 150000}, {"router_aux_loss_coef", 0.9}, {"sliding_window", 128},
      {"swiglu_limit", 7.0}, {"tie_word_embeddings", false}, {"transformers_version", "4.55.0"},
      {"use_cache", true}, {"vocab_size", 201088},
      {"quantization_config",
       {{"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
          "lm_head"}},
        {"quant_method", "mxfp4"}}}};
  const fsdp::ModelConfig mc = oss.from_hf_config(published, "config.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  const auto [params, buffers] = parameters_and_buffers(g);
  EXPECT_EQ(params, 20914757184);
  EXPECT_EQ(buffers, 0);
  fsdp::LlamaConfig big = g;
  big.num_hidden_layers = 36;
  big.num_experts = 128;
  EXPECT_EQ(parameters_and_buffers(big).first, 116829156672);
  EXPECT_TRUE(g.layer_sparse(0) && g.layer_sparse(23));
  EXPECT_TRUE(g.packed_experts() && g.attention_sinks() && g.normalize_top_k());
  EXPECT_TRUE(g.qkv_bias() && g.o_bias());
  EXPECT_EQ(g.layer_window(0), 128);
  EXPECT_EQ(g.layer_window(1), 0);
  EXPECT_EQ(g.pad_token_id, 199999);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::yarn);
  EXPECT_FALSE(g.rope_truncate);
  EXPECT_EQ(g.rope_factor, 32.0);
  EXPECT_EQ(g.num_experts, 32);
  EXPECT_EQ(g.expert_size(), 2880);
  EXPECT_TRUE(oss.hf_tensor(mc, "model.layers.3.mlp.experts.gate_up_proj", {1}).has_value());
  EXPECT_TRUE(oss.hf_tensor(mc, "model.layers.3.self_attn.sinks", {1}).has_value());
  EXPECT_TRUE(oss.hf_tensor(mc, "model.layers.3.mlp.router.bias", {1}).has_value());
  EXPECT_FALSE(oss.hf_packed(mc, "model.layers.3.mlp.experts.gate_up_proj").has_value());
  const auto mx = oss.hf_mxfp4(mc, "model.layers.3.mlp.experts.down_proj");
  ASSERT_TRUE(mx.has_value());
  EXPECT_EQ(mx->blocks, "model.layers.3.mlp.experts.down_proj_blocks");
  EXPECT_EQ(mx->scales, "model.layers.3.mlp.experts.down_proj_scales");
  EXPECT_EQ(std::vector<int64_t>({mx->experts, mx->rows, mx->cols}),
            std::vector<int64_t>({32, 2880, 2880}));
  EXPECT_EQ(oss.hf_mxfp4(mc, "model.layers.3.mlp.experts.gate_up_proj")->rows, 5760);
  EXPECT_FALSE(oss.hf_mxfp4(mc, "model.layers.3.mlp.router.weight").has_value());
  nlohmann::json back = oss.hf_config(mc);
  EXPECT_EQ(back["attention_bias"], true);
  EXPECT_EQ(back["swiglu_limit"], 7.0);
  EXPECT_EQ(back["layer_types"], types);
  EXPECT_EQ(back["rope_scaling"]["truncate"], false);
  EXPECT_EQ(oss.canonical(oss.from_hf_config(back, "merged.json")), oss.canonical(mc));
  nlohmann::json hf = published;
  hf["attention_bias"] = false;  // (GptOssConfig sets it true whatever it is given)
  EXPECT_TRUE(fsdp::LlamaConfig::from(oss.from_hf_config(hf, "b.json")).o_bias());
  hf = published;
  hf["quantization_config"] = {{"quant_method", "fp8"}};
  expect_refused(oss, hf, "config.json: \"quantization_config\" fp8 is not supported (expected "
                          "none, or the Hub's \"mxfp4\" experts)");
  hf = published;
  hf["swiglu_limit"] = 10.0;
  expect_refused(oss, hf, "\"swiglu_limit\" 10.0 is not supported (expected 7.0");
  hf = published;
  hf["layer_types"][0] = "full_attention";
  expect_refused(oss, hf, "\"layer_types\"");
}

// Llama 4 Scout's config.json (meta-llama/Llama-4-Scout-17B-16E: Llama4ForConditionalGeneration,
// its text_config read as the decoder) gives 107,769,861,120 text-decoder parameters (by hand:
// 48 layers of attention 62.9M, router 82K, 16 experts 2.01B and the shared expert 126M, plus
// both 202048 x 5120 embeddings; the published 109B adds the vision tower), every layer sparse,
// layers 3, 7, ... NoPE (global, temperature-tuned), the others chunked by 8192 with q/k
// norms, llama3 RoPE factor 16; Maverick's shape (interleave_moe_layer_step 2, 128 experts, no
// q/k norm) 400,711,848,960 (the published 400B); the merged config.json reads back; another
// moe_layers list is refused by name.
TEST(Llama, Llama4ConfigJson) {
  const fsdp::ModelFamily& l4 = fsdp::model_family("llama4_text");
  nlohmann::json no_rope = nlohmann::json::array(), types = nlohmann::json::array(),
                 moe = nlohmann::json::array();
  for (int l = 0; l < 48; ++l) {
    no_rope.push_back((l + 1) % 4 != 0 ? 1 : 0);
    types.push_back((l + 1) % 4 != 0 ? "chunked_attention" : "full_attention");
    moe.push_back(l);
  }
  const nlohmann::json text = {
      {"attention_bias", false}, {"attention_chunk_size", 8192}, {"attention_dropout", 0.0},
      {"attn_scale", 0.1}, {"attn_temperature_tuning", true}, {"bos_token_id", 200000},
      {"eos_token_id", {200001, 200007, 200008}}, {"floor_scale", 8192},
      {"for_llm_compressor", false}, {"head_dim", 128}, {"hidden_act", "silu"},
      {"hidden_size", 5120}, {"initializer_range", 0.02}, {"interleave_moe_layer_step", 1},
      {"intermediate_size", 8192}, {"intermediate_size_mlp", 16384},
      {"max_position_embeddings", 10485760}, {"model_type", "llama4_text"},
      {"moe_layers", moe}, {"no_rope_layers", no_rope}, {"num_attention_heads", 40},
      {"num_experts_per_tok", 1}, {"num_hidden_layers", 48}, {"num_key_value_heads", 8},
      {"num_local_experts", 16}, {"output_router_logits", false}, {"pad_token_id", 200018},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"factor", 16.0}, {"high_freq_factor", 1.0}, {"low_freq_factor", 1.0},
        {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}}},
      {"rope_theta", 500000.0}, {"router_aux_loss_coef", 0.001}, {"router_jitter_noise", 0.0},
      {"torch_dtype", "bfloat16"}, {"use_cache", true}, {"use_qk_norm", true},
      {"vocab_size", 202048}, {"layer_types", types}};
  const nlohmann::json scout = {{"architectures", {"Llama4ForConditionalGeneration"}},
                                {"model_type", "llama4"}, {"text_config", text},
                                {"vision_config", {{"model_type", "llama4_vision_model"}}},
                                {"tie_word_embeddings", false}};
  const fsdp::ModelConfig mc = l4.from_hf_config(scout, "config.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(parameters_and_buffers(g).first, 107769861120);
  EXPECT_TRUE(g.layer_sparse(0) && g.layer_sparse(47));
  EXPECT_TRUE(g.layer_rope(0) && g.layer_rope(2) && !g.layer_rope(3) && !g.layer_rope(47));
  EXPECT_EQ(g.layer_chunk(0), 8192);
  EXPECT_EQ(g.layer_chunk(3), 0);
  EXPECT_EQ(g.pad_token_id, 200018);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::llama3);
  EXPECT_EQ(g.rope_factor, 16.0);
  EXPECT_TRUE(g.use_qk_norm && g.attn_temperature_tuning);
  EXPECT_EQ(g.temperature_scale(8190), 1.0);
  EXPECT_EQ(g.temperature_scale(8191), std::log(2.0) * 0.1 + 1.0);
  EXPECT_TRUE(l4.hf_tensor(mc, "model.layers.5.feed_forward.experts.gate_up_proj", {1}));
  EXPECT_TRUE(l4.hf_tensor(mc, "model.layers.5.feed_forward.shared_expert.down_proj.weight", {1}));
  EXPECT_FALSE(l4.hf_tensor(mc, "model.layers.5.self_attn.q_norm.weight", {1}));
  const nlohmann::json back = l4.hf_config(mc);
  EXPECT_EQ(back["architectures"][0], "Llama4ForCausalLM");
  EXPECT_EQ(back["model_type"], "llama4_text");
  EXPECT_EQ(back["moe_layers"], moe);
  EXPECT_EQ(back["no_rope_layers"], no_rope);
  EXPECT_EQ(back["layer_types"], types);
  EXPECT_EQ(l4.canonical(l4.from_hf_config(back, "merged.json")), l4.canonical(mc));
  // Maverick's shape: dense and sparse layers alternate, 128 experts, no q/k norms
  nlohmann::json mav = text;
  mav["interleave_moe_layer_step"] = 2;
  mav["num_local_experts"] = 128;
  mav["use_qk_norm"] = false;
  mav["attn_temperature_tuning"] = 4;  // (Llama4TextConfig's default: an int read as true)
  nlohmann::json odd = nlohmann::json::array();
  for (int l = 1; l < 48; l += 2) odd.push_back(l);
  mav["moe_layers"] = odd;
  const fsdp::LlamaConfig m = fsdp::LlamaConfig::from(l4.from_hf_config(mav, "m.json"));
  EXPECT_EQ(parameters_and_buffers(m).first, 400711848960);
  EXPECT_TRUE(!m.layer_sparse(0) && m.layer_sparse(1) && m.attn_temperature_tuning);
  nlohmann::json hf = text;
  hf["moe_layers"] = {0, 1};
  expect_refused(l4, hf, "\"moe_layers\" [0,1] is not supported");
  hf = text;  // layer 3 is NoPE: full attention, not chunked
  hf["layer_types"][3] = "chunked_attention";
  expect_refused(l4, hf, "\"layer_types\"");
  hf = text;  // HF's None: no chunks, and the merge writes it back so
  hf["attention_chunk_size"] = nullptr;
  const fsdp::ModelConfig unchunked = l4.from_hf_config(hf, "n.json");
  EXPECT_EQ(fsdp::LlamaConfig::from(unchunked).layer_chunk(0), 0);
  EXPECT_TRUE(l4.hf_config(unchunked)["attention_chunk_size"].is_null());
  // (num_experts_per_tok 2: refused when the [model] is checked, test_config)
}

// The published MoE models' config.json (the attributes of Qwen/Qwen3-30B-A3B,
// mistralai/Mixtral-8x7B-v0.1, allenai/OLMoE-1B-7B-0924 and Qwen/Qwen1.5-MoE-A2.7B): each
// reads as written, declares the model's known parameter count (Mixtral 8x7B: 46,702,792,704;
// Qwen3-30B-A3B: 30,532,122,624; OLMoE-1B-7B: 6,919,161,856; Qwen1.5-MoE-A2.7B: 14.3B, by hand
// 14,315,784,192 with its shared expert), round-trips through the merge's config.json,
// reads the load-balancing loss's attributes, and what fsdp_train does not implement is
// refused by name.
TEST(Llama, MoeConfigJson) {
  auto params = [](const fsdp::ModelConfig& mc) {
    int64_t n = 0;
    for (const auto& m : fsdp::llama_modules(fsdp::LlamaConfig::from(mc))) {
      for (const auto& p : m.params) n += p.unpadded_numel();
    }
    return n;
  };
  const nlohmann::json qwen = {
      {"architectures", {"Qwen3MoeForCausalLM"}}, {"attention_bias", false},
      {"attention_dropout", 0.0}, {"bos_token_id", 151643}, {"decoder_sparse_step", 1},
      {"eos_token_id", 151645}, {"head_dim", 128}, {"hidden_act", "silu"},
      {"hidden_size", 2048}, {"initializer_range", 0.02}, {"intermediate_size", 6144},
      {"max_position_embeddings", 40960}, {"max_window_layers", 48},
      {"mlp_only_layers", nlohmann::json::array()}, {"model_type", "qwen3_moe"},
      {"moe_intermediate_size", 768}, {"norm_topk_prob", true}, {"num_attention_heads", 32},
      {"num_experts", 128}, {"num_experts_per_tok", 8}, {"num_hidden_layers", 48},
      {"num_key_value_heads", 4}, {"output_router_logits", false}, {"rms_norm_eps", 1e-06},
      {"rope_scaling", nullptr}, {"rope_theta", 1000000.0}, {"router_aux_loss_coef", 0.001},
      {"sliding_window", nullptr}, {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
      {"use_cache", true}, {"use_sliding_window", false}, {"vocab_size", 151936}};
  const nlohmann::json mixtral = {
      {"architectures", {"MixtralForCausalLM"}}, {"attention_dropout", 0.0},
      {"bos_token_id", 1}, {"eos_token_id", 2}, {"hidden_act", "silu"}, {"hidden_size", 4096},
      {"initializer_range", 0.02}, {"intermediate_size", 14336},
      {"max_position_embeddings", 32768}, {"model_type", "mixtral"},
      {"num_attention_heads", 32}, {"num_experts_per_tok", 2}, {"num_hidden_layers", 32},
      {"num_key_value_heads", 8}, {"num_local_experts", 8}, {"output_router_logits", false},
      {"rms_norm_eps", 1e-05}, {"rope_theta", 1e6}, {"router_aux_loss_coef", 0.02},
      {"sliding_window", nullptr}, {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
      {"use_cache", true}, {"vocab_size", 32000}};
  const nlohmann::json olmoe = {
      {"architectures", {"OlmoeForCausalLM"}}, {"attention_bias", false},
      {"attention_dropout", 0.0}, {"clip_qkv", nullptr}, {"eos_token_id", 50279},
      {"hidden_act", "silu"}, {"hidden_size", 2048}, {"initializer_range", 0.02},
      {"intermediate_size", 1024}, {"max_position_embeddings", 4096}, {"model_type", "olmoe"},
      {"norm_topk_prob", false}, {"num_attention_heads", 16}, {"num_experts", 64},
      {"num_experts_per_tok", 8}, {"num_hidden_layers", 16}, {"num_key_value_heads", 16},
      {"output_router_logits", false}, {"pad_token_id", 1}, {"rms_norm_eps", 1e-05},
      {"rope_scaling", nullptr}, {"rope_theta", 10000.0}, {"router_aux_loss_coef", 0.01},
      {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}, {"use_cache", true},
      {"vocab_size", 50304}};
  const nlohmann::json qwen2 = {
      {"architectures", {"Qwen2MoeForCausalLM"}}, {"attention_dropout", 0.0},
      {"bos_token_id", 151643}, {"decoder_sparse_step", 1}, {"eos_token_id", 151643},
      {"hidden_act", "silu"}, {"hidden_size", 2048}, {"initializer_range", 0.02},
      {"intermediate_size", 5632}, {"max_position_embeddings", 8192}, {"max_window_layers", 21},
      {"model_type", "qwen2_moe"}, {"moe_intermediate_size", 1408}, {"norm_topk_prob", false},
      {"num_attention_heads", 16}, {"num_experts", 60}, {"num_experts_per_tok", 4},
      {"num_hidden_layers", 24}, {"num_key_value_heads", 16}, {"output_router_logits", false},
      {"rms_norm_eps", 1e-06}, {"rope_theta", 1000000.0}, {"router_aux_loss_coef", 0.001},
      {"shared_expert_intermediate_size", 5632}, {"sliding_window", 32768},
      {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}, {"use_cache", true},
      {"use_sliding_window", false}, {"vocab_size", 151936}};
  struct Case {
    const nlohmann::json& hf;
    int64_t params, experts, per_token, expert_size;
    bool normalize;
  };
  for (const Case& c : {Case{qwen, 30532122624, 128, 8, 768, true},
                        Case{mixtral, 46702792704, 8, 2, 14336, true},
                        Case{olmoe, 6919161856, 64, 8, 1024, false},
                        Case{qwen2, 14315784192, 60, 4, 1408, false}}) {
    const std::string type = c.hf.at("model_type");
    const fsdp::ModelFamily& family = fsdp::model_family(type);
    const fsdp::ModelConfig mc = family.from_hf_config(c.hf, type + ".json");
    const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
    EXPECT_TRUE(g.moe()) << type;
    EXPECT_EQ(g.num_experts, c.experts) << type;
    EXPECT_EQ(g.num_experts_per_tok, c.per_token) << type;
    EXPECT_EQ(g.expert_size(), c.expert_size) << type;
    EXPECT_EQ(g.normalize_top_k(), c.normalize) << type;
    EXPECT_EQ(g.layer_window(0), 0) << type;
    EXPECT_EQ(params(mc), c.params) << type;
    const nlohmann::json out = family.hf_config(mc);
    EXPECT_EQ(out.at("model_type"), type);
    EXPECT_EQ(out.at("output_router_logits"), false) << type;
    EXPECT_EQ(family.canonical(family.from_hf_config(out, "merged.json")), family.canonical(mc))
        << type;
    // Every layer's tensors have HF's names (hf_tensor: the layer's own module).
    const auto last = "model.layers." + std::to_string(g.num_hidden_layers - 1) + "." +
                      (type == "mixtral" ? "block_sparse_moe.experts.7.w2.weight"
                                         : "mlp.experts.7.down_proj.weight");
    const auto hf = family.hf_tensor(mc, last, {g.hidden_size, g.expert_size()});
    ASSERT_TRUE(hf.has_value()) << last;
    EXPECT_EQ(hf->name, last);
    EXPECT_FALSE(family.hf_tensor(mc, "model.layers.99.mlp.gate.weight", {1}).has_value());
    EXPECT_FALSE(family.hf_tensor(mc, "model.layers.x.mlp.gate.weight", {1}).has_value());
  }
  EXPECT_TRUE(fsdp::LlamaConfig::from(fsdp::model_family("olmoe").from_hf_config(olmoe, "o"))
                  .qk_norm());
  // The load-balancing loss's attributes are keys (Mixtral 8x7B's coefficient 0.02).
  nlohmann::json hf = qwen;
  hf["output_router_logits"] = true;
  const fsdp::LlamaConfig aux =
      fsdp::LlamaConfig::from(fsdp::model_family("qwen3_moe").from_hf_config(hf, "aux.json"));
  EXPECT_TRUE(aux.aux_loss());
  EXPECT_EQ(aux.router_aux_loss_coef, 0.001);
  EXPECT_EQ(fsdp::LlamaConfig::from(fsdp::model_family("mixtral").from_hf_config(mixtral, "m"))
                .router_aux_loss_coef,
            0.02);
  EXPECT_FALSE(fsdp::LlamaConfig::from(fsdp::model_family("qwen3_moe").from_hf_config(qwen, "q"))
                   .aux_loss());
  // transformers 5.8's num_local_experts for Qwen3-MoE: read alone, or beside num_experts
  // when equal
  hf = qwen;
  hf.erase("num_experts");
  hf["num_local_experts"] = 16;
  EXPECT_EQ(fsdp::LlamaConfig::from(fsdp::model_family("qwen3_moe").from_hf_config(hf, "v5"))
                .num_experts,
            16);
  hf["num_experts"] = 16;
  EXPECT_EQ(fsdp::LlamaConfig::from(fsdp::model_family("qwen3_moe").from_hf_config(hf, "v5"))
                .num_experts,
            16);
  hf["num_experts"] = 32;
  expect_refused(fsdp::model_family("qwen3_moe"), hf,
                 "\"num_local_experts\" 16 is not supported (expected the same number as "
                 "\"num_experts\" 32)");
  hf = qwen;
  hf["mlp_only_layers"] = {0, 5};
  expect_refused(fsdp::model_family("qwen3_moe"), hf, "\"mlp_only_layers\" [0,5] is not supported");
  hf = qwen;
  hf["decoder_sparse_step"] = 2;
  expect_refused(fsdp::model_family("qwen3_moe"), hf, "\"decoder_sparse_step\" 2 is not supported");
  hf = mixtral;
  hf["router_jitter_noise"] = 0.1;
  expect_refused(fsdp::model_family("mixtral"), hf, "\"router_jitter_noise\" 0.1 is not supported");
  hf = qwen2;
  hf["qkv_bias"] = false;
  expect_refused(fsdp::model_family("qwen2_moe"), hf, "\"qkv_bias\" false is not supported");
  const fsdp::ModelFamily& q2 = fsdp::model_family("qwen2_moe");
  const nlohmann::json merged = q2.hf_config(q2.from_hf_config(qwen2, "q"));
  EXPECT_EQ(merged.at("qkv_bias"), true);
  EXPECT_EQ(merged.at("layer_types").size(), 24u);
  hf = olmoe;
  hf["clip_qkv"] = 8.0;
  expect_refused(fsdp::model_family("olmoe"), hf, "\"clip_qkv\" 8.0 is not supported");
}

// SmolLM3-3B's config.json (HuggingFaceTB/SmolLM3-3B's attributes as transformers writes them:
// no_rope_layers and layer_types spelled out) reads as written; a no_rope_layers list of no
// interval, or layer_types the keys do not give, is refused by name.
TEST(Llama, SmolLM3ConfigJson) {
  const fsdp::ModelFamily& smol = fsdp::model_family("smollm3");
  nlohmann::json no_rope = nlohmann::json::array(), types = nlohmann::json::array();
  for (int l = 0; l < 36; ++l) {
    no_rope.push_back((l + 1) % 4 != 0 ? 1 : 0);
    types.push_back("full_attention");
  }
  const nlohmann::json s3b = {
      {"architectures", {"SmolLM3ForCausalLM"}}, {"model_type", "smollm3"},
      {"vocab_size", 128256}, {"hidden_size", 2048}, {"intermediate_size", 11008},
      {"num_hidden_layers", 36}, {"num_attention_heads", 16}, {"num_key_value_heads", 4},
      {"max_position_embeddings", 65536}, {"rms_norm_eps", 1e-6}, {"rope_theta", 5000000.0},
      {"rope_scaling", nullptr}, {"no_rope_layers", no_rope}, {"no_rope_layer_interval", 4},
      {"layer_types", types}, {"use_sliding_window", false}, {"sliding_window", nullptr},
      {"attention_bias", false}, {"attention_dropout", 0.0}, {"mlp_bias", false},
      {"hidden_act", "silu"}, {"tie_word_embeddings", true}, {"pad_token_id", 128004},
      {"bos_token_id", 128000}, {"eos_token_id", 128012}};
  const fsdp::ModelConfig mc = smol.from_hf_config(s3b, "smollm3-3b.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::smollm3);
  EXPECT_EQ(g.head_size(), 128);
  EXPECT_EQ(g.no_rope_layer_interval, 4);
  EXPECT_EQ(g.sliding_window, 0);
  EXPECT_EQ(g.pad_token_id, 128004);
  for (int64_t l = 0; l < 36; ++l) {
    EXPECT_EQ(g.layer_rope(l), (l + 1) % 4 != 0) << l;
    EXPECT_EQ(g.layer_window(l), 0) << l;
  }
  const nlohmann::json out = smol.hf_config(mc);
  EXPECT_EQ(out.at("no_rope_layers"), no_rope);
  EXPECT_EQ(out.at("layer_types"), types);
  EXPECT_TRUE(out.at("sliding_window").is_null());
  EXPECT_EQ(smol.canonical(smol.from_hf_config(out, "merged.json")), smol.canonical(mc));
  nlohmann::json hf = s3b;  // no interval gives it
  hf["no_rope_layers"][0] = 0;
  expect_refused(smol, hf, "\"no_rope_layers\"");
  hf = s3b;  // a sliding layer the keys do not give (no window)
  hf["layer_types"][3] = "sliding_attention";
  expect_refused(smol, hf, "\"layer_types\"");
  hf = s3b;  // with the window on, the NoPE layers slide
  hf["use_sliding_window"] = true;
  hf["sliding_window"] = 4096;
  hf.erase("layer_types");
  const fsdp::LlamaConfig w = fsdp::LlamaConfig::from(smol.from_hf_config(hf, "c.json"));
  EXPECT_EQ(w.layer_window(3), 4096);
  EXPECT_EQ(w.layer_window(2), 0);
}

// A Granite 3 config.json (GraniteForCausalLM's attributes, Granite 3.1's multipliers) reads as
// written; the merge's config.json reads back to the same model; biases are refused by name.
TEST(Llama, GraniteConfigJson) {
  const fsdp::ModelFamily& granite = fsdp::model_family("granite");
  const nlohmann::json g3 = {
      {"architectures", {"GraniteForCausalLM"}}, {"model_type", "granite"},
      {"vocab_size", 49155}, {"hidden_size", 2048}, {"intermediate_size", 8192},
      {"num_hidden_layers", 40}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
      {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-5}, {"rope_theta", 5000000.0},
      {"rope_scaling", nullptr}, {"attention_bias", false}, {"mlp_bias", false},
      {"attention_dropout", 0.0}, {"embedding_multiplier", 12.0},
      {"residual_multiplier", 0.22}, {"attention_multiplier", 0.0078125},
      {"logits_scaling", 8.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", true},
      {"pad_token_id", 0}, {"bos_token_id", 0}, {"eos_token_id", 0}};
  const fsdp::ModelConfig mc = granite.from_hf_config(g3, "granite.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::granite);
  EXPECT_EQ(g.head_size(), 64);
  EXPECT_EQ(g.embed_scale(), 12.0);
  EXPECT_EQ(g.residual_scale(), 0.22f);
  EXPECT_EQ(g.attention_scale(), 0.0078125f);
  EXPECT_EQ(g.logit_scale(), 0.125f);
  EXPECT_EQ(granite.canonical(granite.from_hf_config(granite.hf_config(mc), "merged.json")),
            granite.canonical(mc));
  try {
    fsdp::parse_config("[model]\ntype = \"granite\"\nattention_bias = true\n", "input.toml", {});
    ADD_FAILURE() << "granite with attention_bias accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.attention_bias: true is not supported for granite"),
              std::string::npos)
        << e.what();
  }
}

// An OLMo 3 config.json (Olmo3Config: OLMo 2's attributes, sliding_window, layer_types, and a
// long-context yarn scaling) reads as written: the pattern from layer_types, the yarn on the
// global layers only; transformers 5's per-layer-type rope_parameters give the same model, a
// sliding layer with another period or scaling is refused by name.
TEST(Llama, Olmo3ConfigJson) {
  const fsdp::ModelFamily& olmo3 = fsdp::model_family("olmo3");
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < 32; ++l)
    types.push_back((l + 1) % 4 != 0 ? "sliding_attention" : "full_attention");
  const nlohmann::json yarn = {{"rope_type", "yarn"},
                               {"factor", 8.0},
                               {"original_max_position_embeddings", 8192},
                               {"attention_factor", 1.2079441541679836}};
  const nlohmann::json o3 = {{"architectures", {"Olmo3ForCausalLM"}},
                             {"model_type", "olmo3"},
                             {"vocab_size", 100278},
                             {"hidden_size", 4096},
                             {"intermediate_size", 11008},
                             {"num_hidden_layers", 32},
                             {"num_attention_heads", 32},
                             {"num_key_value_heads", 32},
                             {"max_position_embeddings", 65536},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 500000},
                             {"rope_scaling", yarn},
                             {"attention_bias", false},
                             {"attention_dropout", 0.0},
                             {"sliding_window", 4096},
                             {"layer_types", types},
                             {"hidden_act", "silu"},
                             {"tie_word_embeddings", false},
                             {"pad_token_id", 100277},
                             {"eos_token_id", 100257}};
  const fsdp::ModelConfig mc = olmo3.from_hf_config(o3, "olmo3.json");
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(mc);
  EXPECT_EQ(g.arch, fsdp::LlamaArch::olmo3);
  EXPECT_EQ(g.sliding_window_pattern, 4);
  EXPECT_EQ(g.rope_type, fsdp::LlamaConfig::RopeType::yarn);
  for (int64_t l = 0; l < 32; ++l) {
    EXPECT_EQ(g.layer_window(l), (l + 1) % 4 != 0 ? 4096 : 0) << l;
    EXPECT_EQ(g.layer_local_rope(l), (l + 1) % 4 != 0) << l;
  }
  const fsdp::LlamaConfig local = fsdp::llama_local_rope_config(g);
  EXPECT_EQ(local.rope_theta, 500000.0);
  EXPECT_EQ(local.rope_type, fsdp::LlamaConfig::RopeType::default_);
  EXPECT_EQ(fsdp::llama_rope_attention_scaling(local), 1.0);
  const nlohmann::json out = olmo3.hf_config(mc);
  EXPECT_EQ(out.at("layer_types"), types);
  EXPECT_FALSE(out.contains("sliding_window_pattern"));
  EXPECT_EQ(olmo3.canonical(olmo3.from_hf_config(out, "merged.json")), olmo3.canonical(mc));
  nlohmann::json v5 = o3;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  nlohmann::json full = yarn;
  full["rope_theta"] = 500000;
  v5["rope_parameters"] = {
      {"full_attention", full},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 500000}}}};
  EXPECT_EQ(olmo3.canonical(olmo3.from_hf_config(v5, "v5.json")), olmo3.canonical(mc));
  nlohmann::json hf = v5;
  hf["rope_parameters"]["sliding_attention"]["rope_theta"] = 10000;
  expect_refused(olmo3, hf, "rope_parameters.sliding_attention.rope_theta");
  hf = o3;
  hf["layer_types"][0] = "full_attention";
  expect_refused(olmo3, hf, "\"layer_types\"");
}
