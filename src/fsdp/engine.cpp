// The FSDP engine: unit construction, shard initialisation and the unshard / reshard /
// reduce schedule (see fsdp/fsdp/engine.hpp).
#include "fsdp/fsdp/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <system_error>
#include <thread>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp {

struct FsdpEngine::Unit {
  FlatParamLayout layout;
  std::vector<int> modules;      // modules in this unit
  DeviceBuffer shard_param;      // fp32 [shard_numel], MemCategory::sharded_params (sh_)
  DeviceBuffer shard_grad;       // fp32 [shard_numel], MemCategory::grads (sh_)
  DeviceBuffer full_param;       // param_dtype [padded_numel] while unsharded (if needs_full)
  DeviceBuffer full_grad;        // param_dtype [padded_numel] during backward (if needs_full)
  std::unique_ptr<Work> gather;  // pending all-gather into full_param
  // cpu_offload: full_param is filled once `ready` completes (the upload, then the gather).
  std::shared_ptr<Event> ready;
  // cpu_offload with a 16-bit param_dtype: the shard cast to param_dtype once per update
  // (params_updated), what each unshard uploads: [shard_numel], MemCategory::comm_buffers of
  // the host.
  DeviceBuffer host_param;
  // cpu_offload between gradient accumulation boundaries: the reduced gradients of the
  // step's micro-batches so far, fp32 [shard_numel] on the device (MemCategory::grads).
  DeviceBuffer grad_acc;
  // Gradient reduction in flight (issued at the unit's post_backward, waited in end_step):
  // reduced (reduce_dtype [shard_numel], unless the result is shard_grad) and its Works.
  ReduceResult reduction;
  TrainingState training = TrainingState::IDLE;
  ShardedState sharded = ShardedState::SHARDED;
  GradState grad = GradState::EMPTY;
  int fwd_done = 0;              // modules of this unit done in forward this step
  int bwd_done = 0;              // modules of this unit done in backward this step
};

StrategyTraits strategy_traits(ShardingStrategy strategy) {
  using S = StrategyTraits::ShardOver;
  switch (strategy) {
    case ShardingStrategy::FULL_SHARD: return {S::world, true};
    case ShardingStrategy::SHARD_GRAD_OP: return {S::world, false};
    case ShardingStrategy::NO_SHARD: return {S::nobody, false};
    case ShardingStrategy::HYBRID_SHARD: return {S::shard_group, true};
    case ShardingStrategy::HYBRID_SHARD_ZERO2: return {S::shard_group, false};
  }
  throw Error("unknown sharding strategy");
}

int64_t shards_for(ShardingStrategy strategy, int world_size, int shard_group_size) {
  switch (strategy_traits(strategy).shard_over) {
    case StrategyTraits::ShardOver::world: return world_size;
    case StrategyTraits::ShardOver::shard_group: return shard_group_size;
    case StrategyTraits::ShardOver::nobody: return 1;
  }
  return 1;
}

std::vector<ElementRange> decayed_ranges(const FlatParamLayout& layout, int64_t shard) {
  const int64_t begin = layout.shard_begin(shard), end = layout.shard_end(shard);
  std::vector<ElementRange> out;
  for (const FlatEntry& e : layout.entries) {
    if (!e.spec.weight_decay) continue;
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.spec.numel());
    if (lo >= hi) continue;
    if (!out.empty() && out.back().end == lo - begin) {
      out.back().end = hi - begin;
    } else {
      out.push_back({lo - begin, hi - begin});
    }
  }
  return out;
}

std::vector<FlatParamLayout> build_unit_layouts(const std::vector<ModuleDecl>& modules,
                                                const FsdpConfig& fsdp, int64_t num_shards) {
  const std::vector<int> unit_of = wrap_modules(modules, fsdp);
  const int n_units = *std::max_element(unit_of.begin(), unit_of.end()) + 1;
  std::vector<std::vector<ParamSpec>> specs(n_units);
  std::vector<std::string> names(n_units, "root");
  for (std::size_t m = 0; m < modules.size(); ++m) {
    if (unit_of[m] != 0) names[unit_of[m]] = modules[m].name;
    for (const auto& p : modules[m].params) specs[unit_of[m]].push_back(p);
  }
  std::vector<FlatParamLayout> layouts;
  for (int u = 0; u < n_units; ++u) {
    layouts.push_back(FlatParamLayout::build(names[u], std::move(specs[u]), num_shards));
  }
  return layouts;
}

