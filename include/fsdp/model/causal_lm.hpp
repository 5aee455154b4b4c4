// fsdp/model/causal_lm.hpp: what the decoder-only families (GPT-2, Llama) share around their
// own forward and backward: the data::Batch entry points (a causal-LM batch: targets are the
// next tokens, target_len == L), the pointer forms the reference tests call, and the logits of
// the last evaluation pass.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/core/tensor.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/fsdp/module.hpp"
#include "fsdp/model/model.hpp"

namespace fsdp {

class CausalLm : public Model {
 public:
  // Model interface on a causal-LM Batch; throws fsdp::Error naming the family when
  // batch.target_len != batch.L.
  void forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                        const TensorView& loss) override;
  void forward_loss(const data::Batch& batch, ModuleHooks& hooks, const TensorView& loss) override;

  // One training micro-batch: forward, loss, backward. tokens, targets: [B,T] int32 host
  // arrays. loss[0] (fp64 [1] device scalar) += the SUM over the B*T positions of the
  // cross-entropy (nats); gradients accumulate into hooks.grad() scaled by `grad_scale`
  // (1/(B*T) for the local mean, times the loss scale under fp16).
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float grad_scale, ModuleHooks& hooks, const TensorView& loss);
  // Forward and loss only (evaluation): loss[0] += the summed cross-entropy over B*T positions.
  void forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                    ModuleHooks& hooks, const TensorView& loss);

  // The logits of the last forward_loss: [B*T, padded vocabulary] in the activation dtype, row
  // b*T + t for position t of sequence b; the columns past vocab_size are the vocabulary
  // padding (never read by the loss). After forward_backward the buffer holds dlogits instead
  // (the fused cross-entropy overwrites it). An empty view before the first forward. For tests
  // against a reference model, as llm.c's test_gpt2 reads logits.
  virtual TensorView last_logits() const = 0;

 protected:
  // "GPT-2", "Llama": for messages.
  virtual const char* family_name() const = 0;
  // The family's forward (with the loss, and dlogits when `backward`) and backward passes.
  virtual void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                       ModuleHooks& hooks, bool backward, float grad_scale,
                       const TensorView& loss) = 0;
  virtual void backward(int64_t B, int64_t T, ModuleHooks& hooks) = 0;
};

}  // namespace fsdp
