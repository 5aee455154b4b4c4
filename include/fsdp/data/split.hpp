// fsdp/data/split.hpp: the two splits of a data file (its HDF5 groups /train and /val).
#pragma once

namespace fsdp::data {

// A split of the data: train (the training stream / examples) or val (evaluation).
enum class Split { train, val };

// The split's name as in the file's group names (/train/..., /val/...) and messages:
// "train" | "val".
constexpr const char* to_string(Split s) { return s == Split::train ? "train" : "val"; }

}  // namespace fsdp::data
