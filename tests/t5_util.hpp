// tests/t5_util.hpp: the tiny T5 run that the T5 training tests share (test_t5_fsdp,
// test_memory_plan, test_gpu_train): a small seq2seq pairs file with examples of different
// lengths, and the config of a tiny T5 trained on it. Header-only, like train_util.hpp.
#pragma once

#include <mpi.h>

#include <random>
#include <string>
#include <vector>

#include "fsdp/data/prepare.hpp"
#include "fsdp/model/model.hpp"  // parse_config over the registered families
#include "train_util.hpp"

namespace test_util {

// A seq2seq pairs file (ByT5 ids, eos 1 appended), made once by rank 0: 48 training and 8
// validation examples; inputs of 2..16 ids and targets of 2..8 ids (eos included), so with
// max_input_len 12 / max_target_len 6 rows are padded and some are truncated. The target
// is the input's first tokens reversed: something the model can start to learn in 5 steps.
inline std::string pairs_dataset() {
  static std::string path;
  if (!path.empty()) return path;
  path = fresh_dir("t5_pairs") + "/pairs.h5";
  if (world_rank() == 0) {
    std::mt19937 gen(2024);  // the raw engine's sequence is fixed by the standard
    auto make = [&](fsdp::data::PairExamples& ex, int n) {
      for (int i = 0; i < n; ++i) {
        const int in_len = 1 + static_cast<int>(gen() % 15);   // + eos: 2..16
        const int tgt_len = 1 + static_cast<int>(gen() % 7);   // + eos: 2..8
        std::vector<int32_t> in, tgt;
        for (int t = 0; t < in_len; ++t) in.push_back(3 + static_cast<int32_t>(gen() % 40));
        for (int t = 0; t < tgt_len; ++t) tgt.push_back(in[static_cast<std::size_t>((tgt_len - 1 - t) % in_len)]);
        in.push_back(1);
        tgt.push_back(1);
        ex.add(in, tgt);
      }
    };
    fsdp::data::PairSplit split;
    make(split.train, 48);
    make(split.val, 8);
    fsdp::data::write_pairs_file(path, split, "test_t5_fsdp");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// A tiny T5 v1.0 (relu, tied; 2 encoder blocks, 1 decoder block, d_model 16) on
// pairs_dataset(), 5 steps of 8 examples, AdamW with decay and clipping, evaluated at the end.
inline Config t5_config(const std::string& run_dir) {
  Config c = fsdp::parse_config(R"(
[model]
type = "t5"
d_model = 16
d_kv = 8
d_ff = 24
num_layers = 2
num_decoder_layers = 1
num_heads = 2
relative_attention_num_buckets = 8
relative_attention_max_distance = 16
vocab_size = 384
[data]
objective = "seq2seq"
path = "unset"
max_input_len = 12
max_target_len = 6
[train]
global_batch_size = 8
max_steps = 5
seed = 11
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 2
weight_decay = 0.1
grad_clip = 1.0
[eval]
every = 0
)", "test_t5_fsdp", {});
  c.train.run_dir = run_dir;
  c.data.path = pairs_dataset();
  return c;
}

}  // namespace test_util
