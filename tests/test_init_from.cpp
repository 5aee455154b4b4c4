// Tests of model.init_from (fsdp/checkpoint/init_from.hpp): a tiny model trained a few steps
// and merged with ckpt::merge_to_hf loads back into every rank's shards bit for bit, each
// rank reading only its share of the bytes; a run started from the merge has, before its
// first step, the source run's final validation loss exactly; sharded index directories,
// Hub-style GPT-2 names and T5's embed_tokens aliases load identically; bad directories are
// input errors (exit 2) naming the file, key or tensor, the same on every rank.
// GPT-2, T5 untied gated-gelu and T5 tied relu. Runs at 1, 2 and 4 ranks.
// MergedShards: for every registered model family (fsdp::model_families(), so a family added
// to the registry is covered without a change here), the merge written as Hugging Face shards
// (MergeOptions::max_shard_size, fsdp_merge --max-shard-size) loads bit for bit as the
// single-file merge, each rank reading exactly its shard's bytes from the shard files, and a
// run started from the shards has the source run's final validation loss.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <variant>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/init_from.hpp"
#include "fsdp/checkpoint/merge.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/train/collective_guard.hpp"
#include "fsdp/model/llama.hpp"
#include "fsdp/model/model.hpp"
#include "train_util.hpp"

namespace {

using namespace test_util;
using fsdp::ckpt::InitFromResult;
using fsdp::ckpt::load_hf_shards;
using nlohmann::json;

// Tiny T5; the relative-attention bias [9, 3] makes the first block of each stack odd-sized,
// so its FlatParameter has padding at 2 and 4 ranks.
Config t5_config(const std::string& run_dir, const std::string& ff, bool tied) {
  Config c = fsdp::parse_config(R"(
[model]
type = "t5"
d_model = 16
d_kv = 5
d_ff = 24
num_layers = 2
num_decoder_layers = 1
num_heads = 3
relative_attention_num_buckets = 9
relative_attention_max_distance = 16
vocab_size = 300
[data]
source = "synthetic"
objective = "span_corruption"
seq_len = 32
[train]
global_batch_size = 8
max_steps = 3
seed = 11
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
weight_decay = 0.1
[fsdp]
transformer_layer_cls_to_wrap = ["T5Block"]
[eval]
every = 0
max_windows = 4
)", "test_init_from", {});
  c.model.set("feed_forward_proj", ff);
  c.model.set("tie_word_embeddings", tied);
  c.train.run_dir = run_dir;
  return c;
}

// Tiny GPT-2 on synthetic tokens (no shared token file: other test binaries running at the
// same time remove and rebuild test_util's text dataset).
Config gpt2_config(const std::string& run_dir) {
  Config c = fsdp::parse_config(std::string(kSmallGpt2) + R"(
[data]
source = "synthetic"
seq_len = 12
[train]
global_batch_size = 8
max_steps = 3
seed = 7
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
weight_decay = 0.1
[eval]
every = 0
max_windows = 4
)", "test_init_from", {});
  c.train.run_dir = run_dir;
  return c;
}

struct Model {
  std::string name;
  std::function<Config(const std::string&)> config;
};
void PrintTo(const Model& m, std::ostream* os) { *os << m.name; }

std::vector<Model> models() {
  return {{"gpt2", gpt2_config},
          {"t5_gated_untied", [](const std::string& d) { return t5_config(d, "gated-gelu", false); }},
          {"t5_relu_tied", [](const std::string& d) { return t5_config(d, "relu", true); }}};
}

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

// The engine's layouts for `c` at this world size (what the trainer passes).
std::vector<fsdp::FlatParamLayout> layouts_of(const Config& c) {
  const auto& family = fsdp::model_family(c.model.type);
  return fsdp::build_unit_layouts(family.modules(c.model), c.fsdp,
                                  fsdp::shards_for(c.fsdp.sharding_strategy, world_size(), world_size()));
}

// This rank's shards loaded from `dir`.
struct Loaded {
  std::vector<std::vector<float>> shards;
  InitFromResult result;
};
Loaded load(const std::string& dir, const Config& c) {
  Loaded l;
  const auto layouts = layouts_of(c);
  std::vector<float*> ptrs;
  for (const auto& u : layouts) l.shards.emplace_back(static_cast<std::size_t>(u.shard_numel), -7.0f);
  for (auto& s : l.shards) ptrs.push_back(s.data());
  l.result = load_hf_shards(dir, c.model, layouts, world_rank(), ptrs);
  return l;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// Runs `f` on every rank, expecting fsdp::Error exit 2 whose one-line message holds `needles`.
template <class F>
void expect_input_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an input error naming " << needles.front();
  } catch (const fsdp::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << what << "\n  lacks: " << n;
  }
}

// One tensor of a rewritten safetensors file.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Rank 0 copies the HF directory `src` to `dst`, passing the tensors through `edit`; files
// split into `files` safetensors files with an index when files > 1. All ranks wait.
void rewrite(const std::string& src, const std::string& dst,
             const std::function<void(std::vector<Tensor>&)>& edit, int files = 1) {
  if (world_rank() == 0) {
    fs::remove_all(dst);
    fs::create_directories(dst);
    fs::copy_file(src + "/config.json", dst + "/config.json");
    const fsdp::safetensors::SafetensorsFile in(src + "/model.safetensors");
    std::vector<Tensor> ts;
    for (const auto& n : in.names()) ts.push_back({n, in.entry(n).shape, in.read_f32(n)});
    edit(ts);
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    const std::size_t per = (ts.size() + files - 1) / files;
    for (int f = 0; f < files; ++f) {
      const std::string name = files == 1 ? "model.safetensors"
                                          : "model-0000" + std::to_string(f + 1) + "-of-0000" +
                                                std::to_string(files) + ".safetensors";
      std::vector<fsdp::safetensors::TensorInfo> infos;
      for (std::size_t i = f * per; i < std::min(ts.size(), (f + 1) * per); ++i) {
        infos.push_back({ts[i].name, ts[i].shape});
        index["weight_map"][ts[i].name] = name;
      }
      fsdp::safetensors::Writer w(dst + "/" + name, infos);
      for (std::size_t i = f * per; i < std::min(ts.size(), (f + 1) * per); ++i)
        w.write_next(ts[i].data.data(), static_cast<int64_t>(ts[i].data.size()));
      w.finish();
    }
    if (files > 1) std::ofstream(dst + "/model.safetensors.index.json") << index.dump(2);
  }
  barrier();
}