std::vector<int> wrap_modules(const std::vector<ModuleDecl>& modules, const FsdpConfig& fsdp) {
  std::vector<int> unit_of(modules.size(), 0);
  if (fsdp.auto_wrap_policy == AutoWrapPolicy::NO_WRAP) return unit_of;
  int next = 1;
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const auto& cls = fsdp.transformer_layer_cls_to_wrap;
    if (std::find(cls.begin(), cls.end(), modules[m].cls) != cls.end()) unit_of[m] = next++;
  }
  return unit_of;
}

namespace {
Communicator& shard_group_of(ShardingStrategy s, const DeviceMesh& mesh) {
  switch (strategy_traits(s).shard_over) {
    case StrategyTraits::ShardOver::world: return mesh.world();
    case StrategyTraits::ShardOver::shard_group: return mesh.shard_group();
    case StrategyTraits::ShardOver::nobody: return mesh.self();
  }
  return mesh.self();
}
Communicator& replicate_group_of(ShardingStrategy s, const DeviceMesh& mesh) {
  switch (strategy_traits(s).shard_over) {
    case StrategyTraits::ShardOver::world: return mesh.self();
    case StrategyTraits::ShardOver::shard_group: return mesh.replicate_group();
    case StrategyTraits::ShardOver::nobody: return mesh.world();
  }
  return mesh.self();
}
}  // namespace

FsdpEngine::FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
                       const MixedPrecisionConfig& mixed_precision, const DeviceMesh& mesh,
                       DeviceRuntime& backend, uint64_t seed, DeviceRuntime* offload)
    : FsdpEngine(modules, config, mixed_precision,
                 shard_group_of(config.sharding_strategy, mesh),
                 replicate_group_of(config.sharding_strategy, mesh), backend, seed, true,
                 offload) {}

namespace {
DeviceRuntime& shard_runtime_of(const FsdpConfig& config, DeviceRuntime& backend,
                                DeviceRuntime* offload) {
  if (!config.cpu_offload) return backend;
  if (offload == nullptr) throw Error("FSDP: fsdp.cpu_offload needs an offload runtime");
  return *offload;
}
}  // namespace

FsdpEngine::FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
                       const MixedPrecisionConfig& mixed_precision, Communicator& shard,
                       Communicator& replicate, DeviceRuntime& backend, uint64_t seed,
                       bool initialise, DeviceRuntime* offload)
    : be_(backend),
      sh_(shard_runtime_of(config, backend, offload)),
      config_(config),
      mp_(mixed_precision),
      traits_(strategy_traits(config.sharding_strategy)),
      shard_comm_(&shard),
      replicate_comm_(&replicate) {
  build(modules, seed, initialise);
}

