// FlatParameter packing and padding (see fsdp/fsdp/flat_param.hpp).
#include "fsdp/fsdp/flat_param.hpp"

#include "fsdp/core/error.hpp"

namespace fsdp {

FlatParamLayout FlatParamLayout::build(std::string unit_name, std::vector<ParamSpec> params,
                                       int64_t num_shards) {
  if (num_shards < 1) throw Error("FlatParamLayout: num_shards must be >= 1");
  FlatParamLayout layout;
  layout.unit_name = std::move(unit_name);
  layout.num_shards = num_shards;
  int64_t offset = 0;
  for (auto& p : params) {
    const int64_t n = p.numel();
    layout.entries.push_back({std::move(p), offset});
    offset += n;
  }
  layout.numel = offset;
  layout.padded_numel = (offset + num_shards - 1) / num_shards * num_shards;
  layout.shard_numel = layout.padded_numel / num_shards;
  return layout;
}

}  // namespace fsdp
