// The FSDP engine: unit construction, shard initialisation and the unshard / reshard /
// reduce schedule (see fsdp/fsdp/engine.hpp).
#include "fsdp/fsdp/engine.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp {

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

FsdpEngine::FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
                       const MixedPrecisionConfig& mixed_precision, const DeviceMesh& mesh,
                       DeviceRuntime& backend, uint64_t seed, DeviceRuntime* offload,
                       bool init_params)
    : FsdpEngine(modules, config, mixed_precision,
                 shard_group_of(config.sharding_strategy, mesh),
                 replicate_group_of(config.sharding_strategy, mesh), backend, seed, true,
                 offload, init_params) {}

namespace {
DeviceRuntime& shard_runtime_of(const FsdpConfig& config, DeviceRuntime& backend,
                                DeviceRuntime* offload) {
  if (!config.offloaded()) return backend;
  if (offload == nullptr) {
    throw Error("FSDP: fsdp.cpu_offload / fsdp.offload_optimizer needs an offload runtime");
  }
  return *offload;
}
}  // namespace

FsdpEngine::FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
                       const MixedPrecisionConfig& mixed_precision, Communicator& shard,
                       Communicator& replicate, DeviceRuntime& backend, uint64_t seed,
                       bool initialise, DeviceRuntime* offload, bool init_params)
    : config_(config), traits_(strategy_traits(config.sharding_strategy)) {
  ctx_.be = &backend;
  ctx_.sh = &shard_runtime_of(config, backend, offload);
  ctx_.mp = mixed_precision;
  ctx_.resident = config.params_resident();
  ctx_.device_norms = ctx_.offloaded() && !mixed_precision.uses_fp16();
  if (config.delayed_parameter_update && (!ctx_.resident || !ctx_.offloaded())) {
    throw Error("FSDP: fsdp.delayed_parameter_update needs fsdp.offload_optimizer (and an "
                "offload runtime): the delayed update keeps the device shards from before it");
  }
  // offloaded_fraction() is below 1 only with offload_optimizer alone (the key is ignored
  // otherwise), so the delayed update is the one conflict left.
  if (ctx_.offloaded() && config.offloaded_fraction() < 1 && config.delayed_parameter_update) {
    throw Error("FSDP: fsdp.offload_optimizer_ratio < 1 is not supported with "
                "fsdp.delayed_parameter_update");
  }
  ctx_.shard = &shard;
  ctx_.replicate = &replicate;
  build(modules, seed, initialise, init_params);
}