void FsdpEngine::build(const std::vector<ModuleDecl>& modules, uint64_t seed, bool initialise) {
  module_unit_ = wrap_modules(modules, config_);
  std::vector<FlatParamLayout> layouts = build_unit_layouts(modules, config_, shard_comm_->size());
  for (auto& layout : layouts) {
    auto unit = std::make_unique<Unit>();
    unit->layout = std::move(layout);
    const int64_t n = unit->layout.shard_numel;
    unit->shard_param = DeviceBuffer::floats(sh_, n, MemCategory::sharded_params);
    unit->shard_grad = DeviceBuffer::floats(sh_, n, MemCategory::grads);
    if (initialise) sh_.fill_zero(unit->shard_grad.view());
    if (offloaded() && mp_.param_dtype != DType::f32) {
      unit->host_param = DeviceBuffer(sh_, mp_.param_dtype, n, MemCategory::comm_buffers);
    }
    units_.push_back(std::move(unit));
    if (initialise) init_shard(num_units() - 1, seed);
  }
  // Parameter ids run over modules in order; within a unit, entries follow the same order.
  std::vector<int> next_entry(units_.size(), 0);
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const int u = module_unit_[m];
    units_[u]->modules.push_back(static_cast<int>(m));
    for (std::size_t i = 0; i < modules[m].params.size(); ++i) {
      const FlatEntry& e = units_[u]->layout.entries[next_entry[u]++];
      Shape shape;
      switch (e.spec.shape.size()) {
        case 1: shape = {e.spec.shape[0]}; break;
        case 2: shape = {e.spec.shape[0], e.spec.shape[1]}; break;
        case 3: shape = {e.spec.shape[0], e.spec.shape[1], e.spec.shape[2]}; break;
        default: shape = {e.spec.numel()}; break;
      }
      param_loc_.push_back({u, e.offset, shape});
    }
  }
  // Prefetch targets (PyTorch FSDP's execution order): forward prefetches the unit whose
  // forward starts next (units ordered by their first module); backward prefetches the unit
  // whose forward ended just before this one's (ordered by last module: the root, holding
  // ln_f, ends last, so its backward prefetches the last block).
  std::vector<int> first(units_.size(), -1), last(units_.size(), -1);
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const int u = module_unit_[m];
    if (first[u] < 0) first[u] = static_cast<int>(m);
    last[u] = static_cast<int>(m);
  }
  std::vector<int> by_first(units_.size()), by_last(units_.size());
  std::iota(by_first.begin(), by_first.end(), 0);
  std::iota(by_last.begin(), by_last.end(), 0);
  std::sort(by_first.begin(), by_first.end(), [&](int a, int b) { return first[a] < first[b]; });
  std::sort(by_last.begin(), by_last.end(), [&](int a, int b) { return last[a] < last[b]; });
  fwd_next_.assign(units_.size(), -1);
  bwd_next_.assign(units_.size(), -1);
  for (std::size_t i = 0; i + 1 < units_.size(); ++i) fwd_next_[by_first[i]] = by_first[i + 1];
  for (std::size_t i = 1; i < units_.size(); ++i) bwd_next_[by_last[i]] = by_last[i - 1];
  norm_parts_ = DeviceBuffer(be_, DType::f64, 1 + shard_comm_->size(), MemCategory::other);
  clip_coef_ = DeviceBuffer::floats(be_, 1, MemCategory::other);
  if (offloaded()) {
    host_norm_ = DeviceBuffer(sh_, DType::f64, 1, MemCategory::other);
    host_flag_ = DeviceBuffer(sh_, DType::f64, 1, MemCategory::other);
    host_coef_ = DeviceBuffer::floats(sh_, 1, MemCategory::other);
  }
  reduce_stream_ = be_.create_stream();
  if (offloaded()) copy_stream_ = be_.create_stream();
  if (initialise) params_updated();
}

void FsdpEngine::params_updated() {
  if (!offloaded()) return;
  copy_stream_->synchronize();  // no upload still reads a host copy (or an fp32 shard)
  for (auto& u : units_) {
    if (u->host_param) sh_.cast(u->host_param.view(), u->shard_param.view());
  }
  params_cast_ = true;
}

void FsdpEngine::set_gradient_accumulation_boundary(bool boundary) { boundary_ = boundary; }

// Pending Work completes in its destructor. Copies to or from host memory (offload) may
// still be in flight when a step is cut short: they finish before that memory is freed.
FsdpEngine::~FsdpEngine() {
  for (Stream* s : {reduce_stream_.get(), copy_stream_.get()}) {
    if (s == nullptr) continue;
    try {
      s->synchronize();
    } catch (...) {  // a device error: nothing more to do here
    }
  }
}

TrainingState FsdpEngine::training_state(int unit) const { return units_.at(unit)->training; }
ShardedState FsdpEngine::sharded_state(int unit) const { return units_.at(unit)->sharded; }
GradState FsdpEngine::grad_state(int unit) const { return units_.at(unit)->grad; }

void FsdpEngine::transition(int unit, TrainingState from, TrainingState to, const char* hook) {
  Unit& u = *units_[unit];
  if (u.training != from) {
    throw Error("FSDP: illegal unit state transition in " + std::string(hook) + ": unit " +
                std::to_string(unit) + " (" + u.layout.unit_name + ") is " +
                to_string(u.training) + ", expected " + to_string(from) + " to enter " +
                to_string(to));
  }
  u.training = to;
}

CollectiveTrace FsdpEngine::trace(int unit) {
  CollectiveTrace t;
  t.profiler = profiler_;
  t.timer = timer_;
  if (profiler_) {
    t.describe = [this, unit](ProfileRange& range, const char* op, const char* stage,
                              const Communicator& comm, int64_t numel, DType dtype) {
      describe(range, op, stage, unit, comm, numel, dtype);
    };
  }
  return t;
}