// A trained source run of `m` and its merge, made once per model and world size.
struct Source {
  Config cfg;
  TrainResult result;
  std::string hf;  // merged Hugging Face directory
};
const Source& source(const Model& m) {
  static std::map<std::string, Source> cache;
  auto it = cache.find(m.name);
  if (it != cache.end()) return it->second;
  Source s;
  s.cfg = m.config(fresh_dir("init_src_" + m.name));
  s.result = run(s.cfg, On::world);
  s.hf = fresh_dir("init_hf_" + m.name);
  if (world_rank() == 0) {
    fsdp::ckpt::merge_to_hf(fsdp::ckpt::step_dir(s.cfg.train.run_dir, s.cfg.train.max_steps), s.hf);
  }
  barrier();
  return cache.emplace(m.name, std::move(s)).first->second;
}

class InitFrom : public testing::TestWithParam<Model> {};

// Bytes this rank's shards own x 4: parameter elements, without the unit's padding and the
// vocabulary padding rows (model.pad_vocab_multiple: T5's vocabulary 300 has 384 rows), which
// the files do not hold.
int64_t owned_bytes(const std::vector<fsdp::FlatParamLayout>& layouts, int shard = world_rank()) {
  int64_t n = 0;
  for (const auto& l : layouts) {
    for (const auto& e : l.entries) {
      n += std::max<int64_t>(0, std::min(l.shard_end(shard), e.offset + e.spec.unpadded_numel()) -
                                    std::max(l.shard_begin(shard), e.offset));
    }
  }
  return 4 * n;
}

// Elements of the vocabulary pad rows in `layouts` (held by some shard, never read).
int64_t vocab_pad_elements(const std::vector<fsdp::FlatParamLayout>& layouts) {
  int64_t n = 0;
  for (const auto& l : layouts)
    for (const auto& e : l.entries) n += e.spec.numel() - e.spec.unpadded_numel();
  return n;
}

TEST_P(InitFrom, ShardsEqualTheMergedTensorsBitForBitAndEachRankReadsItsShare) {
  const Source& src = source(GetParam());
  const auto layouts = layouts_of(src.cfg);
  const Loaded l = load(src.hf, src.cfg);
  // Every element of every shard: the source run's final parameter (our layout; the merge
  // transposed GPT-2's Conv1D weights and the load transposed them back), padding 0.
  int64_t model_numel = 0;
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const auto& lay = layouts[u];
    for (const auto& e : lay.entries) model_numel += e.spec.unpadded_numel();
    const int64_t sb = lay.shard_begin(world_rank());
    std::vector<float> expect(static_cast<std::size_t>(lay.shard_numel), 0.0f);
    for (const auto& e : lay.entries) {
      const std::vector<float>& full = src.result.params.at(e.spec.name);
      ASSERT_EQ(static_cast<int64_t>(full.size()), e.spec.numel()) << e.spec.name;
      for (int64_t k = 0; k < e.spec.numel(); ++k) {
        const int64_t f = e.offset + k;
        if (f >= sb && f < lay.shard_end(world_rank())) expect[static_cast<std::size_t>(f - sb)] = full[static_cast<std::size_t>(k)];
      }
    }
    ASSERT_EQ(std::memcmp(expect.data(), l.shards[u].data(), expect.size() * sizeof(float)), 0)
        << "unit " << lay.unit_name;
  }
  EXPECT_EQ(l.result.model_bytes, 4 * model_numel);
  EXPECT_TRUE(l.result.unused.empty());
  // Bytes read: exactly the owned elements' bytes (F32 file), about 1/N of the model.
  const int N = world_size();
  EXPECT_EQ(static_cast<int64_t>(l.result.bytes_read), owned_bytes(layouts));
  const double share = static_cast<double>(l.result.bytes_read) / static_cast<double>(l.result.model_bytes);
  if (N == 1) {
    EXPECT_EQ(static_cast<int64_t>(l.result.bytes_read), l.result.model_bytes);
  } else {
    // Padding goes to the last shard: a few elements per unit fewer there; the vocabulary pad
    // rows (T5: 84 of 384 rows) lie in some shards, which read that much less.
    const double slack =
        4.0 * static_cast<double>(static_cast<int64_t>(layouts.size()) * N + vocab_pad_elements(layouts)) /
        static_cast<double>(l.result.model_bytes);
    EXPECT_GE(share, 0.9 / N - slack);
    EXPECT_LE(share, 1.1 / N + slack);
  }
  std::printf("[init_from %s np%d rank %d] read %llu of %lld model bytes (%.4f, 1/N = %.4f)\n",
              GetParam().name.c_str(), N, world_rank(),
              static_cast<unsigned long long>(l.result.bytes_read),
              static_cast<long long>(l.result.model_bytes), share, 1.0 / N);
}

// A merge written in bf16 (fsdp_merge --dtype bf16, as published checkpoints are) loads as
// the fp32 merge's values rounded to bfloat16, bit for bit, each rank reading its share of
// the 2-byte elements.
TEST_P(InitFrom, Bf16MergeLoadsTheRoundedWeights) {
  const Source& src = source(GetParam());
  const std::string dir = fresh_dir("init_bf16_" + GetParam().name);
  if (world_rank() == 0) {
    fsdp::ckpt::MergeOptions options;
    options.dtype = fsdp::DType::bf16;
    fsdp::ckpt::merge_to_hf(fsdp::ckpt::step_dir(src.cfg.train.run_dir, src.cfg.train.max_steps), dir,
                            nullptr, options);
  }
  barrier();
  const Loaded f32 = load(src.hf, src.cfg), bf16 = load(dir, src.cfg);
  ASSERT_EQ(bf16.shards.size(), f32.shards.size());
  int64_t changed = 0;
  for (std::size_t u = 0; u < f32.shards.size(); ++u) {
    std::vector<float> want = f32.shards[u];
    for (float& x : want) {
      const float r = fsdp::round_to(fsdp::DType::bf16, x);
      changed += r != x;
      x = r;
    }
    ASSERT_EQ(std::memcmp(want.data(), bf16.shards[u].data(), want.size() * sizeof(float)), 0) << "unit " << u;
  }
  EXPECT_GT(changed, 0) << "fp32 weights that bf16 represents exactly would not test the rounding";
  EXPECT_EQ(2 * bf16.result.bytes_read, f32.result.bytes_read);
  EXPECT_TRUE(bf16.result.unused.empty());
}

