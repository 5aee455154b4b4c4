// The decoder-only families' shared entry points (see fsdp/model/causal_lm.hpp).
#include "fsdp/model/causal_lm.hpp"

#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {
void require_causal(const data::Batch& batch, const char* family) {
  if (batch.target_len != batch.L) {
    throw Error(std::string(family) + ": a causal-LM batch has target_len == L");
  }
}
}  // namespace

void CausalLm::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                int64_t T, float grad_scale, ModuleHooks& hooks,
                                const TensorView& loss) {
  forward(tokens, targets, B, T, hooks, true, grad_scale, loss);
  backward(B, T, hooks);
}

void CausalLm::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                            ModuleHooks& hooks, const TensorView& loss) {
  forward(tokens, targets, B, T, hooks, false, 1.f, loss);
}

void CausalLm::forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                                const TensorView& loss) {
  require_causal(batch, family_name());
  forward_backward(batch.inputs.data(), batch.targets.data(), batch.B, batch.L, grad_scale, hooks,
                   loss);
}

void CausalLm::forward_loss(const data::Batch& batch, ModuleHooks& hooks, const TensorView& loss) {
  require_causal(batch, family_name());
  forward_loss(batch.inputs.data(), batch.targets.data(), batch.B, batch.L, hooks, loss);
}

}  // namespace fsdp
