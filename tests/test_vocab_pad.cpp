// model.pad_vocab_multiple (Megatron-LM's --make-vocab-size-divisible-by): the token embedding
// and LM head are padded to a multiple of 128 rows inside fsdp_train, and nothing else may
// notice. Checked here, at 1 and 2 ranks:
//  - one forward/backward of GPT-2 (vocabularies 1001 and 50257) and T5 (300; tied relu and
//    untied gated-gelu), fp32 and bf16: the padded model's loss equals the unpadded model's
//    (pad_vocab_multiple = 1) bit for bit, so do its initial parameters and the gradients of
//    every parameter's own rows; the pad rows are initialised to 0 and get a zero gradient;
//  - training: pad 128 and pad 1 give the same losses and parameters, the pad rows stay 0,
//    and fsdp_merge of the two checkpoints gives byte-identical model.safetensors and
//    config.json (the merged tensors have the model's vocab_size rows);
//  - init_from of a vocab-50257 Hugging Face directory fills the model rows of a padded run
//    (50304 rows) and zeros the pad; the run starts at the source's validation loss exactly;
//  - --resume with pad 128 is bit-identical to the uninterrupted run; a resume with another
//    pad_vocab_multiple (1 -> 128 and back) re-pads the checkpoint by name and continues the
//    same training.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/init_from.hpp"
#include "fsdp/checkpoint/merge.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/model.hpp"
#include "train_util.hpp"

namespace {

using namespace test_util;
using fsdp::DType;
using fsdp::ModelConfig;

// ---- one forward/backward on one rank ----

// Full tensors by name after one micro-batch: parameters (as initialised), gradients, and the
// specs (shapes, vocab_rows) of the model's declaration.
struct Pass {
  double loss = 0;
  std::map<std::string, std::vector<float>> params, grads;
  std::map<std::string, fsdp::ParamSpec> specs;
};

Pass forward_backward(const ModelConfig& mc, const fsdp::data::Batch& batch, DType param_dtype) {
  auto be = fsdp::make_cpu_backend(1);
  fsdp::MpiCommunicator comm(MPI_COMM_SELF);
  const fsdp::DeviceMesh mesh = fsdp::DeviceMesh::create(comm, 0);
  const fsdp::ModelFamily& family = fsdp::model_family(mc.type);
  fsdp::MixedPrecisionConfig mp;
  mp.param_dtype = param_dtype;
  auto model = family.create(mc, *be, mp.param_dtype, false);
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = family.wrap_classes();
  fsdp::FsdpEngine engine(model->modules(), fc, mp, mesh, *be, 42);
  fsdp::DeviceBuffer loss(*be, DType::f64, 1, fsdp::MemCategory::other);
  be->fill_zero(loss.view());
  engine.zero_grad();
  engine.begin_step(true);
  model->forward_backward(batch, 1.f / static_cast<float>(batch.num_targets()), engine, loss.view());
  engine.end_step();
  Pass p;
  be->copy_to_host(&p.loss, loss.view());
  for (int u = 0; u < engine.num_units(); ++u) {
    const float* w = engine.shard_param(u).f32();
    const float* g = engine.shard_grad(u).f32();
    for (const auto& e : engine.layout(u).entries) {
      p.params[e.spec.name].assign(w + e.offset, w + e.offset + e.spec.numel());
      p.grads[e.spec.name].assign(g + e.offset, g + e.offset + e.spec.numel());
      p.specs[e.spec.name] = e.spec;
    }
  }
  return p;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(float)) == 0;
}