TEST_P(InitFrom, RunStartsAtTheSourceRunsFinalValidationLoss) {
  const Source& src = source(GetParam());
  Config c = GetParam().config(fresh_dir("init_dst_" + GetParam().name));
  c.model.init_from = src.hf;
  c.eval.on_start = true;
  c.train.max_steps = 1;
  const TrainResult r = run(c, On::world);
  ASSERT_FALSE(src.result.val_losses.empty());
  ASSERT_GE(r.val_losses.size(), 1u);
  EXPECT_EQ(r.val_losses.front().first, 0);
  EXPECT_EQ(r.val_losses.front().second, src.result.val_losses.back().second);  // exactly
  EXPECT_EQ(r.init_bytes_read, owned_bytes(layouts_of(c)));

  // With fsdp.cpu_offload in bf16 the device reads the host's bf16 copies of the shards, which
  // must be cast again once init_from has filled the shards (FsdpEngine::write_shards): the
  // step-0 loss is the bf16 run's without offload, exactly.
  Config b = c;
  b.mixed_precision.param_dtype = fsdp::DType::bf16;
  b.train.run_dir = fresh_dir("init_bf16_" + GetParam().name);
  const TrainResult rb = run(b, On::world);
  b.fsdp.cpu_offload = true;
  b.train.run_dir = fresh_dir("init_bf16_offload_" + GetParam().name);
  const TrainResult ro = run(b, On::world);
  ASSERT_GE(rb.val_losses.size(), 1u);
  ASSERT_GE(ro.val_losses.size(), 1u);
  EXPECT_EQ(ro.val_losses.front().second, rb.val_losses.front().second);
  EXPECT_LT(std::abs(rb.val_losses.front().second - r.val_losses.front().second), 0.05);

  // Without init_from the step-0 loss is the random initialisation's (a real difference).
  Config fresh = GetParam().config(fresh_dir("init_rand_" + GetParam().name));
  fresh.eval.on_start = true;
  fresh.train.max_steps = 1;
  const TrainResult r0 = run(fresh, On::world);
  EXPECT_GT(std::abs(r0.val_losses.front().second - r.val_losses.front().second), 1e-3);
  EXPECT_EQ(r0.init_bytes_read, 0);
}

TEST_P(InitFrom, HybridShardReplicasReadTheirShardGroupsShare) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks (2 replicas of shard groups of 2)";
  const Source& src = source(GetParam());
  Config c = GetParam().config(fresh_dir("init_hybrid_" + GetParam().name));
  c.model.init_from = src.hf;
  c.eval.on_start = true;
  c.train.max_steps = 1;
  c.fsdp.sharding_strategy = fsdp::ShardingStrategy::HYBRID_SHARD;
  c.mesh.shard_size = 2;
  const TrainResult r = run(c, On::world);
  EXPECT_EQ(r.val_losses.front().second, src.result.val_losses.back().second);
  // Shard index = rank within the shard group (ranks 0,1 | 2,3): half of the model each.
  const auto layouts = fsdp::build_unit_layouts(fsdp::model_family(c.model.type).modules(c.model), c.fsdp, 2);
  EXPECT_EQ(r.init_bytes_read, owned_bytes(layouts, world_rank() % 2));
}

TEST_P(InitFrom, ResumeIgnoresInitFrom) {
  const Source& src = source(GetParam());
  Config c = GetParam().config(fresh_dir("init_resume_" + GetParam().name));
  c.train.max_steps = 2;
  c.checkpoint.every = 1;
  const TrainResult first = run(c, On::world, /*stop_after=*/1);
  c.model.init_from = src.hf;
  const TrainResult resumed = run(c, On::world, 0, /*resume=*/true);
  EXPECT_EQ(resumed.init_bytes_read, 0);
  // The resumed run continues the checkpoint: the same as running through without stopping.
  Config through = GetParam().config(fresh_dir("init_through_" + GetParam().name));
  through.train.max_steps = 2;
  const TrainResult all = run(through, On::world);
  ASSERT_EQ(resumed.losses.size(), 1u);
  EXPECT_EQ(resumed.losses[0], all.losses[1]);
}

TEST_P(InitFrom, ShardedIndexDirectoryLoadsIdentically) {
  const Source& src = source(GetParam());
  const std::string dir = fresh_dir("init_index_" + GetParam().name);
  rewrite(src.hf, dir, [](std::vector<Tensor>&) {}, /*files=*/2);
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  ASSERT_FALSE(fs::exists(dir + "/model.safetensors"));
  const Loaded a = load(src.hf, src.cfg), b = load(dir, src.cfg);
  EXPECT_TRUE(same_bits(a.shards, b.shards));
  EXPECT_EQ(a.result.bytes_read, b.result.bytes_read);
}

TEST_P(InitFrom, PublishedNamesLoadIdenticallyAndExtraTensorsAreListed) {
  const Source& src = source(GetParam());
  const std::string dir = fresh_dir("init_hub_" + GetParam().name);
  const bool gpt2 = src.cfg.model.type == "gpt2";
  rewrite(src.hf, dir, [&](std::vector<Tensor>& ts) {
    if (gpt2) {
      // Hub GPT-2 files: GPT2Model names (no "transformer."), the causal-mask buffers, and
      // sometimes the tied lm_head.weight.
      for (auto& t : ts) t.name = t.name.substr(std::string("transformer.").size());
      ts.push_back({"h.0.attn.bias", {1, 1, 2, 2}, {1, 0, 1, 1}});
      ts.push_back({"lm_head.weight", ts.front().shape, ts.front().data});
    } else {
      // T5 state dicts: shared.weight also (here: only) as the stacks' embed_tokens.
      for (std::size_t i = 0; i < ts.size(); ++i) {
        if (ts[i].name == "shared.weight") {
          Tensor copy = ts[i];
          ts[i].name = "encoder.embed_tokens.weight";
          copy.name = "decoder.embed_tokens.weight";
          ts.push_back(copy);
          break;
        }
      }
      ts.push_back({"encoder.extra.weight", {2}, {1, 2}});
    }
  });
  const Loaded a = load(src.hf, src.cfg), b = load(dir, src.cfg);
  EXPECT_TRUE(same_bits(a.shards, b.shards));
  EXPECT_EQ(a.result.bytes_read, b.result.bytes_read);
  EXPECT_EQ(b.result.unused,
            std::vector<std::string>{gpt2 ? "h.0.attn.bias" : "encoder.extra.weight"});
}

