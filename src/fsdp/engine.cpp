// The FSDP engine: unit construction, shard initialisation and the unshard / reshard /
// reduce schedule (see fsdp/fsdp/engine.hpp).
#include "fsdp/fsdp/engine.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "fsdp/core/error.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp {

struct FsdpEngine::Unit {
  FlatParamLayout layout;
  std::vector<int> modules;      // modules in this unit
  DeviceBuffer shard_param;      // [shard_numel], MemCategory::sharded_params
  DeviceBuffer shard_grad;       // [shard_numel], MemCategory::grads
  DeviceBuffer full_param;       // [padded_numel] while unsharded (num_shards > 1)
  DeviceBuffer full_grad;        // [padded_numel] during backward (num_shards > 1)
  std::unique_ptr<Work> gather;  // pending all-gather into full_param
  bool unsharded = false;        // full_param is (being) filled
  bool grad_ready = false;       // gradient storage provided this step
  int fwd_done = 0;              // modules of this unit done in forward this step
  int bwd_done = 0;              // modules of this unit done in backward this step
  float* params() { return full_param ? full_param.f32() : shard_param.f32(); }
  float* grads() { return full_grad ? full_grad.f32() : shard_grad.f32(); }
};

int64_t shards_for(ShardingStrategy strategy, int world_size, int shard_group_size) {
  switch (strategy) {
    case ShardingStrategy::FULL_SHARD:
    case ShardingStrategy::SHARD_GRAD_OP: return world_size;
    case ShardingStrategy::NO_SHARD: return 1;
    case ShardingStrategy::HYBRID_SHARD:
    case ShardingStrategy::HYBRID_SHARD_ZERO2: return shard_group_size;
  }
  return 1;
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
  if (fsdp.auto_wrap_policy == "NO_WRAP") return unit_of;
  int next = 1;
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const auto& cls = fsdp.transformer_layer_cls_to_wrap;
    if (std::find(cls.begin(), cls.end(), modules[m].cls) != cls.end()) unit_of[m] = next++;
  }
  return unit_of;
}

FsdpEngine::FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
                       const DeviceMesh& mesh, Backend& backend, uint64_t seed)
    : be_(backend),
      strategy_(config.sharding_strategy),
      backward_prefetch_(config.backward_prefetch),
      world_size_(mesh.world_size()) {
  switch (strategy_) {
    case ShardingStrategy::FULL_SHARD:
    case ShardingStrategy::SHARD_GRAD_OP:
      shard_comm_ = &mesh.world();
      replicate_comm_ = &mesh.self();
      break;
    case ShardingStrategy::NO_SHARD:
      shard_comm_ = &mesh.self();
      replicate_comm_ = &mesh.world();
      break;
    case ShardingStrategy::HYBRID_SHARD:
    case ShardingStrategy::HYBRID_SHARD_ZERO2:
      shard_comm_ = &mesh.shard_group();
      replicate_comm_ = &mesh.replicate_group();
      break;
  }
  module_unit_ = wrap_modules(modules, config);
  std::vector<FlatParamLayout> layouts =
      build_unit_layouts(modules, config, shard_comm_->size());
  for (auto& layout : layouts) {
    auto unit = std::make_unique<Unit>();
    unit->layout = std::move(layout);
    const auto n = static_cast<std::size_t>(unit->layout.shard_numel);
    unit->shard_param = DeviceBuffer::floats(be_, n, MemCategory::sharded_params);
    unit->shard_grad = DeviceBuffer::floats(be_, n, MemCategory::grads);
    be_.fill_zero(unit->shard_grad.data(), n * sizeof(float));
    units_.push_back(std::move(unit));
    init_shard(num_units() - 1, seed);
  }
  // Parameter ids run over modules in order; within a unit, entries follow the same order.
  std::vector<int> next_entry(units_.size(), 0);
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const int u = module_unit_[m];
    units_[u]->modules.push_back(static_cast<int>(m));
    for (std::size_t i = 0; i < modules[m].params.size(); ++i) {
      param_loc_.push_back({u, units_[u]->layout.entries[next_entry[u]++].offset});
    }
  }
}

FsdpEngine::~FsdpEngine() {
  for (auto& u : units_)
    if (u->gather) u->gather.reset();  // MpiWork's destructor completes the request
}

const FlatParamLayout& FsdpEngine::layout(int unit) const { return units_[unit]->layout; }
int64_t FsdpEngine::shard_numel(int unit) const { return units_[unit]->layout.shard_numel; }
float* FsdpEngine::shard_param(int unit) { return units_[unit]->shard_param.f32(); }
float* FsdpEngine::shard_grad(int unit) { return units_[unit]->shard_grad.f32(); }

