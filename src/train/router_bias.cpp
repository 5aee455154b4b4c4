// Auxiliary-loss-free load balancing's bias update (see fsdp/train/router_bias.hpp).
#include "fsdp/train/router_bias.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp {

std::vector<float> router_bias_deltas(const std::vector<double>& counts, double rate) {
  if (!(rate >= 0.0) || !std::isfinite(rate)) {
    throw Error("router_bias_deltas: rate " + std::to_string(rate) +
                " (expected >= 0 and finite)");
  }
  double sum = 0.0;
  for (double c : counts) sum += c;
  const double mean = counts.empty() ? 0.0 : sum / static_cast<double>(counts.size());
  std::vector<float> delta(counts.size());
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const double d = mean - counts[e];
    delta[e] = static_cast<float>(d > 0 ? rate : d < 0 ? -rate : 0.0);
  }
  return delta;
}

RouterBiasUpdate::RouterBiasUpdate(FsdpEngine& engine, const std::vector<Model::RouterLoad>& loads,
                                   double rate)
    : by_unit_(static_cast<std::size_t>(engine.num_units())) {
  for (const Model::RouterLoad& load : loads) {
    const std::vector<float> delta = router_bias_deltas(load.counts, rate);
    bool found = false;
    for (int u = 0; u < engine.num_units() && !found; ++u) {
      const FlatParamLayout& layout = engine.layout(u);
      for (const FlatEntry& entry : layout.entries) {
        if (entry.spec.name != load.param) continue;
        found = true;
        const auto n = static_cast<int64_t>(delta.size());
        if (entry.spec.numel() != n) {
          throw Error("RouterBiasUpdate: " + load.param + " has " +
                      std::to_string(entry.spec.numel()) + " elements, its router " +
                      std::to_string(n) + " experts");
        }
        // The overlap of [offset, offset + n) with this rank's shard [begin, end).
        const int64_t begin = layout.shard_begin(engine.shard_index());
        const int64_t lo = std::max(entry.offset, begin);
        const int64_t hi = std::min(entry.offset + n, layout.shard_end(engine.shard_index()));
        if (lo >= hi) break;
        by_unit_[static_cast<std::size_t>(u)].push_back(
            {engine.shard_param(u).slice(lo - begin, hi - lo), &engine.shard_runtime(u),
             std::vector<float>(delta.begin() + (lo - entry.offset),
                                delta.begin() + (hi - entry.offset))});
        break;
      }
    }
    if (!found) throw Error("RouterBiasUpdate: no unit holds " + load.param);
  }
}

void RouterBiasUpdate::apply(int unit) const {
  for (const Write& w : by_unit_.at(static_cast<std::size_t>(unit))) {
    std::vector<float> value(w.delta.size());
    w.rt->copy_to_host(value.data(), w.shard);
    for (std::size_t i = 0; i < value.size(); ++i) value[i] += w.delta[i];
    w.rt->copy_from_host(w.shard, value.data());
  }
}

}  // namespace fsdp
