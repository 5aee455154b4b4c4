// Gradient-norm clipping and dynamic loss scaling over the engine's gradient shards (see
// fsdp/fsdp/grad_clip.hpp).
#include "fsdp/fsdp/grad_clip.hpp"

#include <memory>

#include "fsdp/fsdp/collectives.hpp"

namespace fsdp {

GradNormClipper::GradNormClipper(FsdpEngine& engine)
    : engine_(engine),
      norm_parts_(engine.backend(), DType::f64, 1 + engine.num_shards(), MemCategory::other),
      clip_coef_(DeviceBuffer::floats(engine.backend(), 1, MemCategory::other)) {}

// The shard arithmetic runs on the shards' runtime; offloaded, its scalars are host copies
// of the backend's (copied in before, out after).
void GradNormClipper::clip(double max_norm, const TensorView& norm) {
  engine_.wait_shard_writes();  // an update still reading host_coef_
  has_coef_ = false;
  DeviceRuntime& be = engine_.backend();
  DeviceRuntime& sh = engine_.shard_runtime();
  const bool offloaded = engine_.offloaded();
  Communicator& shard = engine_.shard_comm();
  const int S = shard.size();
  const TensorView local = norm_parts_.view().slice(0, 1);
  const TensorView parts = norm_parts_.view().slice(1, S);
  double host_norm = 0.0;
  const TensorView acc = offloaded ? TensorView(&host_norm, DType::f64, {1}) : local;
  sh.fill_zero(acc);
  for (int u = 0; u < engine_.num_units(); ++u) {
    // Offloaded, a unit whose norm the device summed before its copy: one add, the same
    // as squared_norm's (acc += the shard's sum), without reading the host shard.
    double on_device = 0.0;
    if (offloaded && engine_.grad_norm_sq_on_device(u, on_device)) {
      host_norm += on_device;
    } else {
      sh.squared_norm(acc, engine_.shard_grad(u));
    }
  }
  if (offloaded) be.copy_from_host(local, &host_norm);  // the slot the gather sends
  // Every shard's partial sum, added in shard order, so the norm is bitwise identical on
  // every rank (an all-reduce need not be).
  {
    Profiler* prof = engine_.profiler();
    std::unique_ptr<Work> gather;
    {
      ProfileRange range(prof, "collective");
      if (range) describe_collective(range, "all_gather", "issue", -1, "grad_norm", shard, 1, DType::f64);
      gather = shard.all_gather(local.data, parts.data, 1, DType::f64, be.compute_stream());
    }
    StepTimer::Scope waiting(engine_.step_timer(), Phase::comm_wait);
    ProfileRange range(prof, "collective");
    if (range) describe_collective(range, "all_gather", "wait", -1, "grad_norm", shard, 1, DType::f64);
    gather->wait();
  }
  be.clip_coefficient(norm, clip_coef_.view(), parts, max_norm);
  if (max_norm <= 0) return;
  if (offloaded) be.copy_to_host(&host_coef_, clip_coef_.view());
  has_coef_ = true;
}

TensorView GradNormClipper::coefficient() {
  if (!has_coef_) return {};
  return engine_.offloaded() ? TensorView(&host_coef_, DType::f32, {1}) : clip_coef_.view();
}

GradScaler::GradScaler(const MixedPrecisionConfig& mp)
    : enabled_(mp.uses_fp16()),
      scale_(mp.uses_fp16() ? mp.init_scale : 1.0),
      growth_factor_(mp.growth_factor),
      backoff_factor_(mp.backoff_factor),
      growth_interval_(mp.growth_interval) {}

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  if (!enabled_ || scale <= 0) return;
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

void GradScaler::unscale(FsdpEngine& engine, const TensorView& found_inf) const {
  DeviceRuntime& be = engine.backend();
  DeviceRuntime& sh = engine.shard_runtime();
  const bool offloaded = engine.offloaded();
  const float inv_scale = static_cast<float>(1.0 / scale_);
  double host_flag = 0.0;
  const TensorView flag = offloaded ? TensorView(&host_flag, DType::f64, {1}) : found_inf;
  if (offloaded) be.copy_to_host(&host_flag, found_inf);
  for (int u = 0; u < engine.num_units(); ++u) sh.unscale_and_check(engine.shard_grad(u), inv_scale, flag);
  if (offloaded) be.copy_from_host(found_inf, &host_flag);
}

void GradScaler::update(bool found_inf) {
  if (!enabled_) return;
  if (found_inf) {
    scale_ *= backoff_factor_;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == growth_interval_) {
    scale_ *= growth_factor_;
    growth_tracker_ = 0;
  }
}

}  // namespace fsdp