const FlatParamLayout& FsdpEngine::layout(int unit) const { return units_[unit]->layout; }
std::vector<FlatParamLayout> FsdpEngine::layouts() const {
  std::vector<FlatParamLayout> out;
  for (const auto& u : units_) out.push_back(u->layout);
  return out;
}
int64_t FsdpEngine::shard_numel(int unit) const { return units_[unit]->layout.shard_numel; }
TensorView FsdpEngine::shard_param(int unit) { return units_[unit]->shard_param.view(); }
TensorView FsdpEngine::shard_grad(int unit) { return units_[unit]->shard_grad.view(); }

int64_t FsdpEngine::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->layout.numel;
  return n;
}

// Rank s generates only flat elements [s*shard_numel, (s+1)*shard_numel): element k of a
// parameter is init(seed, key(name), k), whatever the world size; vocabulary padding rows
// (ParamSpec::vocab_rows) are 0, so the model's own rows are the unpadded model's. Every
// element is a function of (seed, name, k) alone (counter-based RNG), so the shard is filled
// by as many threads as this rank may use (usable_cpus, one per 2^20 elements at most): the
// same values for any thread count, and 7B's 6.7e9 normals in seconds instead of minutes.
void FsdpEngine::init_shard(int unit, uint64_t seed) {
  Unit& u = *units_[unit];
  const auto& L = u.layout;
  const int64_t begin = L.shard_begin(shard_comm_->rank()), end = L.shard_end(shard_comm_->rank());
  std::vector<float> host(static_cast<std::size_t>(L.shard_numel), 0.f);
  const int64_t threads =
      std::clamp<int64_t>(L.shard_numel >> 20, 1, static_cast<int64_t>(usable_cpus()));
  const int64_t chunk = (L.shard_numel + threads - 1) / threads;
  auto fill = [&](int64_t from, int64_t to) {  // flat elements [from, to) of the shard range
    for (const auto& e : L.entries) {
      const int64_t lo = std::max(from, e.offset), hi = std::min(to, e.offset + e.spec.numel());
      if (lo < hi) init_elements(e, seed, lo, hi, host.data() + (lo - begin));
    }
  };
  auto part = [&](int64_t t) {  // the t-th chunk of the shard range
    fill(std::min(end, begin + t * chunk), std::min(end, begin + (t + 1) * chunk));
  };
  std::vector<std::thread> pool;
  int64_t started = 1;  // chunks 1 .. started-1 have a thread
  try {
    for (; started < threads; ++started) pool.emplace_back(part, started);
  } catch (const std::system_error&) {  // no more threads: the rest on this one
  }
  part(0);
  for (int64_t t = started; t < threads; ++t) part(t);
  for (auto& th : pool) th.join();
  sh_.copy_from_host(u.shard_param.view(), host.data());
}

// Elements [lo, hi) of the flat buffer, all inside entry e, into out[0, hi - lo).
void FsdpEngine::init_elements(const FlatEntry& e, uint64_t seed, int64_t lo, int64_t hi,
                               float* out) {
  const uint64_t key = rng::key_of(e.spec.name);
  const int64_t own = e.spec.unpadded_numel();  // the model's rows; vocabulary pad rows after
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t k = j - e.offset;
    float v = 0.f;  // a vocabulary pad row (k >= own) stays 0
    if (k < own) {
      switch (e.spec.init) {
        case InitKind::normal:
          v = static_cast<float>(e.spec.init_std *
                                 rng::normal(seed, key, static_cast<uint64_t>(k)));
          break;
        case InitKind::zeros: v = 0.f; break;
        case InitKind::ones: v = 1.f; break;
      }
    }
    out[j - lo] = v;
  }
}

// A full buffer is needed when the unit is sharded, computes in another dtype than fp32, or
// its shard is in host memory (offload).
bool FsdpEngine::needs_full(const Unit& u) const {
  return u.layout.num_shards > 1 || mp_.param_dtype != DType::f32 || offloaded();
}

bool FsdpEngine::reshard_after_forward(int unit) const {
  if (!training_) return true;   // evaluation: nothing is kept for a backward
  if (unit == 0) return false;   // the root stays unsharded until the end of backward
  return traits_.reshard_after_forward;
}

// Units besides the root whose full parameters are held and will be freed in this pass
// (ZeRO-2 keeps every unit from forward to backward: PyTorch's limit does not apply there).
int FsdpEngine::unsharded_blocks() const {
  return training_ && !traits_.reshard_after_forward ? 0 : unsharded_blocks_;
}