int64_t FsdpEngine::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->layout.numel;
  return n;
}

// Rank s generates only flat elements [s*shard_numel, (s+1)*shard_numel): element k of a
// parameter is init(seed, key(name), k), whatever the world size.
void FsdpEngine::init_shard(int unit, uint64_t seed) {
  Unit& u = *units_[unit];
  const auto& L = u.layout;
  const int64_t begin = L.shard_begin(shard_comm_->rank()), end = L.shard_end(shard_comm_->rank());
  std::vector<float> host(static_cast<std::size_t>(L.shard_numel), 0.f);
  for (const auto& e : L.entries) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.spec.numel());
    if (lo >= hi) continue;
    const uint64_t key = rng::key_of(e.spec.name);
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t k = j - e.offset;
      float v = 0.f;
      switch (e.spec.init) {
        case InitKind::normal:
          v = static_cast<float>(e.spec.init_std * rng::normal(seed, key, static_cast<uint64_t>(k)));
          break;
        case InitKind::zeros: v = 0.f; break;
        case InitKind::ones: v = 1.f; break;
      }
      host[static_cast<std::size_t>(j - begin)] = v;
    }
  }
  be_.copy_from_host(u.shard_param.data(), host.data(), host.size() * sizeof(float));
}

bool FsdpEngine::reshard_after_forward(int unit) const {
  if (!training_) return true;   // evaluation: nothing is kept for a backward
  if (unit == 0) return false;   // the root stays unsharded until the end of backward
  return strategy_ == ShardingStrategy::FULL_SHARD || strategy_ == ShardingStrategy::HYBRID_SHARD;
}

void FsdpEngine::issue_unshard(int unit) {
  Unit& u = *units_[unit];
  if (u.unsharded || shard_comm_->size() == 1) return;
  u.full_param = DeviceBuffer::floats(be_, static_cast<std::size_t>(u.layout.padded_numel),
                                      MemCategory::unsharded_params);
  u.gather = shard_comm_->all_gather(u.shard_param.data(), u.full_param.data(),
                                     static_cast<std::size_t>(u.layout.shard_numel), DType::f32);
  u.unsharded = true;
}

void FsdpEngine::wait_unshard(int unit) {
  issue_unshard(unit);
  Unit& u = *units_[unit];
  if (u.gather) {
    u.gather->wait();
    u.gather.reset();
  }
}

void FsdpEngine::reshard(int unit) {
  Unit& u = *units_[unit];
  if (u.gather) {
    u.gather->wait();
    u.gather.reset();
  }
  u.full_param.reset();
  u.unsharded = false;
}

// Forward prefetch: issue the next unit's all-gather before computing this one. With
// limit_all_gathers at most two units (this and the next) are unsharded besides the root.
void FsdpEngine::prefetch_forward(int unit) {
  const int next = unit + 1;
  if (next >= num_units() || unit == 0) return;
  issue_unshard(next);
}

void FsdpEngine::prefetch_backward(int unit) {
  const int prev = unit - 1;
  if (prev >= 1) issue_unshard(prev);
}

void FsdpEngine::begin_step(bool training) {
  training_ = training;
  for (auto& u : units_) {
    u->fwd_done = 0;
    u->bwd_done = 0;
    u->grad_ready = false;
  }
}

void FsdpEngine::pre_forward(int module) {
  const int unit = module_unit_[module];
  wait_unshard(unit);
  prefetch_forward(unit);
}

void FsdpEngine::post_forward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  if (++u.fwd_done == static_cast<int>(u.modules.size()) && reshard_after_forward(unit)) {
    reshard(unit);
  }
}

void FsdpEngine::pre_backward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  wait_unshard(unit);
  if (!u.grad_ready) {
    if (shard_comm_->size() > 1) {
      u.full_grad = DeviceBuffer::floats(be_, static_cast<std::size_t>(u.layout.padded_numel),
                                         MemCategory::grads);
    }
    be_.fill_zero(u.grads(), static_cast<std::size_t>(u.layout.padded_numel) * sizeof(float));
    u.grad_ready = true;
  }
  if (backward_prefetch_ == "BACKWARD_PRE") prefetch_backward(unit);
}

void FsdpEngine::post_backward(int module) {
  const int unit = module_unit_[module];
  Unit& u = *units_[unit];
  if (++u.bwd_done < static_cast<int>(u.modules.size())) return;
  if (backward_prefetch_ == "BACKWARD_POST") prefetch_backward(unit);
  reduce_grads(unit);
  reshard(unit);
}