// Relative L2 difference of a[0, n) and b[0, n).
double rel(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double x = a[static_cast<std::size_t>(k)], y = b[static_cast<std::size_t>(k)];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// The padded pass against the unpadded one. Exactly: the initial parameters of the model's
// own rows, 0 in the pad rows' initial values and gradients, the shapes. Within `tol`
// (relative): the loss and the gradient of every tensor's own rows. Not bit for bit because
// the LM head's GEMM is not: OpenBLAS computes the last ~170 columns of an N = 1001 (or 50257)
// product with other kernels than the same columns of N = 1024 (50304), so the logits of the
// last vocabulary ids differ in the last bit (the cross-entropy kernel alone is exact on
// padded rows: tests/test_kernels.cpp CrossEntropyPaddedRowStrideEqualsUnpadded).
void expect_same_model(const Pass& padded, const Pass& plain, int64_t vocab, int64_t padded_rows,
                       double tol, const std::string& what) {
  EXPECT_NEAR(padded.loss, plain.loss, tol * std::abs(plain.loss)) << what;
  ASSERT_EQ(padded.specs.size(), plain.specs.size()) << what;
  int vocab_tensors = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, spec] : padded.specs) {
    const fsdp::ParamSpec& ref = plain.specs.at(name);
    const std::vector<float>& w = padded.params.at(name);
    const std::vector<float>& g = padded.grads.at(name);
    ASSERT_EQ(spec.unpadded_shape(), ref.shape) << what << " " << name;
    const int64_t own = ref.numel();
    if (spec.vocab_rows > 0) {
      ++vocab_tensors;
      EXPECT_EQ(spec.vocab_rows, vocab) << what << " " << name;
      EXPECT_EQ(spec.shape[0], padded_rows) << what << " " << name;
      EXPECT_EQ(ref.vocab_rows, vocab) << what << " " << name;
      EXPECT_EQ(ref.shape[0], vocab) << what << " " << name;
      for (int64_t k = own; k < spec.numel(); ++k) {
        ASSERT_EQ(w[static_cast<std::size_t>(k)], 0.0f) << what << " " << name << " init pad element " << k;
        ASSERT_EQ(g[static_cast<std::size_t>(k)], 0.0f) << what << " " << name << " grad pad element " << k;
      }
    } else {
      EXPECT_EQ(spec.shape, ref.shape) << what << " " << name;
    }
    EXPECT_TRUE(same_bits(w.data(), plain.params.at(name).data(), own)) << what << " " << name << " init";
    const double d = rel(g, plain.grads.at(name), own);
    EXPECT_LE(d, tol) << what << " " << name << " grad";
    if (d > worst) {
      worst = d;
      worst_name = name;
    }
    double norm = 0;
    for (int64_t k = 0; k < own; ++k) norm += std::abs(g[static_cast<std::size_t>(k)]);
    EXPECT_GT(norm, 0.0) << what << " " << name << ": a gradient that vanished checks nothing";
  }
  EXPECT_GE(vocab_tensors, 1) << what;
  std::printf("[%s] loss %.17g vs %.17g (rel %.3g); largest gradient difference %.3g (%s)\n",
              what.c_str(), padded.loss, plain.loss, std::abs(padded.loss - plain.loss) / std::abs(plain.loss),
              worst, worst_name.c_str());
}

ModelConfig gpt2(int64_t vocab, int64_t layers, int64_t width) {
  ModelConfig c = fsdp::model_defaults("gpt2");
  c.set("n_layer", layers);
  c.set("n_head", int64_t{2});
  c.set("n_embd", width);
  c.set("n_positions", int64_t{16});
  c.set("vocab_size", vocab);
  return c;
}

// A causal-LM batch [2, 8] with ids across the whole vocabulary (the last id included) and
// one ignored target.
fsdp::data::Batch lm_batch(int64_t vocab) {
  fsdp::data::Batch b;
  b.B = 2;
  b.L = b.target_len = 8;
  std::mt19937 gen(5);
  for (int64_t i = 0; i < b.B * b.L; ++i) {
    b.inputs.push_back(static_cast<int32_t>(gen() % static_cast<uint32_t>(vocab)));
    b.targets.push_back(static_cast<int32_t>(gen() % static_cast<uint32_t>(vocab)));
  }
  b.inputs[3] = b.targets[4] = static_cast<int32_t>(vocab - 1);
  b.targets[9] = fsdp::kIgnoreIndex;
  return b;
}