void FsdpEngine::build(const std::vector<ModuleDecl>& modules, uint64_t seed, bool initialise,
                       bool init_params) {
  reduce_stream_ = ctx_.be->create_stream();
  if (offloaded()) copy_stream_ = ctx_.be->create_stream();
  ctx_.reduce_stream = reduce_stream_.get();
  ctx_.copy_stream = copy_stream_.get();
  device_ctx_ = ctx_;  // fsdp.offload_optimizer_ratio's units on the device: not offloaded
  device_ctx_.sh = ctx_.be;
  device_ctx_.resident = false;
  device_ctx_.device_norms = false;
  module_unit_ = wrap_modules(modules, config_);
  std::vector<FlatParamLayout> layouts = build_unit_layouts(modules, config_, ctx_.shard->size());
  plan_prefetch(layouts.size());  // fwd_order_, which units_on_device reads
  const std::vector<char> on_device = units_on_device(layouts);
  for (auto& layout : layouts) {
    const bool device = on_device[units_.size()] != 0;
    units_.push_back(std::make_unique<FsdpParamGroup>(num_units(), std::move(layout),
                                                      device ? device_ctx_ : ctx_, initialise));
    if (initialise && init_params) units_.back()->init_shard(seed);
  }
  // Parameter ids run over modules in order; within a unit, entries follow the same order.
  std::vector<int> next_entry(units_.size(), 0);
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const int u = module_unit_[m];
    unit(u).add_module(static_cast<int>(m));
    for (std::size_t i = 0; i < modules[m].params.size(); ++i) {
      const FlatEntry& e = unit(u).layout().entries[next_entry[u]++];
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
  landing_.assign(units_.size(), nullptr);
  if (initialise && init_params) refresh_all();
}

// fsdp.offload_optimizer_ratio: the units in forward order (fwd_order_) while their
// parameters fit in the part of the model not offloaded, 1 - ratio of its parameters (so at
// least one unit stays offloaded for any ratio > 0). None without offload or at 1.
std::vector<char> FsdpEngine::units_on_device(
    const std::vector<FlatParamLayout>& layouts) const {
  std::vector<char> device(layouts.size(), 0);
  const double fraction = config_.offloaded_fraction();
  if (!ctx_.offloaded() || fraction >= 1) return device;
  int64_t total = 0;
  for (const auto& l : layouts) total += l.numel;
  const double keep = (1.0 - fraction) * static_cast<double>(total);
  int64_t kept = 0;
  for (const int u : fwd_order_) {
    if (static_cast<double>(kept + layouts[u].numel) > keep) break;
    kept += layouts[u].numel;
    device[u] = 1;
  }
  return device;
}

// Prefetch targets (PyTorch FSDP's execution order): forward prefetches the unit whose
// forward starts next (units ordered by their first module); backward prefetches the unit
// whose forward ended just before this one's (ordered by last module: the root, holding
// ln_f, ends last, so its backward prefetches the last block).
void FsdpEngine::plan_prefetch(std::size_t n_units) {
  std::vector<int> first(n_units, -1), last(n_units, -1);
  for (std::size_t m = 0; m < module_unit_.size(); ++m) {
    const int u = module_unit_[m];
    if (first[u] < 0) first[u] = static_cast<int>(m);
    last[u] = static_cast<int>(m);
  }
  std::vector<int> by_first(n_units), by_last(n_units);
  std::iota(by_first.begin(), by_first.end(), 0);
  std::iota(by_last.begin(), by_last.end(), 0);
  std::sort(by_first.begin(), by_first.end(), [&](int a, int b) { return first[a] < first[b]; });
  std::sort(by_last.begin(), by_last.end(), [&](int a, int b) { return last[a] < last[b]; });
  fwd_next_.assign(n_units, -1);
  bwd_next_.assign(n_units, -1);
  for (std::size_t i = 0; i + 1 < n_units; ++i) fwd_next_[by_first[i]] = by_first[i + 1];
  fwd_order_ = by_first;
  for (std::size_t i = 1; i < n_units; ++i) bwd_next_[by_last[i]] = by_last[i - 1];
}

// The caller made sure no upload still reads a host copy (or an fp32 shard).
void FsdpEngine::refresh_all() {
  for (auto& u : units_) u->refresh_copies();
  shards_written_ = true;
}

void FsdpEngine::write_shards(const std::function<void()>& write) {
  wait_shard_writes();
  delayed_pending_ = false;  // refresh_all uploads every unit
  if (copy_stream_) copy_stream_->synchronize();
  write();
  refresh_all();
}

struct FsdpEngine::ShardWriter {
  std::thread thread;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<char> written;  // per unit, under mutex
  std::exception_ptr error;   // what a write threw (the units after it are never written)
};

void FsdpEngine::update_shards(const ShardWrite& write, bool delay) {
  complete_update();  // a delayed update no boundary completed (not the trainer's order)
  wait_shard_writes();
  if (copy_stream_) copy_stream_->synchronize();  // no upload still reads a host copy
  shards_written_ = true;
  // Units not offloaded (all of them without offload): the update on the device, from this
  // thread, before the host's.
  std::vector<int> order;
  for (const int u : fwd_order_) {
    if (offloaded(u)) {
      order.push_back(u);
      continue;
    }
    write(u, {});
    unit(u).refresh_copies();
    unit(u).zero_grad();
  }
  if (order.empty()) {
    landing_order_.clear();
    return;
  }
  // Gradients still landing (end_step did not wait for them): the units in the order their
  // copies were issued, each as soon as its copy has landed, the others after them (delayed:
  // the boundary backward's order below, which that is too).
  const bool delayed = config_.delayed_parameter_update && delay;
  if (!landing_order_.empty() && !delayed) {
    std::vector<int> landed;
    for (const int u : landing_order_) {
      if (offloaded(u) && std::find(landed.begin(), landed.end(), u) == landed.end()) {
        landed.push_back(u);
      }
    }
    for (const int u : order) {
      if (std::find(landed.begin(), landed.end(), u) == landed.end()) landed.push_back(u);
    }
    order = std::move(landed);
  }
  writer_ = std::make_unique<ShardWriter>();
  writer_->written.assign(units_.size(), 0);
  for (int u = 0; u < num_units(); ++u) {
    writer_->written[static_cast<std::size_t>(u)] = !offloaded(u);  // written above
  }
  ShardWriter* w = writer_.get();
  // Delayed: in the order the boundary's backward waits for them.
  landing_order_.clear();
  delayed_pending_ = delayed;
  if (delayed_pending_) std::reverse(order.begin(), order.end());
  // The host work only (the optimizer on the shards' runtime writing the host copy in its
  // pass, discarding the gradient shard); the resident upload is the main thread's, at the
  // unit's unshard (delayed: at its post_backward in the boundary's backward, or
  // complete_update).
  w->thread = std::thread([this, w, write, order] {
    for (const int u : order) {
      try {
        wait_landed(u);  // its gradient copy (main thread: untouched until u is written)
        write(u, unit(u).host_copy());  // fills the copy, if the unit has one
        unit(u).host_copy_written();
        unit(u).discard_grad_shard();  // the next reduction's first copy overwrites it
      } catch (...) {
        const std::lock_guard<std::mutex> lock(w->mutex);
        w->error = std::current_exception();
        w->changed.notify_all();
        return;
      }
      const std::lock_guard<std::mutex> lock(w->mutex);
      w->written[static_cast<std::size_t>(u)] = 1;
      w->changed.notify_all();
    }
  });
}

void FsdpEngine::complete_update() {
  if (!delayed_pending_) return;
  wait_shard_writes();
  for (auto& u : units_) u->upload_resident();  // those the boundary's backward did not
  delayed_pending_ = false;
}

void FsdpEngine::wait_written(int u) {
  if (!writer_) return;
  bool failed = false;
  {
    StepTimer::Scope waiting(ctx_.timer, Phase::optimizer);
    std::unique_lock<std::mutex> lock(writer_->mutex);
    writer_->changed.wait(lock, [&] {
      return writer_->written[static_cast<std::size_t>(u)] != 0 || writer_->error != nullptr;
    });
    failed = writer_->error != nullptr;
  }
  if (failed) wait_shard_writes();  // joins and rethrows
}

void FsdpEngine::wait_shard_writes() {
  if (!writer_) return;
  writer_->thread.join();
  const std::exception_ptr error = writer_->error;
  writer_.reset();
  if (error) std::rethrow_exception(error);
}

void FsdpEngine::set_gradient_accumulation_boundary(bool boundary) { boundary_ = boundary; }

// Pending Work completes in its destructor. Copies to or from host memory (offload) may
// still be in flight when a step is cut short: they finish before that memory is freed.
FsdpEngine::~FsdpEngine() {
  try {
    wait_shard_writes();
  } catch (...) {  // the write's error: the run is already ending
  }
  for (Stream* s : {reduce_stream_.get(), copy_stream_.get()}) {
    if (s == nullptr) continue;
    try {
      s->synchronize();
    } catch (...) {  // a device error: nothing more to do here
    }
  }
}

TrainingState FsdpEngine::training_state(int u) const { return units_.at(u)->training_state(); }
ShardedState FsdpEngine::sharded_state(int u) const { return units_.at(u)->sharded_state(); }
GradState FsdpEngine::grad_state(int u) const { return units_.at(u)->grad_state(); }

const FlatParamLayout& FsdpEngine::layout(int u) const { return units_[u]->layout(); }
std::vector<FlatParamLayout> FsdpEngine::layouts() const {
  std::vector<FlatParamLayout> out;
  for (const auto& u : units_) out.push_back(u->layout());
  return out;
}
int64_t FsdpEngine::shard_numel(int u) const { return units_[u]->layout().shard_numel; }
TensorView FsdpEngine::shard_param(int u) {
  wait_shard_writes();
  return unit(u).shard_param().view();
}
bool FsdpEngine::grad_norm_sq_on_device(int u, double& value) {
  wait_shard_writes();
  return unit(u).grad_norm_sq(value);
}

TensorView FsdpEngine::shard_grad(int u) {
  wait_shard_writes();
  wait_landed(u);
  unit(u).settle_grad();
  return unit(u).shard_grad().view();
}

int64_t FsdpEngine::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->layout().numel;
  return n;
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

void FsdpEngine::unshard(int u) {
  FsdpParamGroup& g = unit(u);
  if (g.sharded_state() == ShardedState::UNSHARDED) return;
  if (delayed_pending_) {  // the device shard from before the update running on the host
    g.unshard(shards_written_, false);
  } else {
    wait_written(u);
    g.unshard(shards_written_);
  }
  if (g.sharded_state() == ShardedState::UNSHARDED && u != 0) ++unsharded_blocks_;
}

void FsdpEngine::wait_unshard(int u) {
  unshard(u);
  unit(u).wait_for_unshard();
}

void FsdpEngine::reshard(int u) {
  FsdpParamGroup& g = unit(u);
  if (g.sharded_state() == ShardedState::UNSHARDED && u != 0) --unsharded_blocks_;
  g.reshard();
}

// Prefetch of `unit` for the pass in progress (backward: its backward has not run yet),
// unless limit_all_gathers already has two units besides the root unsharded.
void FsdpEngine::prefetch(int unit, bool backward) {
  if (unit < 0 || units_[unit]->sharded_state() == ShardedState::UNSHARDED) return;
  const FsdpParamGroup& g = *units_[unit];
  if (backward ? g.backward_started() : g.forward_started()) return;
  if (config_.limit_all_gathers && unsharded_blocks() >= 2) return;
  unshard(unit);
}

void FsdpEngine::begin_step(bool training) {
  if (!training) complete_update();  // evaluation sees the updated parameters
  for (auto& u : units_) u->begin_pass();
  training_ = training;
}

void FsdpEngine::pre_forward(int module) {
  const int u = module_unit_[module];
  const bool first = unit(u).pre_forward();
  wait_unshard(u);
  if (first && config_.forward_prefetch) prefetch(fwd_next_[u], false);
}

void FsdpEngine::post_forward(int module) {
  const int u = module_unit_[module];
  if (unit(u).post_forward() && reshard_after_forward(u)) reshard(u);
}

void FsdpEngine::pre_backward(int module) {
  const int u = module_unit_[module];
  const bool first = unit(u).pre_backward(training_);
  if (ctx_.timer && training_) ctx_.timer->enter(Phase::backward);
  wait_unshard(u);
  if (first) {
    unit(u).provide_grad_storage();
    if (config_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch(bwd_next_[u], true);
  }
}

// The unit's gradient reduction (FsdpParamGroup::reduce; end_step completes it), then its
// reshard. Offloaded, the host copies it stages join the queue the host adds from, at most
// kStagedCopies left pending after each.
void FsdpEngine::post_backward(int module) {
  const int u = module_unit_[module];
  if (!unit(u).post_backward()) return;
  if (config_.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch(bwd_next_[u], true);
  if (delayed_pending_ && boundary_) {
    // The delayed update of this unit: done before its new gradient lands in the shard the
    // update read; its upload after this step's last use of the old device shard.
    wait_written(u);
    unit(u).upload_resident();
  }
  unit(u).reduce(boundary_, [this, u](HostStaging copy) {
    staged_.push_back({u, std::move(copy)});
    if (!staged_.back().copy.landed) ++staged_waiting_;
    drain_staged(kStagedCopies);
  });
  reshard(u);
}

// Hands the oldest host copies of reduced gradients to their units (add_staged: an add, a
// cast, or nothing for a copy that landed in the shard), in the order they were staged,
// until at most `keep` copies into staging memory are pending (copies that landed hold none:
// the host never waits for them before end_step). A unit's copies run in order on the
// reduction stream, so a completed copy implies its unit's earlier ones.
void FsdpEngine::drain_staged(std::size_t keep) {
  while (staged_waiting_ > keep || (keep == 0 && !staged_.empty())) {
    Staged& s = staged_.front();
    if (s.copy.landed) {  // nothing for the host to do: whoever reads the shard waits for it
      landing_[static_cast<std::size_t>(s.unit)] = s.copy.copied;
      landing_order_.push_back(s.unit);
    } else {
      wait_landed(s.unit);  // the add goes onto what landed first
      {
        StepTimer::Scope waiting(ctx_.timer, Phase::comm_wait);
        s.copy.copied->synchronize();
      }
      unit(s.unit).add_staged(s.copy);
      --staged_waiting_;
    }
    staged_.pop_front();
  }
}

void FsdpEngine::wait_landed(int u) {
  std::shared_ptr<Event>& landing = landing_[static_cast<std::size_t>(u)];
  if (!landing) return;
  landing->synchronize();
  landing.reset();
}

// Reduce-scatters first (in unit order on every rank; HSDP's all-reduces were issued after
// them during backward), then the all-reduces and the adds into the fp32 gradient shards,
// then (offload) the host's adds of the copies staged during backward, the same axpy in the
// same order; at the accumulation boundary a discarded gradient shard that no copy wrote (a
// unit without a backward) gets its zeros.
void FsdpEngine::end_step() {
  for (auto& u : units_) u->wait_reduce_scatter();
  for (auto& u : units_) u->finish_reduction();
  drain_staged(0);
  if (training_ && boundary_) {
    complete_update();  // units without a backward this step are written and uploaded now
    for (auto& u : units_) u->settle_grad();
  }
  if (offloaded()) copy_stream_->synchronize();  // no upload reads the host shards after this
  for (int i = 0; i < num_units(); ++i) reshard(i);
  for (auto& u : units_) u->end_pass();
  training_ = false;
}

void FsdpEngine::zero_grad() {
  wait_shard_writes();
  for (int u = 0; u < num_units(); ++u) {
    wait_landed(u);  // a copy still landing would overwrite the zeros
    unit(u).zero_grad();
  }
  landing_order_.clear();
}

void FsdpEngine::inject_nonfinite_grad() {
  wait_shard_writes();
  wait_landed(0);
  unit(0).inject_nonfinite_grad();
}

TensorView FsdpEngine::param(int p) {
  if (!shards_written_) {
    throw Error("FSDP: a parameter read before this rank's shards were written (an engine "
                "built with init_params = false fills them through write_shards first)");
  }
  const ParamLoc& loc = param_loc_[p];
  return unit(loc.unit).param(loc.offset, loc.shape);
}

TensorView FsdpEngine::grad(int p) {
  const ParamLoc& loc = param_loc_[p];
  return unit(loc.unit).grad(loc.offset, loc.shape);
}

std::map<std::string, std::vector<float>> FsdpEngine::gather_full_params() {
  wait_shard_writes();
  DeviceRuntime& be = backend();
  std::map<std::string, std::vector<float>> out;
  for (auto& up : units_) {
    FsdpParamGroup& u = *up;
    const FlatParamLayout& L = u.layout();
    DeviceBuffer full = DeviceBuffer::floats(be, L.padded_numel, MemCategory::other);
    DeviceBuffer staged;  // offload: the host shard on the device, for the communicator
    const bool on_host = u.context().offloaded();
    if (on_host) {
      staged = DeviceBuffer::floats(be, L.shard_numel, MemCategory::other);
      be.copy_from_host(staged.view(), u.shard_param().data());
    }
    ctx_.shard->all_gather(on_host ? staged.data() : u.shard_param().data(), full.data(),
                           static_cast<std::size_t>(L.shard_numel), DType::f32,
                           be.compute_stream())->wait();
    std::vector<float> host(static_cast<std::size_t>(L.padded_numel));
    be.copy_to_host(host.data(), full.view());
    for (const auto& e : L.entries) {
      out[e.spec.name].assign(host.begin() + e.offset, host.begin() + e.offset + e.spec.numel());
    }
  }
  return out;
}

}  // namespace fsdp