// Gradient of the unit: reduce-scatter (sum) over the shard group into this rank's shard,
// all-reduce (sum) over the replicate group, then divide by the data-parallel world size.
void FsdpEngine::reduce_grads(int unit) {
  Unit& u = *units_[unit];
  const auto n = static_cast<std::size_t>(u.layout.shard_numel);
  if (u.full_grad) {
    shard_comm_->reduce_scatter(u.full_grad.data(), u.shard_grad.data(), n, DType::f32,
                                ReduceOp::sum)->wait();
    u.full_grad.reset();
  }
  replicate_comm_->all_reduce(u.shard_grad.data(), u.shard_grad.data(), n, DType::f32,
                              ReduceOp::sum)->wait();
  if (world_size_ > 1) be_.scale(u.shard_grad.f32(), 1.f / static_cast<float>(world_size_), static_cast<int64_t>(n));
}

void FsdpEngine::end_step() {
  for (int i = 0; i < num_units(); ++i) reshard(i);
  training_ = false;
}

double FsdpEngine::grad_norm() {
  double local = 0.0;
  for (auto& u : units_) local += be_.squared_norm(u->shard_grad.f32(), u->layout.shard_numel);
  // Gather every shard's partial sum and add them in shard order, so the norm is bitwise
  // identical on every rank (an all-reduce need not be).
  std::vector<double> parts(static_cast<std::size_t>(shard_comm_->size()));
  shard_comm_->all_gather(&local, parts.data(), sizeof(double), DType::u8)->wait();
  double total = 0.0;
  for (double p : parts) total += p;
  return std::sqrt(total);
}

void FsdpEngine::scale_grads(float factor) {
  for (auto& u : units_) be_.scale(u->shard_grad.f32(), factor, u->layout.shard_numel);
}

float* FsdpEngine::param(int p) {
  auto [unit, offset] = param_loc_[p];
  Unit& u = *units_[unit];
  if (!u.unsharded && shard_comm_->size() > 1) throw Error("FSDP: parameter read while its unit is sharded");
  return u.params() + offset;
}

float* FsdpEngine::grad(int p) {
  auto [unit, offset] = param_loc_[p];
  Unit& u = *units_[unit];
  if (!u.grad_ready) throw Error("FSDP: gradient requested outside the unit's backward");
  return u.grads() + offset;
}

std::map<std::string, std::vector<float>> FsdpEngine::gather_full_params() {
  std::map<std::string, std::vector<float>> out;
  for (auto& up : units_) {
    Unit& u = *up;
    std::vector<float> shard(static_cast<std::size_t>(u.layout.shard_numel));
    be_.copy_to_host(shard.data(), u.shard_param.data(), shard.size() * sizeof(float));
    std::vector<float> full(static_cast<std::size_t>(u.layout.padded_numel));
    shard_comm_->all_gather(shard.data(), full.data(), shard.size(), DType::f32)->wait();
    for (const auto& e : u.layout.entries) {
      out[e.spec.name].assign(full.begin() + e.offset, full.begin() + e.offset + e.spec.numel());
    }
  }
  return out;
}

EngineMemoryPlan plan_memory(const std::vector<FlatParamLayout>& layouts,
                             ShardingStrategy strategy, const std::string& optimizer) {
  EngineMemoryPlan plan;
  int64_t shard_sum = 0, max_block = 0, all_padded = 0;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    shard_sum += layouts[i].shard_numel;
    all_padded += layouts[i].padded_numel;
    if (i > 0) max_block = std::max(max_block, layouts[i].padded_numel);
  }
  const int64_t root = layouts[0].padded_numel;
  const int64_t blocks = static_cast<int64_t>(layouts.size()) - 1;
  plan.sharded_params = 4 * shard_sum;
  plan.optimizer_state = 4 * shard_sum * (optimizer == "adamw" ? 2 : 1);
  plan.grads = 4 * shard_sum;
  if (layouts[0].num_shards > 1) {
    const bool zero3 = strategy == ShardingStrategy::FULL_SHARD ||
                       strategy == ShardingStrategy::HYBRID_SHARD;
    // ZeRO-3: the root + the unit computing + one prefetched unit. ZeRO-2: every unit is
    // unsharded at the end of forward.
    plan.unsharded_params = 4 * (zero3 ? root + std::min<int64_t>(2, blocks) * max_block
                                       : all_padded);
    // Full gradients: the root's lives through backward, plus the unit computing.
    plan.unsharded_grads = 4 * (root + max_block);
  }
  return plan;
}

}  // namespace fsdp