TEST(VocabPad, Gpt2LossAndGradientsEqualTheUnpaddedModel) {
  struct Case {
    int64_t vocab, layers, width, padded;
  };
  for (const Case& k : {Case{1001, 2, 16, 1024}, Case{50257, 1, 32, 50304}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const std::string what = "vocab " + std::to_string(k.vocab) + " " + std::string(fsdp::to_string(dt));
      ModelConfig padded = gpt2(k.vocab, k.layers, k.width), plain = padded;
      ASSERT_EQ(padded.pad_vocab_multiple, 128);  // the default
      plain.pad_vocab_multiple = 1;
      const fsdp::data::Batch batch = lm_batch(k.vocab);
      expect_same_model(forward_backward(padded, batch, dt), forward_backward(plain, batch, dt), k.vocab,
                        k.padded, dt == DType::f32 ? 2e-6 : 1e-2, what);
    }
  }
}

// A seq2seq batch as tests/test_t5.cpp's: padded encoder rows, ignored label tails, the last
// id of the vocabulary among the labels.
fsdp::data::Batch t5_batch(int64_t vocab) {
  fsdp::data::Batch b;
  b.B = 2;
  b.L = 6;
  b.target_len = 5;
  std::mt19937 gen(3);
  auto tok = [&] { return static_cast<int32_t>(3 + gen() % static_cast<uint32_t>(vocab - 3)); };
  const int64_t in_len[2] = {6, 4}, tgt_len[2] = {5, 3};
  for (int64_t r = 0; r < b.B; ++r) {
    for (int64_t t = 0; t < b.L; ++t) b.inputs.push_back(t < in_len[r] ? tok() : 0);
    for (int64_t t = 0; t < b.target_len; ++t) {
      b.targets.push_back(t + 1 < tgt_len[r] ? tok() : (t + 1 == tgt_len[r] ? 1 : -100));
    }
  }
  b.targets[0] = static_cast<int32_t>(vocab - 1);
  return b;
}

TEST(VocabPad, T5LossAndGradientsEqualTheUnpaddedModel) {
  for (const char* ff : {"relu", "gated-gelu"}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const bool tied = std::string(ff) == "relu";
      const std::string what = std::string(ff) + (tied ? " tied " : " untied ") + std::string(fsdp::to_string(dt));
      ModelConfig padded = fsdp::model_defaults("t5");
      padded.set("d_model", int64_t{16});
      padded.set("d_kv", int64_t{4});
      padded.set("d_ff", int64_t{24});
      padded.set("num_heads", int64_t{2});
      padded.set("vocab_size", int64_t{300});
      padded.set("feed_forward_proj", std::string(ff));
      padded.set("tie_word_embeddings", tied);
      ModelConfig plain = padded;
      plain.pad_vocab_multiple = 1;
      const fsdp::data::Batch batch = t5_batch(300);
      expect_same_model(forward_backward(padded, batch, dt), forward_backward(plain, batch, dt), 300, 384,
                        dt == DType::f32 ? 2e-6 : 1e-2, what);
    }
  }
}

// ---- training, merge, init_from, resume (the trainer, on every rank of the test) ----

