// fsdp/model/causal_lm.hpp: what the decoder-only families (GPT-2, Llama) share around their
// own forward and backward: the data::Batch entry points (a causal-LM batch: targets are the
// next tokens, target_len == L), the pointer forms the reference tests call, and the logits of
// the last evaluation pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/tensor.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/fsdp/module.hpp"
#include "fsdp/model/model.hpp"

namespace fsdp {

class Kernels;

// model.fused_linear_cross_entropy and model.fused_linear_cross_entropy_chunk_rows (Liger-
// Kernel's FusedLinearCrossEntropy, Hsu et al. 2024): the LM head's logits exist one chunk of
// rows at a time. Training: forward stops after the final norm; the head's backward (the first
// module of backward, where the head weight's gradient may be written) runs, per chunk of
// rows, logits = x_chunk @ W^T, the fused cross-entropy forward-backward (loss += the chunk's
// summed loss, dlogits in place), dW += dlogits^T @ x_chunk and dx_chunk = dlogits @ W: the
// same four GEMM shapes as the unfused head, split over rows, no recomputation. Evaluation:
// logits and the loss chunk by chunk. The [rows, Vp] logits buffer shrinks to [chunk, Vp].
struct FusedLinearCrossEntropy {
  bool enabled = false;
  int64_t chunk_rows = 0;  // 0 = auto (chunk_for)

  static FusedLinearCrossEntropy from(const ModelConfig& config) {
    return {config.fused_linear_cross_entropy, config.fused_linear_cross_entropy_chunk_rows};
  }
  // Rows per chunk for `rows` rows of width `hidden` over `padded_vocab` logits columns: the
  // configured chunk_rows, or (0) Liger's heuristic, rows / ceil(Vp / hidden) rounded up to a
  // power of two (a chunk's logits about the [rows, hidden] activations' size), but at least
  // kMinAutoChunkRows; at most `rows`. Nondecreasing in `rows` (a smaller batch fits the
  // buffers of a larger).
  int64_t chunk_for(int64_t rows, int64_t hidden, int64_t padded_vocab) const;
  // The auto chunk's floor. Each chunk's three GEMMs read the whole [Vp, C] head weight (and
  // read and write its gradient), so below a few hundred rows the head's time grows as
  // 1 / chunk: GPT-2 2 x 256 wide, vocabulary 50257, 1024 tokens on this project's CPU VM
  // (docs/benchmarks.md): forward + backward +200% at 8 rows (Liger's value there), +32% at
  // 64, +8% at 256, equal at 1024. 256 rows is also a full tensor-core tile height on GPUs.
  static constexpr int64_t kMinAutoChunkRows = 256;
  // Rows of the logits buffer: chunk_for(rows, ...) when enabled, else `rows`.
  int64_t logits_rows(int64_t rows, int64_t hidden, int64_t padded_vocab) const {
    return enabled ? chunk_for(rows, hidden, padded_vocab) : rows;
  }
};

// The chunked LM head on `kernels` (CPU or CUDA: row-offset views of contiguous buffers).
// x: [R,C] the final norm's output; weight: [Vp,C] the head (or tied embedding); targets: [R]
// int32; scratch: a buffer of at least chunk * Vp elements of the activation dtype.
struct LmHeadChunks {
  TensorView x, weight, targets, scratch;
  int64_t R = 0, C = 0, V = 0, Vp = 0, chunk = 0;
  float logit_scale = 1.f;  // logits = logit_scale * x @ weight^T (Granite: 1 / logits_scaling)
  float softcap = 0.f;      // the loss reads softcap tanh(logits / softcap) (Gemma 2); 0: none
};
// Training: loss[0] += the summed cross-entropy (each chunk's rows summed in order, the chunk
// sums added in chunk order: deterministic); dweight += dlogits^T x (beta = 1);
// dx [R,C] = dlogits @ weight. dlogits are the unfused head's (grad_scale folded in).
void lm_head_chunks_backward(Kernels& kernels, const LmHeadChunks& h, float grad_scale,
                             const TensorView& loss, const TensorView& dweight,
                             const TensorView& dx);
// Evaluation: loss[0] += the summed cross-entropy.
void lm_head_chunks_loss(Kernels& kernels, const LmHeadChunks& h, const TensorView& loss);

// Document masking of a packed causal-LM batch (data.attn_mask_type = "block_causal";
// torchtitan's block_causal mask, Hugging Face's padding-free packing): `positions` [B,T] int32
// host, each token's position in its document (data::Batch::position_ids: 0 at a row's first
// token and after each EOS, else the previous + 1); a token attends only to the tokens of its
// own document. `reset_positions` (data.reset_position_ids): RoPE reads these positions (HF's
// position_ids) instead of the position in the row. positions null: no document mask.
struct Documents {
  const int32_t* positions = nullptr;
  bool reset_positions = false;
};
// Whether a configuration's batches carry Documents, for the memory plan (the buffers they
// take: the document starts, and the per-token RoPE tables under reset_positions).
struct DocumentMasking {
  bool enabled = false;
  bool reset_positions = false;
};

// The document starts of `positions` ([B,T] host, Documents::positions): t - positions[b,t],
// the attention kernels' doc_start. Throws fsdp::Error naming `family` and the entry
// ("position_ids[b, t] = p") unless each row counts up from 0 and restarts only at 0 (so the
// starts are nondecreasing along a row and <= t, as the kernels require).
std::vector<int32_t> document_starts(const int32_t* positions, int64_t B, int64_t T,
                                     const char* family);

class CausalLm : public Model {
 public:
  // Model interface on a causal-LM Batch (its position_ids, when present, as Documents);
  // throws fsdp::Error naming the family when batch.target_len != batch.L, or when the batch
  // has position_ids and the family has no document masking (supports_documents()).
  void forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                        const TensorView& loss) override;
  void forward_loss(const data::Batch& batch, ModuleHooks& hooks, const TensorView& loss) override;