TEST_P(InitFrom, BadDirectoriesAreInputErrorsNamingTheProblem) {
  const Source& src = source(GetParam());
  const Config& c = src.cfg;
  const std::string base = fresh_dir("init_bad_" + GetParam().name);
  const bool gpt2 = c.model.type == "gpt2";
  // Missing directory; missing config.json.
  expect_input_error([&] { load(base + "/nope", c); }, {"model.init_from", base + "/nope"});
  if (world_rank() == 0) fs::create_directories(base + "/no_config");
  barrier();
  expect_input_error([&] { load(base + "/no_config", c); }, {base + "/no_config/config.json"});
  // config.json describing another size, naming the key and both values.
  const std::string key = gpt2 ? "n_embd" : "d_model";
  rewrite(src.hf, base + "/mismatch", [](std::vector<Tensor>&) {});
  if (world_rank() == 0) {
    std::ifstream in(src.hf + "/config.json");
    json j = json::parse(in);
    j[key] = 32;
    std::ofstream(base + "/mismatch/config.json") << j.dump();
  }
  barrier();
  expect_input_error([&] { load(base + "/mismatch", c); },
                     {base + "/mismatch/config.json", key + " = 32 but model." + key + " = 16"});
  // fsdp_train --model-from: the same directory checks under its own name; a model_type no
  // family has, or none, named with the file.
  expect_input_error([&] { fsdp::ckpt::hf_model_config(base + "/nope"); },
                     {"--model-from", base + "/nope"});
  for (const json& type : {json("bert"), json(nullptr)}) {
    barrier();  // every rank done with the file before rank 0 rewrites it
    if (world_rank() == 0) {
      std::ifstream in(src.hf + "/config.json");
      json j = json::parse(in);
      j["model_type"] = type;
      std::ofstream(base + "/mismatch/config.json") << j.dump();
    }
    barrier();
    expect_input_error([&] { fsdp::ckpt::hf_model_config(base + "/mismatch"); },
                       {base + "/mismatch/config.json", type.is_null() ? "model_type" : "bert"});
  }
  // A missing tensor; a wrongly shaped one (both shapes named); a malformed file.
  const std::string victim = gpt2 ? "transformer.ln_f.bias" : "decoder.final_layer_norm.weight";
  rewrite(src.hf, base + "/missing", [&](std::vector<Tensor>& ts) {
    std::erase_if(ts, [&](const Tensor& t) { return t.name == victim; });
  });
  expect_input_error([&] { load(base + "/missing", c); }, {"no tensor '" + victim + "'"});
  const std::string wrong = gpt2 ? "transformer.wpe.weight" : "encoder.block.0.layer.0.SelfAttention.q.weight";
  std::string want;
  rewrite(src.hf, base + "/shape", [&](std::vector<Tensor>& ts) {
    for (auto& t : ts) {
      if (t.name == wrong) t.shape = {t.shape[0] * t.shape[1]};  // same bytes, flattened
    }
  });
  {
    const fsdp::safetensors::SafetensorsFile f(src.hf + "/model.safetensors");
    const auto s = f.entry(wrong).shape;
    want = "has shape [" + std::to_string(s[0] * s[1]) + "], expected [" + std::to_string(s[0]) +
           "," + std::to_string(s[1]) + "]";
  }
  expect_input_error([&] { load(base + "/shape", c); }, {base + "/shape/model.safetensors", wrong, want});
  rewrite(src.hf, base + "/truncated", [](std::vector<Tensor>&) {});
  if (world_rank() == 0) fs::resize_file(base + "/truncated/model.safetensors", 100);
  barrier();
  expect_input_error([&] { load(base + "/truncated", c); }, {base + "/truncated/model.safetensors"});
}

// The rank whose shard holds element `k` (row-major in the file's shape) of the Hugging Face
// tensor `hf_name` (our flat order differs for a transposed GPT-2 Conv1D weight).
int owner_of(const Config& c, const std::vector<fsdp::FlatParamLayout>& layouts, const std::string& hf_name,
             int64_t k) {
  const auto& family = fsdp::model_family(c.model.type);
  for (const auto& l : layouts) {
    for (const auto& e : l.entries) {
      const auto hf = family.hf_tensor(c.model, e.spec.name, e.spec.unpadded_shape());
      if (!hf || hf->name != hf_name) continue;
      int64_t ours = k;
      if (hf->transpose) {  // HF [in, out] element (i, o) is our [out, in] element (o, i)
        const int64_t in = hf->shape[0], out = hf->shape[1];
        ours = (k % out) * in + k / out;
      }
      return static_cast<int>((e.offset + ours) / l.shard_numel);
    }
  }
  ADD_FAILURE() << "no parameter is stored as " << hf_name;
  return -1;
}

