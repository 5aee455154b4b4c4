// tests/train_util.hpp: what the end-to-end training tests share: the process's Runtime,
// rank helpers, fresh run directories, a small learnable dataset and config, a relative
// difference, and a one-call training run. Header-only; each test binary includes it once.
#pragma once

#include <cerrno>  // program_invocation_short_name (GNU)

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/config/config.hpp"
#include "fsdp/model/model.hpp"  // load_config over the registered families
#include "fsdp/data/prepare.hpp"
#include "fsdp/train/runtime.hpp"
#include "fsdp/train/trainer.hpp"

namespace test_util {

namespace fs = std::filesystem;
using fsdp::Config;
using fsdp::TrainOptions;
using fsdp::TrainResult;

// The process's Runtime; MPI was initialised by tests/mpi_main.cpp, so it adopts it.
inline fsdp::Runtime& runtime() {
  static fsdp::Runtime rt(nullptr, nullptr);
  return rt;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A fresh directory shared by all ranks (rank 0 creates it).
inline std::string fresh_dir(const std::string& name) {
  // Per test program too: ctest -j runs different programs with the same world size at once.
  const std::string dir = std::string(FSDP_BINARY_DIR) + "/test_runs/" +
                          program_invocation_short_name + "/" + name + "_np" +
                          std::to_string(world_size());
  if (world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// A learnable byte-level token file (a short text repeated), made once by rank 0.
inline std::string text_dataset() {
  static std::string path;
  if (!path.empty()) return path;
  path = fresh_dir("text_dataset") + "/text.h5";
  if (world_rank() == 0) {
    fsdp::data::ByteSplit split;
    const std::string text = "Sharded data parallel training: all-gather, compute, reshard. ";
    for (int i = 0; i < 60; ++i) split.bytes.insert(split.bytes.end(), text.begin(), text.end());
    split.num_files = 1;
    split.train_tokens = static_cast<int64_t>(split.bytes.size()) * 9 / 10;
    fsdp::data::write_byte_token_file(path, split, "train_util");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// The small runs' recipe after a [model] table: 8 sequences of 12 bytes of text_dataset() a
// step, 5 steps, AdamW with warmup, decay and clipping, no evaluation during the run.
inline constexpr const char* kSmallRecipe = R"(
[data]
seq_len = 12
path = "unset"
[train]
global_batch_size = 8
max_steps = 5
seed = 7
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 2
weight_decay = 0.1
grad_clip = 1.0
[eval]
every = 0
max_windows = 4
)";

// `model_toml` (a [model] table) with kSmallRecipe, into `run_dir`, on text_dataset().
inline Config small_run(const std::string& model_toml, const std::string& run_dir,
                        const std::vector<std::string>& overrides = {}) {
  Config c = fsdp::parse_config(model_toml + kSmallRecipe, "train_util", overrides);
  c.train.run_dir = run_dir;
  c.data.path = text_dataset();
  return c;
}

// The small GPT-2: 2 blocks, C=16, vocab 256 (numel not a multiple of 4: padding appears).
inline constexpr const char* kSmallGpt2 = R"(
[model]
n_layer = 2
n_head = 2
n_embd = 16
n_positions = 16
vocab_size = 256
)";

inline Config small_config(const std::string& run_dir) { return small_run(kSmallGpt2, run_dir); }

// A 2-layer GQA Llama (4 query heads, 2 K/V heads, head_dim 4, untied, llama3 RoPE) on the
// learnable byte dataset.
inline Config llama_config(const std::string& run_dir, std::vector<std::string> overrides = {}) {
  return small_run(R"(
[model]
type = "llama"
num_hidden_layers = 2
hidden_size = 16
num_attention_heads = 4
num_key_value_heads = 2
intermediate_size = 40
max_position_embeddings = 16
vocab_size = 256
rope_theta = 500000.0
rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8 }
)", run_dir, std::move(overrides));
}

// This rank's measured peak of category `c` in a run.
inline int64_t measured(const TrainResult& r, fsdp::MemCategory c) {
  return r.peak_bytes[static_cast<std::size_t>(c)];
}

// The run's memory plan equals its measured device peaks, row by row, activations included.
inline void expect_plan_equals_peak(const TrainResult& r, const std::string& what) {
  using fsdp::MemCategory;
  EXPECT_EQ(r.plan.sharded_params, measured(r, MemCategory::sharded_params)) << what;
  EXPECT_EQ(r.plan.grads, measured(r, MemCategory::grads)) << what;
  EXPECT_EQ(r.plan.optimizer_state, measured(r, MemCategory::optimizer_state)) << what;
  EXPECT_EQ(r.plan.unsharded_params, measured(r, MemCategory::unsharded_params)) << what;
  EXPECT_EQ(r.plan.unsharded_grads, measured(r, MemCategory::unsharded_grads)) << what;
  EXPECT_EQ(r.plan.comm_buffers, measured(r, MemCategory::comm_buffers)) << what;
  EXPECT_EQ(r.planned_activation_bytes, measured(r, MemCategory::activations)) << what;
}

inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

enum class On { world, self };

inline TrainResult run(const Config& c, On on, int64_t stop_after = 0, bool resume = false,
                TrainOptions o = {}) {
  o.quiet = true;
  o.gather_params = true;
  o.stop_after = stop_after;
  o.resume = resume;
  std::ostringstream sink;
  return fsdp::train(c, runtime(), on == On::world ? runtime().world() : runtime().self(), o,
                     sink);
}

}  // namespace test_util
