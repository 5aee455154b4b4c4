// AdamW / SGD over flat shards and the LR schedule (see fsdp/optim/optimizer.hpp).
#include "fsdp/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp {

double learning_rate(const OptimConfig& o, int64_t max_steps, int64_t step) {
  const int64_t decay_steps = o.decay_steps > 0 ? o.decay_steps : max_steps;
  if (o.warmup_steps > 0 && step <= o.warmup_steps) {
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  }
  if (o.lr_scheduler_type == LrSchedulerType::constant_with_warmup) return o.lr;
  if (step >= decay_steps) return o.min_lr;
  const double pi = 3.14159265358979323846;
  auto at = [&](double f) { return o.min_lr + f * (o.lr - o.min_lr); };  // f: 1 -> 0
  auto progress = [](int64_t done, int64_t len) {
    return static_cast<double>(done) / static_cast<double>(std::max<int64_t>(1, len));
  };
  switch (o.lr_scheduler_type) {
    case LrSchedulerType::linear:
      return at(1.0 - progress(step - o.warmup_steps, decay_steps - o.warmup_steps));
    case LrSchedulerType::warmup_stable_decay: {
      const int64_t start = decay_steps - o.num_decay_steps;
      if (step <= start) return o.lr;
      const double p = progress(step - start, o.num_decay_steps);
      switch (o.decay_type) {
        case DecayType::linear: return at(1.0 - p);
        case DecayType::one_minus_sqrt: return at(1.0 - std::sqrt(p));
        case DecayType::cosine: break;
      }
      return at(0.5 * (1.0 + std::cos(pi * p)));
    }
    case LrSchedulerType::cosine:
    case LrSchedulerType::constant_with_warmup: break;
  }
  return at(0.5 * (1.0 + std::cos(pi * progress(step - o.warmup_steps, decay_steps - o.warmup_steps))));
}

Optimizer::Optimizer(const OptimConfig& config, DeviceRuntime& backend) : cfg_(config), be_(backend) {}

void Optimizer::add_shard(const TensorView& param, const TensorView& grad,
                          std::vector<ElementRange> decayed, DeviceRuntime* runtime) {
  if (param.dtype != DType::f32 || grad.dtype != DType::f32 || grad.numel() != param.numel()) {
    throw Error("Optimizer::add_shard: param and grad must be fp32 views of equal size");
  }
  DeviceRuntime& rt = runtime != nullptr ? *runtime : be_;
  Shard s{param, grad, std::move(decayed), &rt, {}, {}};
  const int64_t n = param.numel();
  s.s0 = DeviceBuffer::floats(rt, n, MemCategory::optimizer_state);
  rt.fill_zero(s.s0.view());
  if (cfg_.name == OptimizerKind::adamw) {
    s.s1 = DeviceBuffer::floats(rt, n, MemCategory::optimizer_state);
    rt.fill_zero(s.s1.view());
  }
  shards_.push_back(std::move(s));
}

void Optimizer::step(double lr, const TensorView& grad_scale) {
  begin_update();
  for (int i = 0; i < num_shards(); ++i) step_shard(i, lr, grad_scale);
}

// One update of a shard: the weight decay applies on its decayed segments only (and
// compute_copy, if any, is written in the same pass; the gradient is scaled as it is read).
void Optimizer::step_shard(int index, double lr, const TensorView& grad_scale,
                           const TensorView& compute_copy) {
  if (index < 0 || index >= num_shards()) {
    throw Error("optimizer: step_shard(" + std::to_string(index) + "): " +
                std::to_string(num_shards()) + " shards are registered");
  }
  Shard& s = shards_[static_cast<std::size_t>(index)];
  if (compute_copy && ((compute_copy.dtype != DType::bf16 && compute_copy.dtype != DType::f16) ||
                       compute_copy.numel() != s.param.numel())) {
    throw Error("optimizer: step_shard(" + std::to_string(index) + "): compute_copy is " +
                std::string(to_string(compute_copy.dtype)) + " " + compute_copy.shape.str() +
                " (expected bf16 or fp16 of the shard's " + std::to_string(s.param.numel()) +
                " elements)");
  }
  const auto flr = static_cast<float>(lr);
  const WeightDecay wd(static_cast<float>(cfg_.weight_decay), &s.decayed);
  switch (cfg_.name) {
    case OptimizerKind::adamw:
      s.rt->adamw_update(s.param, s.grad, s.s0.view(), s.s1.view(), flr,
                       static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                       static_cast<float>(cfg_.eps), wd, updates_, compute_copy, grad_scale);
      break;
    case OptimizerKind::sgd:
      s.rt->sgd_update(s.param, s.grad, s.s0.view(), flr, static_cast<float>(cfg_.momentum), wd,
                     updates_, compute_copy, grad_scale);
      break;
  }
}

std::vector<OptimState> optimizer_states(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adamw: return {OptimState::exp_avg, OptimState::exp_avg_sq};
    case OptimizerKind::sgd: return {OptimState::momentum_buffer};
  }
  throw Error("optimizer_states: unknown optimizer kind");
}

DeviceRuntime& Optimizer::runtime(int index) {
  if (index < 0 || index >= num_shards()) {
    throw Error("optimizer: runtime(" + std::to_string(index) + "): " +
                std::to_string(num_shards()) + " shards are registered");
  }
  return *shards_[static_cast<std::size_t>(index)].rt;
}

TensorView Optimizer::state(int index, OptimState which) {
  if (index < 0 || index >= num_shards()) {
    throw Error(std::string("optimizer ") + to_string(kind()) + ": no shard " + std::to_string(index) + " (it has " +
                std::to_string(num_shards()) + ")");
  }
  auto& s = shards_[static_cast<std::size_t>(index)];
  switch (kind()) {
    case OptimizerKind::adamw:
      if (which == OptimState::exp_avg) return s.s0.view();
      if (which == OptimState::exp_avg_sq) return s.s1.view();
      break;
    case OptimizerKind::sgd:
      if (which == OptimState::momentum_buffer) return s.s0.view();
      break;
  }
  std::string have;
  for (OptimState o : states()) have += std::string(have.empty() ? "" : ", ") + to_string(o);
  throw Error(std::string("optimizer ") + to_string(kind()) + " has no state " + to_string(which) + " (its states: " +
              have + ")");
}

}  // namespace fsdp
