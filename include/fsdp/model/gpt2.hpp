// fsdp/model/gpt2.hpp: GPT-2 decoder with the exact architecture of Hugging Face
// GPT2LMHeadModel (Radford et al. 2019; transformers/models/gpt2/modeling_gpt2.py):
// learned token + position embeddings, pre-LN blocks (ln_1 -> causal self-attention with a
// fused qkv c_attn -> c_proj -> residual; ln_2 -> c_fc -> GELU(tanh) -> c_proj -> residual),
// final ln_f, LM head tied to wte. No dropout (resid/embd/attn pdrop = 0).
//
// Explicit forward and backward per module, llm.c style, on fsdp::Kernels
// (fsdp/backend/kernels.hpp); no general autograd. Linear weights are stored [out, in]
// (nn.Linear); fsdp_merge transposes them to HF's Conv1D [in, out]. The vocabulary is
// padded to Vp = padded_vocab() rows of wte (model.pad_vocab_multiple): the LM head computes logits [BT,Vp] and the cross-entropy reads
// only the first V columns (row stride Vp), so losses and the gradients of the model's own
// rows are the unpadded model's and the pad rows' gradient is 0. Initialisation is GPT-2's:
// N(0, 0.02) for weights and embeddings (the pad rows 0), N(0, 0.02/sqrt(2*n_layer)) for the
// residual projections (attn.c_proj, mlp.c_proj), zero biases, LayerNorm weight 1 and bias 0.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/fsdp/module.hpp"
#include "fsdp/model/causal_lm.hpp"
#include "fsdp/model/model.hpp"

namespace fsdp {

// Hugging Face GPT2Config's keys ([model] with type = "gpt2"; defaults in gpt2_family()).
struct Gpt2Config {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t n_positions = 256;          // max sequence length (learned position table rows)
  int64_t vocab_size = 256;           // byte-level by default
  double layer_norm_epsilon = 1e-5;
  // model.pad_vocab_multiple (not a GPT2Config key): wte has padded_vocab() rows in training.
  int64_t pad_vocab_multiple = kDefaultPadVocabMultiple;
  // model.fused_linear_cross_entropy[_chunk_rows] (not GPT2Config keys): the chunked LM head.
  FusedLinearCrossEntropy fused_lce;
  // vocab_size rounded up to a multiple of pad_vocab_multiple (50257 -> 50304 at 128).
  int64_t padded_vocab() const { return padded_vocab_size(vocab_size, pad_vocab_multiple); }
  // From the [model] section (type "gpt2"); throws fsdp::Error on a missing key.
  static Gpt2Config from(const ModelConfig& config);
};

// The "gpt2" entry of the model registry (fsdp/model/model.hpp).
const ModelFamily& gpt2_family();

// Parameters in forward order: "embeddings" (wte [Vp,C] with Vp = padded_vocab() and
// vocab_rows = V, wpe [P,C]), "h.0" .. "h.{L-1}" (class "GPT2Block", 12 tensors each), "ln_f"
// (ln_f.weight, ln_f.bias [C]).
std::vector<ModuleDecl> gpt2_modules(const Gpt2Config& config);

class Gpt2Model final : public CausalLm {
 public:
  // activation_dtype: storage of activations and their gradients (the mixed-precision
  // param_dtype); LayerNorm statistics stay fp32.
  // activation_checkpointing (Accelerate's fsdp_activation_checkpointing, per GPT2Block;
  // every block or the first N): forward keeps only a recomputing block's input (the
  // residual stream); its internals (ln_1, qkv, attention, c_proj, ln_2, c_fc, GELU and the
  // LN statistics) live in ONE set of buffers shared with the other recomputing blocks and
  // the block after them (ActivationCheckpointing::buffer_set) and are recomputed inside the
  // block's backward, after the engine's pre_backward has all-gathered its parameters. Same
  // kernels on the same inputs: results are bit-identical to activation_checkpointing = false.
  Gpt2Model(const Gpt2Config& config, Kernels& kernels, DType activation_dtype = DType::f32,
            ActivationCheckpointing activation_checkpointing = {});
  ~Gpt2Model() override;
  Gpt2Model(const Gpt2Model&) = delete;
  Gpt2Model& operator=(const Gpt2Model&) = delete;

  // Modules in forward order: "embeddings" (wte [V,C], wpe [P,C]), "h.0" .. "h.{L-1}"
  // (class "GPT2Block"), "ln_f" (ln_f.weight, ln_f.bias [C]; also reads the tied wte).
  const std::vector<ModuleDecl>& modules() const override { return modules_; }
  // [B*T, padded_vocab()] (CausalLm::last_logits; tools/gpt2_reference.py's tests read it).
  // Throws fsdp::Error under model.fused_linear_cross_entropy.
  TensorView last_logits() const override;

  // Bytes of activations (saved for backward, and their gradients) for a [B,T] micro-batch
  // with activations stored in `activation_dtype`, with or without activation
  // checkpointing; exactly what forward allocates (the logits [B*T, Vp], or one chunk of
  // them under config.fused_lce; with `docs`, the document positions and starts).
  static int64_t activation_bytes(const Gpt2Config& config, int64_t B, int64_t T,
                                  DType activation_dtype,
                                  ActivationCheckpointing activation_checkpointing = {},
                                  DocumentMasking docs = {});

 private:
  struct Acts;
  const char* family_name() const override { return "GPT-2"; }
  // Document masking: the attention within documents; under reset_positions wpe is read at
  // each token's position in its document (HF GPT2Model's position_ids).
  bool supports_documents() const override { return true; }
  void ensure_buffers(int64_t B, int64_t T);
  // The running micro-batch's document starts, int32 [BT], or a null view without document
  // masking (the attention kernels' doc_start).
  TensorView doc_start(int64_t BT) const;
  void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
               ModuleHooks& hooks, bool backward, float grad_scale, const TensorView& loss) override;
  void backward(int64_t B, int64_t T, ModuleHooks& hooks, float grad_scale,
                const TensorView& loss) override;
  // Block l's forward kernels (no hooks): res[l] -> its saved internals and, when
  // `write_output`, res[l+1]. Used by forward and by the checkpointing recompute.
  void block_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks, bool write_output);
  // The chunked LM head's views for BT rows (model.fused_linear_cross_entropy).
  LmHeadChunks head_chunks(int64_t BT, ModuleHooks& hooks) const;

  Gpt2Config cfg_;
  Kernels& be_;
  DeviceRuntime& rt_;  // be_.runtime(): activation buffers, input copies, zero fills
  DType act_dtype_;
  ActivationCheckpointing checkpointing_;
  std::vector<ModuleDecl> modules_;
  std::unique_ptr<Acts> acts_;
  int64_t last_rows_ = 0;  // B*T of the last forward
};

}  // namespace fsdp