// GPT-2 with an odd vocabulary on synthetic tokens; checkpoints every 2 steps.
Config lm_config(const std::string& run_dir, int64_t vocab, int64_t pad) {
  Config c = fsdp::parse_config(R"(
[model]
n_layer = 2
n_head = 2
n_embd = 16
n_positions = 16
[data]
source = "synthetic"
seq_len = 12
[train]
global_batch_size = 8
max_steps = 4
seed = 7
[optim]
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
weight_decay = 0.1
grad_clip = 1.0
[checkpoint]
every = 2
[eval]
every = 2
max_windows = 4
)", "test_vocab_pad", {});
  c.model.set("vocab_size", vocab);
  c.model.pad_vocab_multiple = pad;
  c.train.run_dir = run_dir;
  return c;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The model's own rows of every parameter of `r` (vocabulary tensors cut to `vocab` rows of
// `width`), and a check that their pad rows are 0.
std::map<std::string, std::vector<float>> own_rows(const TrainResult& r, int64_t vocab, int64_t width,
                                                   const std::string& what) {
  std::map<std::string, std::vector<float>> out = r.params;
  std::vector<float>& wte = out.at("wte.weight");
  for (std::size_t k = static_cast<std::size_t>(vocab * width); k < wte.size(); ++k) {
    EXPECT_EQ(wte[k], 0.0f) << what << ": wte pad element " << k;
  }
  wte.resize(static_cast<std::size_t>(vocab * width));
  return out;
}

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

// fsdp_merge of run_dir's step `step` into out, from the fixed path `staging` (the merged
// safetensors metadata names its source directory).
void merge_from(const std::string& run_dir, int64_t step, const std::string& staging, const std::string& out) {
  if (world_rank() == 0) {
    fs::remove_all(staging);
    fs::copy(fsdp::ckpt::step_dir(run_dir, step), staging, fs::copy_options::recursive);
    fsdp::ckpt::merge_to_hf(staging, out);
  }
  barrier();
}

// Every parameter's own rows within `tol` (relative L2 over all of them and per tensor;
// c_attn.bias without its key third, whose AdamW updates are normalised rounding noise).
void expect_params_close(const std::map<std::string, std::vector<float>>& got,
                         const std::map<std::string, std::vector<float>>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<float> all_got, all_want;
  for (const auto& [name, values] : want) {
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), values.size()) << what << " " << name;
    all_got.insert(all_got.end(), g.begin(), g.end());
    all_want.insert(all_want.end(), values.begin(), values.end());
    if (name.find("attn.c_attn.bias") != std::string::npos) {
      // [q | k | v] biases: the key third's gradient is exactly zero in exact arithmetic
      // (softmax is invariant to a shift shared by a row's scores), so AdamW turns rounding
      // noise into its updates; its noise depends on the summation order (blocked attention,
      // GEMM kernels picked by shape) and is left out. The q and v thirds are checked.
      const std::size_t c = values.size() / 3;
      for (std::size_t part : {std::size_t{0}, std::size_t{2}}) {
        const std::vector<float> gp(g.begin() + part * c, g.begin() + (part + 1) * c);
        const std::vector<float> wp(values.begin() + part * c, values.begin() + (part + 1) * c);
        EXPECT_LE(rel_diff(gp, wp), tol) << what << " " << name << (part ? " (v)" : " (q)");
      }
      continue;
    }
    EXPECT_LE(rel_diff(g, values), tol) << what << " " << name;
  }
  EXPECT_LE(rel_diff(all_got, all_want), tol) << what;
}