  // One training micro-batch: forward, loss, backward. tokens, targets: [B,T] int32 host
  // arrays. loss[0] (fp64 [1] device scalar) += the SUM over the B*T positions of the
  // cross-entropy (nats); gradients accumulate into hooks.grad() scaled by `grad_scale`
  // (1/(B*T) for the local mean, times the loss scale under fp16). `docs`: the batch's
  // document masking (none by default); fsdp::Error as above when the family has none.
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float grad_scale, ModuleHooks& hooks, const TensorView& loss,
                        const Documents& docs = {});
  // Forward and loss only (evaluation): loss[0] += the summed cross-entropy over B*T positions.
  void forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                    ModuleHooks& hooks, const TensorView& loss, const Documents& docs = {});

  // The logits of the last forward_loss: [B*T, padded vocabulary] in the activation dtype, row
  // b*T + t for position t of sequence b; the columns past vocab_size are the vocabulary
  // padding (never read by the loss). After forward_backward the buffer holds dlogits instead
  // (the fused cross-entropy overwrites it). An empty view before the first forward. For tests
  // against a reference model, as llm.c's test_gpt2 reads logits. Throws fsdp::Error under
  // model.fused_linear_cross_entropy (no such buffer is kept).
  virtual TensorView last_logits() const = 0;

 protected:
  // "GPT-2", "Llama": for messages.
  virtual const char* family_name() const = 0;
  // Whether forward reads docs_ (document masking); false: a batch with Documents throws.
  virtual bool supports_documents() const { return false; }
  // The family's forward (with the loss, and dlogits when `backward`) and backward passes.
  // Under model.fused_linear_cross_entropy a training forward leaves the loss to backward,
  // which takes the same grad_scale and loss.
  virtual void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                       ModuleHooks& hooks, bool backward, float grad_scale,
                       const TensorView& loss) = 0;
  virtual void backward(int64_t B, int64_t T, ModuleHooks& hooks, float grad_scale,
                        const TensorView& loss) = 0;
  // The fsdp::Error last_logits() throws under model.fused_linear_cross_entropy.
  Error fused_logits_error() const;

  // The running pass's documents (set by forward_backward / forward_loss before forward and
  // cleared after its backward, so both read them; the positions are the caller's).
  Documents docs_;
  // docs_ as the memory plan names it: whether the pass masks documents, and reads the
  // positions as RoPE's / wpe's.
  DocumentMasking document_masking() const {
    return {docs_.positions != nullptr, docs_.positions != nullptr && docs_.reset_positions};
  }
  // With documents: uploads docs_'s positions and their starts (document_starts) into
  // `positions` and `starts`, int32 [B*T] views of buffers allocated on first use with
  // `capacity` elements (MemCategory::activations, as the model's other buffers); returns the
  // starts (host). Throws as document_starts.
  std::vector<int32_t> upload_documents(DeviceRuntime& rt, DeviceBuffer& positions,
                                        DeviceBuffer& starts, int64_t B, int64_t T,
                                        int64_t capacity) const;

 private:
  void set_documents(const Documents& docs);
};

}  // namespace fsdp