// Casts this rank's fp32 shard to param_dtype into its slot of the full buffer, then
// all-gathers in place (fp32: straight from the shard).
void FsdpEngine::issue_unshard(int unit) {
  Unit& u = *units_[unit];
  if (u.sharded == ShardedState::UNSHARDED || !needs_full(u)) return;
  HostUpload upload;
  if (offloaded()) {
    if (!params_cast_) {
      throw Error("FSDP: unit " + std::to_string(unit) + " (" + u.layout.unit_name +
                  ") unsharded before params_updated(): with fsdp.cpu_offload the engine must "
                  "be told when this rank's shards were written (initialisation, a checkpoint "
                  "load, model.init_from, the optimizer step)");
    }
    upload.src = u.host_param ? u.host_param.data() : u.shard_param.data();
    upload.stream = copy_stream_.get();
  }
  AllGatherResult r = foreach_all_gather(be_, *shard_comm_, u.layout, u.shard_param,
                                         mp_.param_dtype, be_.compute_stream(), trace(unit),
                                         offloaded() ? &upload : nullptr);
  u.full_param = std::move(r.full_param);
  u.gather = std::move(r.work);
  u.ready = std::move(r.ready);
  u.sharded = ShardedState::UNSHARDED;
  if (unit != 0) ++unsharded_blocks_;
}

// The compute stream waits for the unit's all-gather (and, offloaded, its upload).
void FsdpEngine::complete_unshard(int unit) {
  Unit& u = *units_[unit];
  if (u.gather) {
    StepTimer::Scope waiting(timer_, Phase::comm_wait);
    ProfileRange range(profiler_, "collective");
    if (range) {
      describe(range, "all_gather", "wait", unit, *shard_comm_, u.layout.shard_numel,
               mp_.param_dtype);
    }
    u.gather->wait();
    u.gather.reset();
  }
  if (u.ready) {
    be_.compute_stream().wait(*u.ready);
    u.ready.reset();
  }
}

void FsdpEngine::wait_unshard(int unit) {
  issue_unshard(unit);
  complete_unshard(unit);
}

void FsdpEngine::reshard(int unit) {
  Unit& u = *units_[unit];
  complete_unshard(unit);  // prefetched, never used (a pass cut short): freed after its fill
  u.full_param.reset();
  if (u.sharded == ShardedState::UNSHARDED && unit != 0) --unsharded_blocks_;
  u.sharded = ShardedState::SHARDED;
}

// Prefetch of `unit` for the pass in progress (backward: its backward has not run yet),
// unless limit_all_gathers already has two units besides the root unsharded.
void FsdpEngine::prefetch(int unit, bool backward) {
  if (unit < 0 || units_[unit]->sharded == ShardedState::UNSHARDED) return;
  const Unit& u = *units_[unit];
  const int done = backward ? u.bwd_done : u.fwd_done;
  if (done > 0) return;
  if (config_.limit_all_gathers && unsharded_blocks() >= 2) return;
  issue_unshard(unit);
}

void FsdpEngine::begin_step(bool training) {
  for (int i = 0; i < num_units(); ++i) {
    if (units_[i]->training != TrainingState::IDLE) {
      throw Error("FSDP: begin_step while unit " + std::to_string(i) + " (" +
                  units_[i]->layout.unit_name + ") is " + to_string(units_[i]->training) +
                  ": the previous pass was not ended with end_step");
    }
  }
  training_ = training;
  for (auto& u : units_) {
    u->fwd_done = 0;
    u->bwd_done = 0;
  }
}

void FsdpEngine::pre_forward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  const bool first = u.fwd_done == 0;
  if (first) {
    transition(unit, TrainingState::IDLE, TrainingState::FORWARD, "pre_forward");
  } else if (u.training != TrainingState::FORWARD) {  // its forward already ended
    transition(unit, TrainingState::FORWARD, TrainingState::FORWARD, "pre_forward");
  }
  wait_unshard(unit);
  if (first && config_.forward_prefetch) prefetch(fwd_next_[unit], false);
}

void FsdpEngine::post_forward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  if (u.training != TrainingState::FORWARD) {
    transition(unit, TrainingState::FORWARD, TrainingState::IDLE, "post_forward");
  }
  if (++u.fwd_done == static_cast<int>(u.modules.size())) {
    u.training = TrainingState::IDLE;
    if (reshard_after_forward(unit)) reshard(unit);
  }
}