TEST(VocabPad, TrainingAndMergeEqualTheUnpaddedRun) {
  // bf16 mixed precision (where the padding matters: tensor-core GEMMs): the padded and the
  // unpadded run are the same training bit for bit on this CPU backend (the logits rounded to
  // bf16 hide the last-bit differences of OpenBLAS's fp32 tail columns), so their merges are
  // byte-identical. fp32: the same training within rounding (1e-9 on the losses).
  const int64_t V = 1001;
  std::string padded_dir;
  for (DType dt : {DType::bf16, DType::f32}) {
    const std::string what(fsdp::to_string(dt));
    const std::string dir1 = fresh_dir("pad1_" + what), dir128 = fresh_dir("pad128_" + what);
    padded_dir = dir128;
    Config c1 = lm_config(dir1, V, 1), c128 = lm_config(dir128, V, 128);
    c1.mixed_precision.param_dtype = c128.mixed_precision.param_dtype = dt;
    const TrainResult plain = run(c1, On::world);
    const TrainResult padded = run(c128, On::world);
    ASSERT_EQ(padded.losses.size(), 4u) << what;
    ASSERT_EQ(padded.val_losses.size(), 2u) << what;
    ASSERT_EQ(padded.params.at("wte.weight").size(), static_cast<std::size_t>(1024 * 16)) << what;
    ASSERT_EQ(plain.params.at("wte.weight").size(), static_cast<std::size_t>(V * 16)) << what;
    const auto own = own_rows(padded, V, 16, what);  // checks the pad rows stayed 0
    const std::string staging = fresh_dir("merge_staging") + "/step_00000004";
    const std::string out1 = fresh_dir("merged_pad1_" + what), out128 = fresh_dir("merged_pad128_" + what);
    merge_from(dir1, 4, staging, out1);
    merge_from(dir128, 4, staging, out128);
    if (world_rank() == 0) {  // the merge has the model's vocabulary, config.json is the same
      const fsdp::safetensors::SafetensorsFile f(out128 + "/model.safetensors");
      EXPECT_EQ(f.entry("transformer.wte.weight").shape, (std::vector<int64_t>{V, 16})) << what;
      EXPECT_EQ(f.read_f32("transformer.wte.weight"), own.at("wte.weight")) << what;
      EXPECT_EQ(file_bytes(out1 + "/config.json"), file_bytes(out128 + "/config.json")) << what;
    }
    if (dt == DType::bf16) {
      EXPECT_EQ(padded.losses, plain.losses);
      EXPECT_EQ(padded.val_losses, plain.val_losses);
      EXPECT_TRUE(own == plain.params);
      if (world_rank() == 0) {
        const std::string st1 = file_bytes(out1 + "/model.safetensors");
        EXPECT_GT(st1.size(), static_cast<std::size_t>(4 * V * 16));
        EXPECT_TRUE(st1 == file_bytes(out128 + "/model.safetensors")) << "merged files differ";
      }
    } else {
      for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(padded.losses[i], plain.losses[i], 1e-9 * plain.losses[i]);
      expect_params_close(own, plain.params, 1e-5, what);
    }
  }
  // The checkpoint records the padding: model_config carries pad_vocab_multiple and
  // vocab_size, the layout the padded shape.
  const auto set = fsdp::ckpt::CheckpointSet::open(fsdp::ckpt::step_dir(padded_dir, 4));
  EXPECT_NE(set.meta().model_config_json.find("\"pad_vocab_multiple\":128"), std::string::npos)
      << set.meta().model_config_json;
  EXPECT_NE(set.meta().model_config_json.find("\"vocab_size\":1001"), std::string::npos);
  EXPECT_EQ(set.layouts()[0].entries[0].spec.shape, (std::vector<int64_t>{1024, 16}));
}

