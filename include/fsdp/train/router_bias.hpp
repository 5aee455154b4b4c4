// fsdp/train/router_bias.hpp: auxiliary-loss-free load balancing of Mixture-of-Experts routers
// (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 2.1.2; Wang et al. 2024,
// "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"), as Megatron-LM's
// moe_router_bias_update_rate and torchtitan's load_balance_coeff run it: after each optimizer
// step, every router's selection bias b (GLM-4.5's and DeepSeek-V3's e_score_correction_bias,
// added to the scores only to choose the experts) moves by a fixed rate toward balance:
//   b_e += rate * sign(mean_e' c_e' - c_e),
// c_e being the (token, pick) pairs the step routed to expert e over every micro-batch and
// rank (Model::take_router_loads, summed over the ranks by the caller). An overloaded expert's
// bias falls, an underloaded one's rises, one at the mean stays. The bias gets no gradient and
// no weight decay (the optimizer leaves it as it is), so this is its only update; it lives in
// the units' fp32 shards like any parameter, so checkpoints, resume and the merge carry it.
#pragma once

#include <string>
#include <vector>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/model.hpp"

namespace fsdp {

// One router's deltas from its step counts c [E] (fp64): rate * sign(mean(c) - c_e), fp32 [E]
// (exactly 0 where c_e equals the mean). Throws fsdp::Error when rate is negative or not
// finite.
std::vector<float> router_bias_deltas(const std::vector<double>& counts, double rate);

// One step's update on this rank's shards: for every load whose bias overlaps this rank's
// shard of the unit holding it, the overlap's fp32 view of the shard and the deltas to add.
// Built on the main thread before FsdpEngine::update_shards (it reads the shards' views,
// which waits for earlier writes); apply(u) runs inside update_shards' write of unit u,
// before the optimizer's step, so the unit's param_dtype copies (made from the shard after
// the write, or by the optimizer's pass under offload) carry it.
class RouterBiasUpdate {
 public:
  // loads: Model::take_router_loads() with counts summed over every rank. Throws fsdp::Error
  // naming a load's parameter that no unit of `engine` holds, or whose element count is not
  // its counts'.
  RouterBiasUpdate(FsdpEngine& engine, const std::vector<Model::RouterLoad>& loads,
                   double rate);
  // Adds unit u's deltas into its shard through the shard's runtime (a read, an fp32 add on
  // the host, a write: [E] elements per router); nothing for a unit without a bias. Safe on
  // the thread update_shards runs u's write on (host memory for an offloaded unit).
  void apply(int unit) const;

 private:
  struct Write {
    TensorView shard;     // fp32, the overlap of the bias with this rank's shard
    DeviceRuntime* rt;    // the shard's runtime
    std::vector<float> delta;
  };
  std::vector<std::vector<Write>> by_unit_;
};

}  // namespace fsdp