void FsdpEngine::pre_backward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  const bool first = u.training != TrainingState::PRE_BACKWARD;
  if (first) {
    if (!training_) {
      throw Error("FSDP: pre_backward of unit " + std::to_string(unit) + " (" +
                  u.layout.unit_name + ") in an evaluation pass (begin_step(false))");
    }
    if (u.training == TrainingState::IDLE && u.fwd_done != static_cast<int>(u.modules.size())) {
      throw Error("FSDP: pre_backward of unit " + std::to_string(unit) + " (" +
                  u.layout.unit_name + ") before its forward completed in this pass");
    }
    transition(unit, TrainingState::IDLE, TrainingState::PRE_BACKWARD, "pre_backward");
  }
  if (timer_ && training_) timer_->enter(Phase::backward);
  wait_unshard(unit);
  if (first) {
    if (needs_full(u)) {
      u.full_grad = DeviceBuffer(be_, mp_.param_dtype, u.layout.padded_numel,
                                 MemCategory::unsharded_grads);
      be_.fill_zero(u.full_grad.view());
    }
    if (config_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch(bwd_next_[unit], true);
  }
}

void FsdpEngine::post_backward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  if (u.training != TrainingState::PRE_BACKWARD) {
    transition(unit, TrainingState::PRE_BACKWARD, TrainingState::POST_BACKWARD, "post_backward");
  }
  if (++u.bwd_done < static_cast<int>(u.modules.size())) return;
  u.training = TrainingState::POST_BACKWARD;
  if (config_.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch(bwd_next_[unit], true);
  issue_reduction(unit);
  reshard(unit);
}

// The unit's gradient reduction (fsdp/fsdp/collectives.hpp): cast to reduce_dtype,
// reduce-scatter (avg) over the shard group into this rank's shard and, for HSDP, the replica
// all-reduce (avg) right after it on the reduction stream; end_step waits for both and
// accumulates into the fp32 shard. The full gradient is freed with the reduce-scatter's
// completion event: the allocator reuses it only after the collective has read it.
void FsdpEngine::issue_reduction(int unit) {
  Unit& u = *units_[unit];
  const bool shard_was_empty = u.grad == GradState::EMPTY;
  u.grad = GradState::ACCUMULATED;
  if (!needs_full(u)) {  // fp32, one shard: backward accumulated into shard_grad directly
    u.reduction = reduce_shard_grad(*replicate_comm_, u.layout, u.shard_grad,
                                    be_.compute_stream(), trace(unit));
    return;
  }
  // Offloaded, between gradient accumulation boundaries (and at the boundary where nothing
  // is communicated and an accumulator exists: one device-to-host copy and one host add
  // instead of two), the reduced gradient goes into the unit's fp32 accumulator on the device.
  const bool local = u.layout.num_shards == 1 && replicate_comm_->size() == 1;
  if (offloaded() && (!boundary_ || (local && u.grad_acc))) {
    const bool fresh = !u.grad_acc;
    if (fresh) {
      u.grad_acc = DeviceBuffer::floats(be_, u.layout.shard_numel, MemCategory::grads);
      be_.fill_zero(u.grad_acc.view());
    }
    u.reduction = foreach_reduce(be_, *shard_comm_, *replicate_comm_, u.layout,
                                 std::move(u.full_grad), u.grad_acc, fresh, mp_.reduce_dtype,
                                 be_.compute_stream(), *reduce_stream_, trace(unit));
    if (boundary_) stage_accumulator(unit);  // local: the sum is complete on the compute stream
    return;
  }
  if (offloaded() && u.grad_acc) stage_accumulator(unit);  // the earlier micro-batches' sum first
  u.reduction = foreach_reduce(be_, *shard_comm_, *replicate_comm_, u.layout,
                               std::move(u.full_grad), u.shard_grad, shard_was_empty,
                               mp_.reduce_dtype, be_.compute_stream(), *reduce_stream_,
                               trace(unit), offloaded() ? &sh_ : nullptr);
  if (u.reduction.staged) {
    staged_.push_back({unit, std::move(u.reduction.staged)});
    drain_staged(kStagedCopies);
  }
}

// Copies the unit's device accumulator (complete on the compute stream) to host staging on
// the reduction stream, freed behind the copy; the host adds it in drain_staged.
void FsdpEngine::stage_accumulator(int unit) {
  staged_.push_back({unit, stage_to_host(be_, sh_, units_[unit]->grad_acc, &be_.compute_stream(),
                                         *reduce_stream_)});
  drain_staged(kStagedCopies);
}

