// AdamW / SGD over flat shards and the LR schedule (see fsdp/optim/optimizer.hpp).
#include "fsdp/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "fsdp/core/error.hpp"

namespace fsdp {

std::vector<DecaySegment> decay_segments(const FlatParamLayout& layout, int64_t shard) {
  const int64_t begin = layout.shard_begin(shard), end = layout.shard_end(shard);
  std::vector<DecaySegment> out;
  auto push = [&](int64_t lo, int64_t hi, bool decay) {
    if (lo >= hi) return;
    if (!out.empty() && out.back().decay == decay && out.back().end == lo - begin) {
      out.back().end = hi - begin;
    } else {
      out.push_back({lo - begin, hi - begin, decay});
    }
  };
  for (const auto& e : layout.entries) {
    push(std::max(begin, e.offset), std::min(end, e.offset + e.spec.numel()), e.spec.weight_decay);
  }
  push(std::max(begin, layout.numel), end, false);  // padding
  return out;
}

double learning_rate(const OptimConfig& o, int64_t max_steps, int64_t step) {
  const int64_t decay_steps = o.decay_steps > 0 ? o.decay_steps : max_steps;
  if (o.warmup_steps > 0 && step <= o.warmup_steps) {
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  }
  if (step >= decay_steps) return o.min_lr;
  const double progress = static_cast<double>(step - o.warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, decay_steps - o.warmup_steps));
  const double pi = 3.14159265358979323846;
  return o.min_lr + 0.5 * (1.0 + std::cos(pi * progress)) * (o.lr - o.min_lr);
}

Optimizer::Optimizer(const OptimConfig& config, Backend& backend) : cfg_(config), be_(backend) {}

void Optimizer::add_shard(const TensorView& param, const TensorView& grad,
                          std::vector<DecaySegment> segments) {
  if (param.dtype != DType::f32 || grad.dtype != DType::f32 || grad.numel() != param.numel()) {
    throw Error("Optimizer::add_shard: param and grad must be fp32 views of equal size");
  }
  Shard s{param, grad, std::move(segments), {}, {}};
  const int64_t n = param.numel();
  s.s0 = DeviceBuffer::floats(be_, n, MemCategory::optimizer_state);
  be_.fill_zero(s.s0.view());
  if (cfg_.name == OptimizerKind::adamw) {
    s.s1 = DeviceBuffer::floats(be_, n, MemCategory::optimizer_state);
    be_.fill_zero(s.s1.view());
  }
  shards_.push_back(std::move(s));
}

void Optimizer::step(double lr) {
  const int64_t step = ++updates_;
  const auto flr = static_cast<float>(lr);
  for (auto& s : shards_) {
    for (const auto& seg : s.segments) {
      const int64_t b = seg.begin, n = seg.end - seg.begin;
      const float wd = seg.decay ? static_cast<float>(cfg_.weight_decay) : 0.f;
      switch (cfg_.name) {
        case OptimizerKind::adamw:
          be_.adamw_update(s.param.slice(b, n), s.grad.slice(b, n), s.s0.view().slice(b, n),
                           s.s1.view().slice(b, n), flr, static_cast<float>(cfg_.beta1),
                           static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps), wd, step);
          break;
        case OptimizerKind::sgd:
          be_.sgd_update(s.param.slice(b, n), s.grad.slice(b, n), s.s0.view().slice(b, n), flr,
                         static_cast<float>(cfg_.momentum), wd, step);
          break;
      }
    }
  }
}

std::vector<std::string> Optimizer::state_names() const {
  if (cfg_.name == OptimizerKind::adamw) return {"exp_avg", "exp_avg_sq"};
  return {"momentum_buffer"};
}

TensorView Optimizer::state(int index, const std::string& name) {
  auto& s = shards_.at(static_cast<std::size_t>(index));
  if (name == "exp_avg" || name == "momentum_buffer") return s.s0.view();
  if (name == "exp_avg_sq" && s.s1) return s.s1.view();
  throw Error("optimizer has no state named " + name);
}

}  // namespace fsdp