// Issue 29 item 4: a NaN or infinity in the weights was loaded, and the run later blamed the
// learning rate. It is refused on the rank that reads it, naming the file, the tensor and the
// element, and the trainer stops every rank with that one line (exit 2).
TEST_P(InitFrom, NonFiniteWeightsAreRefusedNamingFileTensorAndElement) {
  const Source& src = source(GetParam());
  const Config& c = src.cfg;
  const auto layouts = layouts_of(c);
  const bool gpt2 = c.model.type == "gpt2";
  // A transposed tensor (GPT-2's Conv1D c_attn) or a plain matrix, and a vector.
  const std::vector<std::string> victims =
      gpt2 ? std::vector<std::string>{"transformer.h.1.attn.c_attn.weight", "transformer.ln_f.bias"}
           : std::vector<std::string>{"encoder.block.1.layer.0.SelfAttention.q.weight", "decoder.final_layer_norm.weight"};
  const std::vector<std::pair<float, std::string>> bad{{std::numeric_limits<float>::quiet_NaN(), "nan"},
                                                       {-std::numeric_limits<float>::infinity(), "-inf"}};
  for (std::size_t v = 0; v < victims.size(); ++v) {
    const std::string& victim = victims[v];
    const auto& [value, word] = bad[v];
    SCOPED_TRACE(victim);
    const std::string dir = fresh_dir("init_nonfinite_" + GetParam().name + "_" + std::to_string(v));
    int64_t k = -1;
    std::vector<int64_t> shape;
    rewrite(src.hf, dir, [&](std::vector<Tensor>& ts) {
      for (auto& t : ts) {
        if (t.name != victim) continue;
        k = static_cast<int64_t>(t.data.size()) / 2 + 3;
        t.data[static_cast<std::size_t>(k)] = value;
        shape = t.shape;
      }
    });
    MPI_Bcast(&k, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    ASSERT_GE(k, 0);
    std::string element = "element " + std::to_string(k);
    if (shape.size() == 2) element += " [" + std::to_string(k / shape[1]) + "," + std::to_string(k % shape[1]) + "]";
    const std::vector<std::string> needles{dir + "/model.safetensors: tensor '" + victim + "': " + element + " is " + word,
                                           "the weights hold a non-finite value", "model.init_from = \"" + dir + "\""};
    // The library: only the rank whose shard holds the element reads it, and fails.
    const int owner = owner_of(c, layouts, victim, k);
    if (world_rank() == owner) {
      expect_input_error([&] { load(dir, c); }, needles);
    } else {
      EXPECT_NO_THROW(load(dir, c));
    }
    // The trainer: every rank stops, exit 2; the owner prints the line.
    Config run_cfg = c;
    run_cfg.train.run_dir = fresh_dir("init_nonfinite_run_" + GetParam().name + "_" + std::to_string(v));
    run_cfg.model.init_from = dir;
    try {
      run(run_cfg, On::world);
      ADD_FAILURE() << "training from non-finite weights did not fail";
    } catch (const fsdp::AgreedFailure& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
      EXPECT_EQ(world_rank(), owner);
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\n  lacks: " << n;
    } catch (const fsdp::PeerFailed& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
      EXPECT_NE(world_rank(), owner);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, InitFrom, testing::ValuesIn(models()),
                         [](const testing::TestParamInfo<Model>& i) { return i.param.name; });

// ---- merges written as Hugging Face shards, for every registered family ----

// A tiny [model] of a family this file has no configuration of (family_model): every integer
// key named as in Hugging Face configs gets a small value, the others keep their defaults.
Config tiny_from_hf_names(const std::string& type, const std::string& run_dir,
                          const std::vector<std::string>& overrides = {}) {
  static const std::map<std::string, int64_t> kSmall = {
      {"vocab_size", 300},  // padded to 384 rows in training (model.pad_vocab_multiple)
      {"n_layer", 2}, {"num_layers", 2}, {"num_hidden_layers", 2}, {"num_decoder_layers", 1},
      {"n_head", 2}, {"num_heads", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
      {"n_embd", 16}, {"d_model", 16}, {"hidden_size", 16}, {"d_kv", 8}, {"head_dim", 8},
      {"n_inner", 24}, {"d_ff", 24}, {"intermediate_size", 24}, {"ffn_dim", 24},
      {"n_positions", 64}, {"max_position_embeddings", 64}, {"relative_attention_num_buckets", 8},
      {"relative_attention_max_distance", 16}};
  std::string toml = "[model]\ntype = \"" + type + "\"\n";
  for (const fsdp::ModelKey& k : fsdp::model_family(type).keys()) {
    const auto it = kSmall.find(k.name);
    if (it != kSmall.end() && std::holds_alternative<int64_t>(k.default_value))
      toml += k.name + " = " + std::to_string(it->second) + "\n";
  }
  toml += R"(
[data]
source = "synthetic"
seq_len = 16
[train]
global_batch_size = 8
max_steps = 3
seed = 13
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
weight_decay = 0.1
[eval]
every = 0
max_windows = 4
)";
  Config c = fsdp::parse_config(
      toml,
      "test_init_from: tiny " + type +
          " from Hugging Face size names (if this fails, give the family a line in family_model())",
      overrides);
  c.train.run_dir = run_dir;
  return c;
}

// The tiny model of each family: the configurations above for the families they were written
// for, tiny_from_hf_names for any other. A family needing more than size names: one line here.
Model family_model(const std::string& type) {
  if (type == "gpt2") return models()[0];
  if (type == "t5") return models()[1];  // T5 v1.1: gated-gelu, untied head
  if (type == "deepseek_v3" || type == "deepseek_v2") {  // MLA's keys and values: per head
    return {type, [type](const std::string& dir) {
              return tiny_from_hf_names(type, dir, {"model.num_key_value_heads=2"});
            }};
  }
  return {type, [type](const std::string& dir) { return tiny_from_hf_names(type, dir); }};
}

std::vector<std::string> family_types() {
  std::vector<std::string> types;
  for (const fsdp::ModelFamily* f : fsdp::model_families()) types.push_back(f->type());
  return types;
}

class MergedShards : public testing::TestWithParam<std::string> {};

TEST_P(MergedShards, LoadBitForBitAsTheSingleFileAndEachRankReadsOnlyItsShare) {
  const Model m = family_model(GetParam());
  const Source& src = source(m);
  int64_t model_numel = 0;
  for (const auto& l : layouts_of(src.cfg))
    for (const auto& e : l.entries) model_numel += e.spec.numel();
  ASSERT_LT(model_numel, 1'000'000) << "the tiny " << m.name << " is not tiny";
  // 1000 bytes: a shard per tensor larger than that (embeddings, weights), the small ones
  // (norms, biases) grouped.
  constexpr int64_t kLimit = 1000;
  const std::string dir = fresh_dir("init_shards_" + m.name);
  if (world_rank() == 0) {
    const auto st = fsdp::ckpt::merge_to_hf(fsdp::ckpt::step_dir(src.cfg.train.run_dir, src.cfg.train.max_steps),
                                            dir, nullptr, {.max_shard_size = kLimit});
    EXPECT_TRUE(st.sharded);
    EXPECT_EQ(st.total_size, 4 * st.num_elements);
  }
  barrier();
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  ASSERT_FALSE(fs::exists(dir + "/model.safetensors"));
  const fsdp::safetensors::SafetensorsCheckpoint shards(dir), single(src.hf);
  ASSERT_TRUE(shards.sharded());
  EXPECT_GE(shards.files().size(), 3u);
  // The same tensors; every shard within the limit unless it holds one larger tensor.
  std::vector<std::string> a = shards.names(), b = single.names();
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  bool lone_large = false;
  for (const auto& f : shards.files()) {
    int64_t bytes = 0;
    for (const auto& n : f.names()) bytes += f.entry(n).end - f.entry(n).begin;
    EXPECT_EQ(f.metadata().at("format"), "pt") << f.path();
    if (f.names().size() == 1 && bytes > kLimit) {
      lone_large = true;
    } else {
      EXPECT_LE(bytes, kLimit) << f.path();
    }
  }
  EXPECT_TRUE(lone_large);
  for (const auto& n : b) EXPECT_EQ(shards.read_f32(n), single.read_f32(n)) << n;

  // init_from: the same shards as from the single file, each rank reading exactly its
  // elements' bytes (about 1/N of the model) from whichever files hold them.
  const Loaded one = load(src.hf, src.cfg), many = load(dir, src.cfg);
  EXPECT_TRUE(same_bits(one.shards, many.shards));
  EXPECT_EQ(static_cast<int64_t>(many.result.bytes_read), owned_bytes(layouts_of(src.cfg)));
  EXPECT_EQ(many.result.bytes_read, one.result.bytes_read);
  EXPECT_TRUE(many.result.unused.empty());
  std::printf("[merged shards %s np%d rank %d] %zu files; read %llu of %lld model bytes\n", m.name.c_str(),
              world_size(), world_rank(), shards.files().size(),
              static_cast<unsigned long long>(many.result.bytes_read), static_cast<long long>(many.result.model_bytes));

  // fsdp_train --model-from: the [model] keys the directory's config.json gives are the run's
  // (canonical form), with init_from = the directory, and init_from's check accepts them.
  const fsdp::ModelConfig from = fsdp::ckpt::hf_model_config(dir);
  EXPECT_EQ(from.type, GetParam());
  EXPECT_EQ(from.init_from, dir);
  const fsdp::ModelFamily& family = fsdp::model_family(GetParam());
  EXPECT_EQ(fsdp::model_config_json(from), fsdp::model_config_json(family.canonical(src.cfg.model)));
  EXPECT_NO_THROW(fsdp::ckpt::check_hf_config(dir, from));

  // A run started from the shards: the source run's final validation loss before its first step.
  Config c = m.config(fresh_dir("init_shards_run_" + m.name));
  c.model.init_from = dir;
  c.eval.on_start = true;
  c.train.max_steps = 1;
  const TrainResult r = run(c, On::world);
  ASSERT_FALSE(src.result.val_losses.empty());
  ASSERT_GE(r.val_losses.size(), 1u);
  EXPECT_EQ(r.val_losses.front().second, src.result.val_losses.back().second);  // exactly
  EXPECT_EQ(r.init_bytes_read, owned_bytes(layouts_of(c)));
}

INSTANTIATE_TEST_SUITE_P(Families, MergedShards, testing::ValuesIn(family_types()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// Gemma 3 4B, 12B and 27B ship as Gemma3ForConditionalGeneration and Mistral Small 3.1 / 3.2
// as Mistral3ForConditionalGeneration, Llama 4 Scout / Maverick as
// Llama4ForConditionalGeneration, Qwen3.5 as Qwen3_5ForConditionalGeneration and
// Qwen3_5MoeForConditionalGeneration: config.json's text_config is the decoder's config
// (Gemma3TextConfig, MistralConfig, Llama4TextConfig, Qwen3_5TextConfig, Qwen3_5MoeTextConfig),
// and the text decoder's tensors are prefixed
// ("language_model.model." and "language_model.lm_head." in the Hub's files,
// "model.language_model." and "lm_head." as transformers 5 saves them) beside the vision
// tower's. init_from reads the decoder from either form bit for bit as from the text-only
// merge and lists the vision tensors as unused; --model-from prints the decoder's [model].
TEST(InitFromMultimodal, ConditionalGenerationCheckpointsLoadTheirTextDecoder) {
  struct Case {
    const char* type;          // the decoder's model.type
    const char* model_type;    // the multimodal config.json's
    const char* architecture;
    const char* vision_type;
  };
  for (const Case& k : {Case{"gemma3_text", "gemma3", "Gemma3ForConditionalGeneration",
                             "siglip_vision_model"},
                        Case{"mistral", "mistral3", "Mistral3ForConditionalGeneration",
                             "pixtral"},
                        Case{"llama4_text", "llama4", "Llama4ForConditionalGeneration",
                             "llama4_vision_model"},
                        // (Qwen3.5's Hub files: transformers 5's names, beside model.visual.*)
                        Case{"qwen3_5_text", "qwen3_5", "Qwen3_5ForConditionalGeneration",
                             "qwen3_5"},
                        Case{"qwen3_5_moe_text", "qwen3_5_moe",
                             "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"}}) {
    SCOPED_TRACE(k.model_type);
    const Source& src = source(family_model(k.type));
    std::string dir;
    for (const bool v5 : {false, true}) {
      dir = fresh_dir(std::string("init_") + k.model_type + "_mm" + (v5 ? "_v5" : ""));
      const std::vector<std::string> vision = {"multi_modal_projector.linear_1.weight",
                                               "vision_tower.transformer.ln_pre.weight"};
      rewrite(src.hf, dir, [&](std::vector<Tensor>& ts) {
        for (auto& t : ts) {
          const bool body = t.name.rfind("model.", 0) == 0;
          ASSERT_TRUE(body || t.name == "lm_head.weight") << t.name;
          if (v5) {
            if (body) t.name = "model.language_model." + t.name.substr(6);
          } else {
            t.name = "language_model." + t.name;
          }
        }
        ts.push_back({vision[0], {2, 2}, {1, 2, 3, 4}});
        ts.push_back({vision[1], {2}, {1, 2}});
      });
      if (world_rank() == 0) {
        std::ifstream in(src.hf + "/config.json");
        const json mm = {{"architectures", {k.architecture}},
                         {"model_type", k.model_type},
                         {"text_config", json::parse(in)},
                         {"vision_config", {{"model_type", k.vision_type}}},
                         {"image_token_index", 10}};
        std::ofstream(dir + "/config.json") << mm.dump(2);
      }
      barrier();
      const Loaded a = load(src.hf, src.cfg), b = load(dir, src.cfg);
      EXPECT_TRUE(same_bits(a.shards, b.shards)) << "v5 " << v5;
      EXPECT_EQ(a.result.bytes_read, b.result.bytes_read);
      std::vector<std::string> unused = b.result.unused;
      std::sort(unused.begin(), unused.end());
      EXPECT_EQ(unused, vision);
      const fsdp::ModelConfig from = fsdp::ckpt::hf_model_config(dir);
      EXPECT_EQ(from.type, k.type);
      EXPECT_NO_THROW(fsdp::ckpt::check_hf_config(dir, from));
    }
    // Another model inside: named by its text_config.
    Config other = src.cfg;
    other.model.set("num_hidden_layers", int64_t{3});
    expect_input_error([&] { fsdp::ckpt::check_hf_config(dir, other.model); },
                       {"config.json: num_hidden_layers = 2 but model.num_hidden_layers = 3"});
  }
}

}  // namespace

namespace {

// transformers 5 keeps a Mixture-of-Experts layer's experts packed (Qwen3MoeExperts,
// MixtralExperts, OlmoeExperts): model.layers.{l}.mlp.experts.gate_up_proj [E, 2I, C] (expert
// e's gate rows, then its up rows) and mlp.experts.down_proj [E, C, I], and Mixtral's router
// under mlp.gate, as checkpoints saved with save_original_format=False (and newer Hub models)
// hold them. init_from reads that layout bit for bit as the per-expert one the merge writes.
TEST(InitFromPackedExperts, TransformersFiveLayoutLoadsAsThePerExpertOne) {
  // (GLM-4.5's and DeepSeek-V3's dense layer 0 has no experts; their routers'
  // e_score_correction_bias stays a tensor of its own, as in transformers 5)
  for (const char* type :
       {"qwen3_moe", "mixtral", "olmoe", "glm4_moe", "deepseek_v3", "deepseek_v2"}) {
    SCOPED_TRACE(type);
    const Source& src = source(family_model(type));
    const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(src.cfg.model);
    const bool mixtral = std::string(type) == "mixtral";
    const int64_t E = g.num_experts, I = g.expert_size(), C = g.hidden_size;
    const std::string dir = fresh_dir(std::string("init_packed_") + type);
    rewrite(src.hf, dir, [&](std::vector<Tensor>& ts) {
      std::map<std::string, Tensor> by_name;
      for (auto& t : ts) by_name[t.name] = t;
      std::vector<Tensor> out;
      const std::string block = mixtral ? ".block_sparse_moe." : ".mlp.";
      for (auto& t : ts) {
        if (t.name.find(".experts.") != std::string::npos) continue;  // packed below
        if (mixtral && t.name.find(".block_sparse_moe.gate.weight") != std::string::npos) {
          t.name.replace(t.name.find(".block_sparse_moe."), 18, ".mlp.");
        }
        out.push_back(t);
      }
      for (int64_t l = 0; l < g.num_hidden_layers; ++l) {
        if (!g.layer_sparse(l)) continue;
        const std::string layer = "model.layers." + std::to_string(l);
        Tensor gate_up{layer + ".mlp.experts.gate_up_proj", {E, 2 * I, C}, {}};
        Tensor down{layer + ".mlp.experts.down_proj", {E, C, I}, {}};
        for (int64_t e = 0; e < E; ++e) {
          const std::string ex = layer + block + "experts." + std::to_string(e) + ".";
          for (const char* p : {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj"}) {
            const Tensor& t = by_name.at(ex + p + ".weight");
            gate_up.data.insert(gate_up.data.end(), t.data.begin(), t.data.end());
          }
          const Tensor& d = by_name.at(ex + (mixtral ? "w2" : "down_proj") + ".weight");
          down.data.insert(down.data.end(), d.data.begin(), d.data.end());
        }
        out.push_back(std::move(gate_up));
        out.push_back(std::move(down));
      }
      ts = std::move(out);
    });
    const Loaded a = load(src.hf, src.cfg), b = load(dir, src.cfg);
    EXPECT_TRUE(same_bits(a.shards, b.shards));
    EXPECT_TRUE(b.result.unused.empty()) << b.result.unused.front();
    EXPECT_EQ(a.result.num_tensors, b.result.num_tensors);
    // A packed tensor of another shape is named with the shape it should have.
    const std::string last = "model.layers." + std::to_string(g.num_hidden_layers - 1);
    const std::string bad = fresh_dir(std::string("init_packed_bad_") + type);
    rewrite(dir, bad, [&](std::vector<Tensor>& ts) {
      for (auto& t : ts) {
        if (t.name == last + ".mlp.experts.down_proj") t.shape = {E, I, C};
      }
    });
    // Neither layout of an expert: the message names both.
    const std::string missing = fresh_dir(std::string("init_packed_missing_") + type);
    rewrite(dir, missing, [&](std::vector<Tensor>& ts) {
      std::erase_if(ts, [](const Tensor& t) {
        return t.name == "model.layers.1.mlp.experts.gate_up_proj";
      });
    });
    expect_input_error(
        [&] { load(missing, src.cfg); },
        {std::string("no tensor 'model.layers.1.") +
             (mixtral ? "block_sparse_moe.experts.0.w1.weight" : "mlp.experts.0.gate_proj.weight") +
             "' or its elements of 'model.layers.1.mlp.experts.gate_up_proj'"});
    expect_input_error([&] { load(bad, src.cfg); },
                       {"tensor '" + last + ".mlp.experts.down_proj' has shape [" +
                        std::to_string(E) + "," + std::to_string(I) + "," + std::to_string(C) +
                        "], expected [" + std::to_string(E) + "," + std::to_string(C) + "," +
                        std::to_string(I) + "]"});
  }
}

// A safetensors file of raw tensors (F32 values or U8 bytes), written as the safetensors
// format lays them out: the header's length, its JSON, the data in header order.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_raw_safetensors(const std::string& path, const std::vector<RawTensor>& ts) {
  json header = {{"__metadata__", {{"format", "pt"}}}};
  int64_t at = 0;
  for (const RawTensor& t : ts) {
    const auto n = static_cast<int64_t>(t.bytes.size());
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + n}}};
    at += n;
  }
  const std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);  // little-endian (x86, the test machines)
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const RawTensor& t : ts) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
}
RawTensor raw_f32(const Tensor& t) {
  RawTensor r{t.name, "F32", t.shape, std::vector<uint8_t>(t.data.size() * 4)};
  std::memcpy(r.bytes.data(), t.data.data(), r.bytes.size());
  return r;
}