TEST(VocabPad, InitFromAVocab50257DirectoryFillsTheModelRowsAndZerosThePad) {
  // GPT-2's vocabulary on a 1-layer width-32 model: a padded run (wte [50304, 32]) is merged
  // (wte [50257, 32] in model.safetensors) and loaded back into a padded run.
  const int64_t V = 50257, W = 32;
  auto config = [&](const std::string& dir) {
    Config c = lm_config(dir, V, 128);
    c.model.set("n_layer", int64_t{1});
    c.model.set("n_embd", W);
    c.train.max_steps = 2;
    c.checkpoint.every = 0;
    c.data.seq_len = 8;
    return c;
  };
  const std::string src_dir = fresh_dir("init_src");
  const TrainResult src = run(config(src_dir), On::world);
  const auto want = own_rows(src, V, W, "source");
  const std::string hf = fresh_dir("init_hf");
  if (world_rank() == 0) fsdp::ckpt::merge_to_hf(fsdp::ckpt::step_dir(src_dir, 2), hf);
  barrier();
  if (world_rank() == 0) {
    const fsdp::safetensors::SafetensorsFile f(hf + "/model.safetensors");
    EXPECT_EQ(f.entry("transformer.wte.weight").shape, (std::vector<int64_t>{V, W}));
  }

  // This rank's shards of a padded run, loaded from the merge: -7 everywhere first, so every
  // element must be written.
  Config dst = config(fresh_dir("init_dst"));
  const auto& family = fsdp::model_family("gpt2");
  const auto layouts = fsdp::build_unit_layouts(
      family.modules(dst.model), dst.fsdp, fsdp::shards_for(dst.fsdp.sharding_strategy, world_size(), world_size()));
  std::vector<std::vector<float>> shards;
  std::vector<float*> ptrs;
  for (const auto& l : layouts) shards.emplace_back(static_cast<std::size_t>(l.shard_numel), -7.0f);
  for (auto& s : shards) ptrs.push_back(s.data());
  const fsdp::ckpt::InitFromResult r = fsdp::ckpt::load_hf_shards(hf, dst.model, layouts, world_rank(), ptrs);
  int64_t owned = 0, pad = 0;  // model elements / pad-row elements in this rank's shards
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const auto& l = layouts[u];
    const int64_t sb = l.shard_begin(world_rank()), se = l.shard_end(world_rank());
    for (const auto& e : l.entries) {
      const std::vector<float>& w = want.at(e.spec.name);
      ASSERT_EQ(static_cast<int64_t>(w.size()), e.spec.unpadded_numel()) << e.spec.name;
      for (int64_t k = std::max<int64_t>(0, sb - e.offset); k < std::min(e.spec.numel(), se - e.offset); ++k) {
        const float got = shards[u][static_cast<std::size_t>(e.offset + k - sb)];
        if (k < e.spec.unpadded_numel()) {
          ++owned;
          ASSERT_EQ(got, w[static_cast<std::size_t>(k)]) << e.spec.name << " element " << k;
        } else {
          ++pad;
          ASSERT_EQ(got, 0.0f) << e.spec.name << " pad element " << k;
        }
      }
    }
  }
  // wte's 47 pad rows lie at the end of its tensor, in the last rank's shard of the root unit.
  if (world_rank() == world_size() - 1) EXPECT_EQ(pad, 47 * W);
  EXPECT_EQ(static_cast<int64_t>(r.bytes_read), 4 * owned);  // nothing read for the pad
  int64_t model_numel = 0;
  for (const auto& [name, v] : want) model_numel += static_cast<int64_t>(v.size());
  EXPECT_EQ(r.model_bytes, 4 * model_numel);

  // A padded run from the merge starts at the source's final validation loss, exactly.
  dst.model.init_from = hf;
  dst.eval.on_start = true;
  dst.train.max_steps = 1;
  const TrainResult started = run(dst, On::world);
  ASSERT_FALSE(src.val_losses.empty());
  ASSERT_FALSE(started.val_losses.empty());
  EXPECT_EQ(started.val_losses.front().first, 0);
  EXPECT_EQ(started.val_losses.front().second, src.val_losses.back().second);
}

TEST(VocabPad, ResumeIsBitIdenticalAndMayChangeThePadding) {
  const int64_t V = 1001;
  const TrainResult whole = run(lm_config(fresh_dir("resume_whole"), V, 128), On::world);
  // Stopped after step 2 (checkpoint), resumed to step 4: the same run, bit for bit.
  const std::string dir = fresh_dir("resume_split");
  run(lm_config(dir, V, 128), On::world, /*stop_after=*/2);
  const TrainResult resumed = run(lm_config(dir, V, 128), On::world, 0, /*resume=*/true);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 2, whole.losses.end()));
  EXPECT_TRUE(resumed.params == whole.params);

  // pad_vocab_multiple may change on resume: the checkpoint is re-padded by name (the model
  // rows read, the pad rows 0) and training continues as the run that saved it would (within
  // fp32 rounding: the LM head's GEMM shape changed).
  const auto want = own_rows(whole, V, 16, "whole");
  for (auto [from, to] : {std::pair<int64_t, int64_t>{1, 128}, {128, 1}, {128, 64}}) {
    const std::string what = "pad " + std::to_string(from) + " -> " + std::to_string(to);
    const std::string d = fresh_dir("repad_" + std::to_string(from) + "_" + std::to_string(to));
    run(lm_config(d, V, from), On::world, /*stop_after=*/2);
    const TrainResult r = run(lm_config(d, V, to), On::world, 0, /*resume=*/true);
    ASSERT_EQ(r.losses.size(), 2u) << what;
    for (std::size_t i = 0; i < 2; ++i) EXPECT_NEAR(r.losses[i], whole.losses[i + 2], 1e-9 * whole.losses[i + 2]) << what;
    EXPECT_EQ(r.params.at("wte.weight").size(), static_cast<std::size_t>(fsdp::padded_vocab_size(V, to) * 16))
        << what;
    expect_params_close(own_rows(r, V, 16, what), want, 1e-5, what);
  }
}

}  // namespace
