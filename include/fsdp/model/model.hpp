// fsdp/model/model.hpp: the Model interface: what the trainer runs on a data::Batch.
// (The registry of model families, keyed by model.type, joins it in fsdp/model/model.hpp.)
#pragma once

#include <vector>

#include "fsdp/backend/backend.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/fsdp/module.hpp"

namespace fsdp {

// One training/evaluation model instance on a backend (activations, scratch, kernels).
class Model {
 public:
  virtual ~Model() = default;
  // Modules in forward order (name, wrap class, parameters); what the engine shards.
  virtual const std::vector<ModuleDecl>& modules() const = 0;
  // One micro-batch: forward, loss, backward. loss[0] (fp64 [1] device scalar) += the SUM of
  // the cross-entropy (nats) over the batch's targets that are not kIgnoreIndex; gradients
  // accumulate into hooks.grad() scaled by `grad_scale` (the trainer passes 1 / (global
  // number of target tokens of the step), times the loss scale under fp16).
  virtual void forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                                const TensorView& loss) = 0;
  // Forward and loss only (evaluation): loss[0] += the summed cross-entropy.
  virtual void forward_loss(const data::Batch& batch, ModuleHooks& hooks,
                            const TensorView& loss) = 0;
};

}  // namespace fsdp