// The Hub's gpt-oss checkpoints (openai/gpt-oss-20b, -120b) hold the experts' weights in MXFP4:
// mlp.experts.gate_up_proj_blocks U8 [E, 2I, C / 32, 16] and _scales U8 [E, 2I, C / 32]
// (down_proj's [E, C, I / 32, 16] and [E, C, I / 32]), config.json's quantization_config
// {"quant_method": "mxfp4"}. init_from dequantizes them as transformers'
// convert_moe_packed_tensors does (then .transpose(1, 2)): each rank's share is bit for bit
// that of a checkpoint holding the dequantized values as F32 in transformers' layout, written
// here from an independent decoding of the same bytes (e2m1 from its bits: sign, exponent,
// mantissa); the fixed bytes 0x21 0xF7 0x08 0x9C at scale 127 read as transformers reads them
// (0.5, 1, 6, -6, -0, 0, -2, -0.5). A scale of 255 (inf) and a blocks tensor of another dtype
// are refused by name.
TEST(InitFromMxfp4, GptOssHubExpertsDequantizeAsTransformersDoes) {
  const Model m{"gpt_oss_mxfp4", [](const std::string& dir) {
                  return tiny_from_hf_names("gpt_oss", dir,
                                            {"model.hidden_size=32", "model.intermediate_size=64",
                                             "model.num_local_experts=3"});
                }};
  const Source& src = source(m);
  const fsdp::LlamaConfig g = fsdp::LlamaConfig::from(src.cfg.model);
  const int64_t E = g.num_experts, I = g.expert_size(), C = g.hidden_size;
  ASSERT_EQ(C % 32, 0);
  ASSERT_EQ(I % 32, 0);
  // e2m1 from its bits: (-1)^s 2^(e - 1) (1 + m / 2), e = 0: m / 2
  auto e2m1 = [](int nib) {
    const int sign = nib >> 3, e = (nib >> 1) & 3, mant = nib & 1;
    const double mag = e == 0 ? mant * 0.5 : std::ldexp(1.0 + mant * 0.5, e - 1);
    return static_cast<float>(sign ? -mag : mag);
  };
  // Random codes for one tensor [E, rows, cols] (rows: output features), its blocks and scales,
  // and the dequantized values in ours = transformers' [E, cols, rows].
  std::mt19937 gen(5);
  struct Codes {
    std::vector<uint8_t> blocks, scales;
    std::vector<float> ours;
  };
  auto make = [&](int64_t rows, int64_t cols, bool fixed) {
    const int64_t G = cols / 32;
    Codes k{std::vector<uint8_t>(static_cast<std::size_t>(E * rows * G * 16)),
            std::vector<uint8_t>(static_cast<std::size_t>(E * rows * G)),
            std::vector<float>(static_cast<std::size_t>(E * cols * rows))};
    for (auto& b : k.blocks) b = static_cast<uint8_t>(gen() & 0xFF);
    for (auto& s : k.scales) s = static_cast<uint8_t>(124 + gen() % 5);  // 2^-3 .. 2^1
    if (fixed) {  // row (0, 0): bytes 0x21 0xF7 0x08 0x9C at scale 127
      const uint8_t bytes[4] = {0x21, 0xF7, 0x08, 0x9C};
      std::copy(bytes, bytes + 4, k.blocks.begin());
      k.scales[0] = 127;
    }
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t byte = k.blocks[static_cast<std::size_t>((e * rows + r) * G * 16 + c / 2)];
          const int nib = c % 2 == 0 ? byte & 0x0F : byte >> 4;
          const int s = k.scales[static_cast<std::size_t>((e * rows + r) * G + c / 32)];
          k.ours[static_cast<std::size_t>((e * cols + c) * rows + r)] =
              e2m1(nib) * static_cast<float>(std::pow(2.0, s - 127));
        }
      }
    }
    return k;
  };
  std::map<std::string, Codes> codes;
  for (int64_t l = 0; l < g.num_hidden_layers; ++l) {
    const std::string ex = "model.layers." + std::to_string(l) + ".mlp.experts.";
    codes[ex + "gate_up_proj"] = make(2 * I, C, l == 0);
    codes[ex + "down_proj"] = make(C, I, false);
  }
  const std::vector<float> fixed = {0.5f, 1.0f, 6.0f, -6.0f, -0.0f, 0.0f, -2.0f, -0.5f};
  const Codes& first = codes["model.layers.0.mlp.experts.gate_up_proj"];
  for (std::size_t k = 0; k < fixed.size(); ++k) {  // ours (0, k, 0) = dequantized (0, 0, k)
    const float v = first.ours[k * static_cast<std::size_t>(2 * I)];
    EXPECT_EQ(std::memcmp(&v, &fixed[k], sizeof v), 0) << "input feature " << k << ": " << v;
  }
  // The dequantized values as F32 (transformers' layout), and the MXFP4 form of the same
  const std::string plain = fresh_dir("init_mxfp4_plain"), quant = fresh_dir("init_mxfp4_hub");
  const std::string bad_scale = fresh_dir("init_mxfp4_inf"),
                    bad_dtype = fresh_dir("init_mxfp4_f32");
  rewrite(src.hf, plain, [&](std::vector<Tensor>& ts) {
    for (auto& t : ts) {
      if (codes.count(t.name)) t.data = codes[t.name].ours;
    }
  });
  if (world_rank() == 0) {
    const fsdp::safetensors::SafetensorsFile in(plain + "/model.safetensors");
    std::ifstream cin(plain + "/config.json");
    json cfg = json::parse(cin);
    cfg["quantization_config"] = {{"quant_method", "mxfp4"},
                                  {"modules_to_not_convert",
                                   {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                    "model.embed_tokens", "lm_head"}}};
    for (const std::string& dir : {quant, bad_scale, bad_dtype}) {
      fs::create_directories(dir);
      std::ofstream(dir + "/config.json") << cfg.dump(2);
      std::vector<RawTensor> raw;
      for (const std::string& n : in.names()) {
        const auto it = codes.find(n);
        if (it == codes.end()) {
          raw.push_back(raw_f32({n, in.entry(n).shape, in.read_f32(n)}));
          continue;
        }
        const bool gate_up = n.find("gate_up_proj") != std::string::npos;
        const int64_t rows = gate_up ? 2 * I : C, cols = gate_up ? C : I;
        Codes k = it->second;
        if (dir == bad_scale && n == "model.layers.1.mlp.experts.down_proj") {
          std::fill(k.scales.begin(), k.scales.end(), uint8_t{255});  // 6 x 2^128: inf
          std::fill(k.blocks.begin(), k.blocks.end(), uint8_t{0x77});
        }
        RawTensor blocks{n + "_blocks", "U8", {E, rows, cols / 32, 16}, k.blocks};
        if (dir == bad_dtype && n == "model.layers.0.mlp.experts.gate_up_proj") {
          blocks.dtype = "I8";
        }
        raw.push_back(std::move(blocks));
        raw.push_back({n + "_scales", "U8", {E, rows, cols / 32}, k.scales});
      }
      write_raw_safetensors(dir + "/model.safetensors", raw);
    }
  }
  barrier();
  const Loaded a = load(plain, src.cfg), b = load(quant, src.cfg);
  EXPECT_TRUE(same_bits(a.shards, b.shards));
  EXPECT_TRUE(b.result.unused.empty()) << b.result.unused.front();
  EXPECT_EQ(a.result.num_tensors, b.result.num_tensors);
  // Every value of layer 1's down_proj is inf: refused by each rank whose shard holds some of it
  const std::string victim = "model.layers.1.mlp.experts.down_proj";
  bool reads = false;
  for (const auto& u : layouts_of(src.cfg)) {
    for (const auto& e : u.entries) {
      if (e.spec.name != victim) continue;
      reads = std::max(e.offset, u.shard_begin(world_rank())) <
              std::min(e.offset + e.spec.numel(), u.shard_end(world_rank()));
    }
  }
  if (reads) {
    expect_input_error([&] { load(bad_scale, src.cfg); },
                       {"tensor '" + victim + "_blocks': element [", "dequantizes to inf",
                        "(scale 255; the gpt_oss parameter " + victim + ")"});
  } else {
    EXPECT_NO_THROW(load(bad_scale, src.cfg));
  }
  expect_input_error([&] { load(bad_dtype, src.cfg); },
                     {"tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' is I8",
                      "expected U8 [" + std::to_string(E) + "," + std::to_string(2 * I) + "," +
                          std::to_string(C / 32) + ",16]"});
}

}  // namespace