// Adds the oldest host copies of reduced gradients into their units' fp32 shards (in the
// order they were staged) until at most `keep` are pending.
void FsdpEngine::drain_staged(std::size_t keep) {
  while (staged_.size() > keep) {
    Staged& s = staged_.front();
    {
      StepTimer::Scope waiting(timer_, Phase::comm_wait);
      s.copy.copied->synchronize();
    }
    sh_.axpy(units_[s.unit]->shard_grad.view(), 1.f, s.copy.host.view());
    staged_.pop_front();
  }
}

void FsdpEngine::end_step() {
  Stream& stream = be_.compute_stream();
  // 1. Reduce-scatters done (in unit order on every rank). HSDP's all-reduces were issued
  // after them during backward.
  for (int i = 0; i < num_units(); ++i) {
    ReduceResult& r = units_[i]->reduction;
    if (!r.reduce_scatter) continue;
    {
      StepTimer::Scope waiting(timer_, Phase::comm_wait);
      ProfileRange range(profiler_, "collective");
      if (range && !r.all_reduce_on_reduce_stream) {  // else already ranged at the hand-off
        describe(range, "reduce_scatter", "wait", i, *shard_comm_, units_[i]->layout.shard_numel,
                 mp_.reduce_dtype);
      }
      r.reduce_scatter->wait();
    }
    r.reduce_scatter.reset();
  }
  // 2. All-reduces done -> accumulate into the fp32 gradient shards.
  for (int i = 0; i < num_units(); ++i) {
    Unit& u = *units_[i];
    ReduceResult& r = u.reduction;
    if (r.all_reduce) {
      StepTimer::Scope waiting(timer_, Phase::comm_wait);
      ProfileRange range(profiler_, "collective");
      if (range) {
        describe(range, "all_reduce", "wait", i, *replicate_comm_, u.layout.shard_numel,
                 r.reduced ? r.reduced.dtype() : DType::f32);
      }
      r.all_reduce->wait();
      // Issued after the reduction stream: the compute stream waits for its completion.
      if (r.all_reduce_on_reduce_stream) stream.wait(*r.all_reduce->done());
      r.all_reduce.reset();
    }
    if (r.reduced) {  // shard_grad is 0 where it held nothing: the sum is then exact
      be_.axpy((u.grad_acc ? u.grad_acc : u.shard_grad).view(), 1.f, r.reduced.view());
      r.reduced.reset();
    }
    r.all_reduce_on_reduce_stream = false;
  }
  // Offload: the reduced gradients copied to the host during backward, added there (the
  // same axpy, the same order).
  drain_staged(0);
  if (offloaded()) copy_stream_->synchronize();  // no upload reads the host shards after this
  for (int i = 0; i < num_units(); ++i) reshard(i);
  for (auto& u : units_) {
    u->full_grad.reset();  // a backward cut short (not in the contract)
    u->training = TrainingState::IDLE;
  }
  training_ = false;
}

void FsdpEngine::zero_grad() {
  for (auto& u : units_) {
    sh_.fill_zero(u->shard_grad.view());
    u->grad_acc.reset();  // a step that never reached its boundary
    u->grad = GradState::EMPTY;
  }
}

// The shard arithmetic below runs on the shards' runtime; with offload its device scalars
// are host copies of the backend's (copied in before, out after).
void FsdpEngine::unscale_grads(float inv_scale, const TensorView& found_inf) {
  const TensorView flag = offloaded() ? host_flag_.view() : found_inf;
  if (offloaded()) be_.copy_to_host(host_flag_.data(), found_inf);
  for (auto& u : units_) sh_.unscale_and_check(u->shard_grad.view(), inv_scale, flag);
  if (offloaded()) be_.copy_from_host(found_inf, host_flag_.data());
}

