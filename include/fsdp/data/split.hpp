// fsdp/data/split.hpp: the two splits of a data file (its HDF5 groups /train and /val).
#pragma once

#include "fsdp/core/enum_names.hpp"

namespace fsdp::data {

// A split of the data: train (the training stream / examples) or val (evaluation).
enum class Split { train, val };

}  // namespace fsdp::data

namespace fsdp {
// The split's name as in the file's group names (/train/..., /val/...) and messages:
// "train" | "val" (to_string(Split): fsdp/core/enum_names.hpp).
template <>
struct EnumNames<data::Split> {
  static constexpr EnumName<data::Split> table[] = {{data::Split::train, "train"},
                                                    {data::Split::val, "val"}};
};
}  // namespace fsdp
