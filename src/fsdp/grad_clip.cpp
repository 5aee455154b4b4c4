// Gradient-norm clipping and dynamic loss scaling over the engine's gradient shards (see
// fsdp/fsdp/grad_clip.hpp).
#include "fsdp/fsdp/grad_clip.hpp"

#include <memory>
#include <vector>

#include "fsdp/fsdp/collectives.hpp"

namespace fsdp {

GradNormClipper::GradNormClipper(FsdpEngine& engine)
    : engine_(engine),
      norm_parts_(engine.backend(), DType::f64, 1 + engine.num_shards(), MemCategory::other),
      clip_coef_(DeviceBuffer::floats(engine.backend(), 1, MemCategory::other)) {
  bool mixed = false;  // offloaded units beside units on the device
  for (int u = 0; u < engine.num_units(); ++u) mixed = mixed || !engine.offloaded(u);
  if (engine.offloaded() && mixed) {
    unit_norms_ =
        DeviceBuffer(engine.backend(), DType::f64, engine.num_units(), MemCategory::other);
  }
}

// The shard arithmetic runs on each unit's shard runtime; offloaded, the sum is the host's,
// the device's scalars copied in before and out after.
void GradNormClipper::clip(double max_norm, const TensorView& norm) {
  engine_.wait_shard_writes();  // an update still reading host_coef_
  has_coef_ = false;
  DeviceRuntime& be = engine_.backend();
  const bool offloaded = engine_.offloaded();
  Communicator& shard = engine_.shard_comm();
  const int S = shard.size();
  const int U = engine_.num_units();
  const TensorView local = norm_parts_.view().slice(0, 1);
  const TensorView parts = norm_parts_.view().slice(1, S);
  if (!offloaded) {
    be.fill_zero(local);
    for (int u = 0; u < U; ++u) be.squared_norm(local, engine_.shard_grad(u));
  } else {
    // Units on the device (fsdp.offload_optimizer_ratio) sum theirs there, each into its own
    // slot, copied across at once; the host then adds every unit's sum in unit order, as
    // squared_norm adds them (acc += the shard's sum): the same bits as one accumulator.
    std::vector<double> device_sums(static_cast<std::size_t>(U), 0.0);
    if (unit_norms_) {
      be.fill_zero(unit_norms_.view());
      for (int u = 0; u < U; ++u) {
        if (!engine_.offloaded(u)) {
          be.squared_norm(unit_norms_.view().slice(u, 1), engine_.shard_grad(u));
        }
      }
      be.copy_to_host(device_sums.data(), unit_norms_.view());
    }
    double host_norm = 0.0;
    const TensorView acc(&host_norm, DType::f64, {1});
    for (int u = 0; u < U; ++u) {
      // An offloaded unit whose norm the device summed before its copy: one add, without
      // reading the host shard.
      double on_device = 0.0;
      if (!engine_.offloaded(u)) {
        host_norm += device_sums[static_cast<std::size_t>(u)];
      } else if (engine_.grad_norm_sq_on_device(u, on_device)) {
        host_norm += on_device;
      } else {
        engine_.shard_runtime(u).squared_norm(acc, engine_.shard_grad(u));
      }
    }
    be.copy_from_host(local, &host_norm);  // the slot the gather sends
  }
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

TensorView GradNormClipper::coefficient(int unit) {
  if (!has_coef_) return {};
  return engine_.offloaded(unit) ? TensorView(&host_coef_, DType::f32, {1}) : clip_coef_.view();
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
  const float inv_scale = static_cast<float>(1.0 / scale_);
  for (int u = 0; u < engine.num_units(); ++u) {  // the units on the device
    if (!engine.offloaded(u)) be.unscale_and_check(engine.shard_grad(u), inv_scale, found_inf);
  }
  if (!engine.offloaded()) return;
  double host_flag = 0.0;  // the offloaded units' on the host, the flag copied across
  const TensorView flag(&host_flag, DType::f64, {1});
  be.copy_to_host(&host_flag, found_inf);
  for (int u = 0; u < engine.num_units(); ++u) {
    if (engine.offloaded(u)) {
      engine.shard_runtime(u).unscale_and_check(engine.shard_grad(u), inv_scale, flag);
    }
  }
  be.copy_from_host(found_inf, &host_flag);
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