void FsdpEngine::clip_grad_norm(double max_norm, const TensorView& norm) {
  const int S = shard_comm_->size();
  const TensorView local = norm_parts_.view().slice(0, 1);
  const TensorView parts = norm_parts_.view().slice(1, S);
  const TensorView acc = offloaded() ? host_norm_.view() : local;
  sh_.fill_zero(acc);
  for (auto& u : units_) sh_.squared_norm(acc, u->shard_grad.view());
  if (offloaded()) be_.copy_from_host(local, host_norm_.data());  // the slot the gather sends
  // Every shard's partial sum, added in shard order, so the norm is bitwise identical on
  // every rank (an all-reduce need not be).
  {
    std::unique_ptr<Work> gather;
    {
      ProfileRange range(profiler_, "collective");
      if (range) describe(range, "all_gather", "issue", -1, *shard_comm_, 1, DType::f64);
      gather = shard_comm_->all_gather(local.data, parts.data, 1, DType::f64, be_.compute_stream());
    }
    StepTimer::Scope waiting(timer_, Phase::comm_wait);
    ProfileRange range(profiler_, "collective");
    if (range) describe(range, "all_gather", "wait", -1, *shard_comm_, 1, DType::f64);
    gather->wait();
  }
  be_.clip_coefficient(norm, clip_coef_.view(), parts, max_norm);
  if (max_norm > 0) {
    const TensorView coef = offloaded() ? host_coef_.view() : clip_coef_.view();
    if (offloaded()) be_.copy_to_host(host_coef_.data(), clip_coef_.view());
    for (auto& u : units_) sh_.scale_by(u->shard_grad.view(), coef);
  }
}

void FsdpEngine::describe(ProfileRange& range, const char* op, const char* stage, int unit,
                          const Communicator& comm, int64_t numel, DType dtype) const {
  const std::string name = unit < 0 ? "grad_norm" : units_[unit]->layout.unit_name;
  const std::string o(op);
  const int64_t bytes = numel * static_cast<int64_t>(dtype_size(dtype));
  const int64_t group = comm.size();
  const std::string target = unit < 0 ? name : "unit " + std::to_string(unit) + " (" + name + ")";
  range.name(o + " " + stage + " " + target)
      .arg("unit", unit)
      .arg("unit_name", name)
      .arg("in_bytes", o == "reduce_scatter" ? bytes * group : bytes)
      .arg("out_bytes", o == "all_gather" ? bytes * group : bytes)
      .arg("dtype", std::string(to_string(dtype)))
      .arg("ranks", group);
}

void FsdpEngine::inject_nonfinite_grad() {
  const float inf = std::numeric_limits<float>::infinity();
  Unit& u = *units_[0];
  sh_.copy_from_host(u.shard_grad.view().slice(0, 1), &inf);
  u.grad = GradState::ACCUMULATED;
}

TensorView FsdpEngine::param(int p) {
  const ParamLoc& loc = param_loc_[p];
  Unit& u = *units_[loc.unit];
  if (!needs_full(u)) return u.shard_param.view().slice(loc.offset, loc.shape.numel()).reshape(loc.shape);
  if (u.sharded != ShardedState::UNSHARDED) {
    throw Error("FSDP: parameter read while its unit is sharded");
  }
  return u.full_param.view().slice(loc.offset, loc.shape.numel()).reshape(loc.shape);
}

TensorView FsdpEngine::grad(int p) {
  const ParamLoc& loc = param_loc_[p];
  Unit& u = *units_[loc.unit];
  if (u.training != TrainingState::PRE_BACKWARD) {
    throw Error("FSDP: gradient requested outside the unit's backward (unit " +
                std::to_string(loc.unit) + " (" + u.layout.unit_name + ") is " +
                to_string(u.training) + ")");
  }
  const DeviceBuffer& buf = needs_full(u) ? u.full_grad : u.shard_grad;
  return buf.view().slice(loc.offset, loc.shape.numel()).reshape(loc.shape);
}

std::map<std::string, std::vector<float>> FsdpEngine::gather_full_params() {
  std::map<std::string, std::vector<float>> out;
  for (auto& up : units_) {
    Unit& u = *up;
    DeviceBuffer full = DeviceBuffer::floats(be_, u.layout.padded_numel, MemCategory::other);
    DeviceBuffer staged;  // offload: the host shard on the device, for the communicator
    if (offloaded()) {
      staged = DeviceBuffer::floats(be_, u.layout.shard_numel, MemCategory::other);
      be_.copy_from_host(staged.view(), u.shard_param.data());
    }
    shard_comm_->all_gather(offloaded() ? staged.data() : u.shard_param.data(), full.data(),
                            static_cast<std::size_t>(u.layout.shard_numel), DType::f32,
                            be_.compute_stream())->wait();
    std::vector<float> host(static_cast<std::size_t>(u.layout.padded_numel));
    be_.copy_to_host(host.data(), full.view());
    for (const auto& e : u.layout.entries) {
      out[e.spec.name].assign(host.begin() + e.offset, host.begin() + e.offset + e.spec.numel());
    }
  }
  return out;
}

}  // namespace fsdp
