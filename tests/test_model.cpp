// GPT-2 model tests: logits, loss and every gradient against a stored PyTorch reference
// (tools/gpt2_reference.py, tests/data/gpt2/), finite-difference check of the whole model's
// backward (every parameter tensor: embeddings, each block's LayerNorms, c_attn, c_proj, c_fc, mlp c_proj and
// their biases, ln_f, and the tied LM head through wte), GPT-2 initialisation statistics,
// the independence of initial weights from the world size, and activation checkpointing
// (bit-identical losses and gradients, and its activation memory: planned == measured).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/gpt2.hpp"
#include "fsdp/model/model.hpp"
#include "model_fixture.hpp"
#include "reference_file.hpp"

namespace {

fsdp::Gpt2Config tiny_model() {
  fsdp::Gpt2Config m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 8;
  m.n_positions = 8;
  m.vocab_size = 11;
  return m;
}

// GPT-2's default wrap policy: every GPT2Block its own FSDP unit.
fsdp::FsdpConfig gpt2_wrap() {
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
  return fc;
}

// Model options of a Fixture: the tiny model by default (model_fixture.hpp).
struct ModelOptions : test_util::CausalLmOptions<fsdp::Gpt2Config> {
  ModelOptions() { model = tiny_model(); }
};

// The tiny GPT-2 under its engine with a 2 x 6 batch (model_fixture.hpp).
struct Fixture : test_util::CausalLmFixture<fsdp::Gpt2Model, fsdp::Gpt2Config> {
  static constexpr int64_t kB = 2, kT = 6;
  explicit Fixture(const fsdp::FsdpConfig& fc = gpt2_wrap(), const ModelOptions& o = {})
      : CausalLmFixture(o, fc) {}
};

TEST(Gpt2, FiniteDifferenceGradientOfEveryParameter) {
  Fixture f;
  // Make every parameter non-trivial (LN weights != 1, biases != 0) so no term vanishes.
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      for (int64_t i = 0; i < e.spec.numel(); ++i) p[e.offset + i] += nd(gen);
    }
  }
  f.loss_and_grads();
  int checked = 0;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    const float* g = f.engine.shard_grad(u).f32();
    const std::vector<float> grad(g, g + f.engine.shard_numel(u));
    for (const auto& e : f.engine.layout(u).entries) {
      // Directional derivative along a random direction d over this tensor:
      // (L(p + h d) - L(p - h d)) / 2h  vs  <grad, d>.
      const int64_t n = e.spec.numel();
      std::vector<float> d(n);
      for (auto& x : d) x = nd(gen);
      double analytic = 0, norm_g = 0;
      for (int64_t i = 0; i < n; ++i) {
        analytic += static_cast<double>(grad[e.offset + i]) * d[i];
        norm_g += static_cast<double>(grad[e.offset + i]) * grad[e.offset + i];
      }
      const float h = 1e-2f;
      std::vector<float> saved(p + e.offset, p + e.offset + n);
      for (int64_t i = 0; i < n; ++i) p[e.offset + i] = saved[i] + h * d[i];
      const double lp = f.loss();
      for (int64_t i = 0; i < n; ++i) p[e.offset + i] = saved[i] - h * d[i];
      const double lm = f.loss();
      std::copy(saved.begin(), saved.end(), p + e.offset);
      const double numeric = (lp - lm) / (2 * h);
      // Scale of the check: |grad| * |d|, so tensors with small gradients are not excused.
      double norm_d = 0;
      for (float x : d) norm_d += static_cast<double>(x) * x;
      const double scale = std::sqrt(norm_g * norm_d);
      EXPECT_GT(scale, 1e-6) << e.spec.name << ": gradient vanished";
      EXPECT_NEAR(analytic, numeric, 2e-3 * scale + 1e-6) << e.spec.name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 + 12 * 2 + 2);
}

// tools/gpt2_reference.py's float64 torch GPT-2 (HF GPT2LMHeadModel's forward on HF's state
// dict: Conv1D weights [in, out]) on the same float32 weights and batch, against our fp32 CPU
// model: the logits, the mean loss and every parameter's gradient. The HF names and layouts
// are mapped by the family's hf_tensor (the mapping fsdp_merge writes with), and the model is
// built from the fixture's HF config.json (from_hf_config, init_from's path). wte is padded to
// 128 rows (model.pad_vocab_multiple): its pad rows stay 0, the logits' pad columns are not
// compared, and the pad rows' gradients must be exactly 0.
void check_reference(const std::string& file) {
  test_util::ReferenceFile ref;
  test_util::read_reference(std::string(FSDP_TEST_DATA_DIR) + "/gpt2/" + file,
                            "tools/gpt2_reference.py", &ref);
  if (testing::Test::HasFatalFailure()) return;
  const std::string& config_json = ref.config_json;
  const auto batch = ref.as<int64_t>("batch");
  ASSERT_EQ(batch.size(), 2u) << file << ": batch B T";
  const int64_t B = batch[0], T = batch[1];
  const std::vector<int32_t> tokens = ref.as<int32_t>("tokens"), targets = ref.as<int32_t>("targets");
  const double ref_loss = ref.scalar("loss");
  const std::vector<double> ref_logits = ref.as<double>("logits");
  const auto& params = ref.params;
  const auto& grads = ref.grads;
  const fsdp::ModelFamily& family = fsdp::model_family("gpt2");
  const fsdp::ModelConfig mc = family.from_hf_config(nlohmann::json::parse(config_json), file);
  ModelOptions o;
  o.model = fsdp::Gpt2Config::from(mc);
  ASSERT_EQ(B, Fixture::kB) << file;
  ASSERT_EQ(T, Fixture::kT) << file;
  Fixture f(gpt2_wrap(), o);
  f.tokens = tokens;
  f.targets = targets;
  const int64_t V = o.model.vocab_size, Vp = o.model.padded_vocab();
  ASSERT_GT(Vp, V) << "the fixture should exercise the vocabulary padding";

  // HF tensor `name` (row-major, HF layout) element of our element i of a [rows, cols] tensor.
  auto hf_index = [](const fsdp::HfTensor& hf, int64_t i, int64_t rows, int64_t cols) {
    return hf.transpose ? (i % cols) * rows + i / cols : i;  // ours [out, in] <- HF [in, out]
  };
  int set = 0;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      const auto shape = e.spec.unpadded_shape();
      const auto hf = family.hf_tensor(mc, e.spec.name, shape);
      ASSERT_TRUE(hf) << e.spec.name << ": no Hugging Face name";
      ASSERT_TRUE(params.count(hf->name)) << file << ": no " << hf->name;
      const auto& v = params.at(hf->name);
      const int64_t n = e.spec.unpadded_numel();
      ASSERT_EQ(static_cast<int64_t>(v.size()), n) << hf->name;
      const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
      for (int64_t i = 0; i < n; ++i) p[e.offset + i] = v[static_cast<std::size_t>(hf_index(*hf, i, rows, cols))];
      for (int64_t i = n; i < e.spec.numel(); ++i) ASSERT_EQ(p[e.offset + i], 0.f) << e.spec.name;
      ++set;
    }
  }
  EXPECT_EQ(set, static_cast<int>(params.size())) << file << ": parameters the model does not declare";

  // Logits and loss (forward_loss), then the loss and gradients (forward_backward).
  EXPECT_NEAR(f.loss(), ref_loss, 1e-5 * std::abs(ref_loss)) << file;
  const fsdp::TensorView lv = f.model.last_logits();
  ASSERT_EQ(lv.numel(), B * T * Vp);
  std::vector<float> logits(static_cast<std::size_t>(lv.numel()));
  f.be->copy_to_host(logits.data(), lv);
  ASSERT_EQ(static_cast<int64_t>(ref_logits.size()), B * T * V);
  double diff = 0, norm = 0;
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t c = 0; c < V; ++c) {
      const double ref = ref_logits[static_cast<std::size_t>(r * V + c)];
      const double d = logits[static_cast<std::size_t>(r * Vp + c)] - ref;
      diff += d * d;
      norm += ref * ref;
    }
  }
  EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << file << ": logits";
  EXPECT_NEAR(f.loss_and_grads(), ref_loss, 1e-5 * std::abs(ref_loss)) << file;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* g = f.engine.shard_grad(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      const auto shape = e.spec.unpadded_shape();
      const auto hf = family.hf_tensor(mc, e.spec.name, shape);
      const auto& r = grads.at(hf->name);
      const int64_t n = e.spec.unpadded_numel();
      const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
      double gd = 0, gn = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double ref = r[static_cast<std::size_t>(hf_index(*hf, i, rows, cols))];
        const double d = g[e.offset + i] - ref;
        gd += d * d;
        gn += ref * ref;
      }
      for (int64_t i = n; i < e.spec.numel(); ++i) {
        ASSERT_EQ(g[e.offset + i], 0.f) << file << ": " << e.spec.name << " pad element " << i;
      }
      EXPECT_GT(gn, 0.0) << file << ": " << e.spec.name;
      EXPECT_LE(std::sqrt(gd), 1e-5 * std::sqrt(gn)) << file << ": " << e.spec.name;
    }
  }
}

TEST(Gpt2, MatchesTorchReferenceOneLayer) { check_reference("reference_1_layer.txt"); }
TEST(Gpt2, MatchesTorchReferenceThreeLayers) { check_reference("reference_3_layers.txt"); }

TEST(Gpt2, InitialisationFollowsGpt2) {
  fsdp::FsdpConfig fc = gpt2_wrap();
  fc.auto_wrap_policy = fsdp::AutoWrapPolicy::NO_WRAP;
  Fixture f(fc);
  auto params = f.engine.gather_full_params();
  auto stdev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) { s += x; s2 += static_cast<double>(x) * x; }
    const double m = s / v.size();
    return std::sqrt(s2 / v.size() - m * m);
  };
  // wte [128, 8]: vocabulary 11 padded to model.pad_vocab_multiple's 128 rows; the model's
  // 11 rows are N(0, 0.02), the pad rows 0.
  std::vector<float> wte = params.at("wte.weight");
  ASSERT_EQ(wte.size(), 128u * 8u);
  for (std::size_t k = 11 * 8; k < wte.size(); ++k) ASSERT_EQ(wte[k], 0.f) << "pad element " << k;
  wte.resize(11 * 8);
  EXPECT_NEAR(stdev(wte), 0.02, 0.004);
  EXPECT_NEAR(stdev(params.at("h.0.mlp.c_fc.weight")), 0.02, 0.004);
  EXPECT_NEAR(stdev(params.at("h.1.mlp.c_proj.weight")), 0.02 / std::sqrt(4.0), 0.003);
  for (float x : params.at("h.0.ln_1.weight")) EXPECT_EQ(x, 1.f);
  for (float x : params.at("h.0.attn.c_attn.bias")) EXPECT_EQ(x, 0.f);
}

TEST(Gpt2, InitialWeightsDoNotDependOnTheWorldSize) {
  // FULL_SHARD over the world: each rank generates only its shard; gathered, they must equal
  // the 1-rank initialisation exactly.
  Fixture single;
  const auto ref = single.engine.gather_full_params();
  auto be = fsdp::make_cpu_backend(1);
  fsdp::MpiCommunicator world(MPI_COMM_WORLD);
  auto mesh = fsdp::DeviceMesh::create(world, 0);
  fsdp::Gpt2Model model(tiny_model(), *be);
  fsdp::FsdpEngine sharded(model.modules(), gpt2_wrap(), fsdp::MixedPrecisionConfig{},
                           mesh, *be, 42);
  EXPECT_EQ(sharded.gather_full_params(), ref);
}

// Every element of this rank's fp32 parameter shards += N(0, 0.3), deterministic in the rank:
// LN weights != 1 and biases != 0, so no gradient term vanishes. Two fixtures over the same
// communicator perturbed alike hold the same parameters.
void perturb_shards(Fixture& f) {
  std::mt19937 gen(7 + static_cast<unsigned>(f.comm.rank()));
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (int64_t i = 0; i < f.engine.shard_numel(u); ++i) p[i] += nd(gen);
  }
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(Gpt2, ActivationCheckpointingIsBitIdentical) {
  // Same kernels on the same inputs: with checkpointing, the loss, the eval loss and every
  // gradient shard equal those without, bit for bit; fp32 and bf16 activations (param_dtype),
  // on one rank and FULL_SHARD over the world (parameters re-gathered for backward); every
  // block recomputing, and only the first 1 or 2 of 3 (fsdp.recompute_num_layers: those and
  // the block after them share one buffer set, a later block keeps its own).
  fsdp::Gpt2Config mc = tiny_model();
  mc.n_layer = 3;
  for (auto dtype : {fsdp::DType::f32, fsdp::DType::bf16})
  for (MPI_Comm comm : {MPI_COMM_SELF, MPI_COMM_WORLD})
  for (int64_t first : {int64_t{-1}, int64_t{1}, int64_t{2}}) {
    const std::string what = std::string(fsdp::to_string(dtype)) +
                             (comm == MPI_COMM_SELF ? " one rank" : " world") +
                             " recompute_num_layers " + std::to_string(first);
    ModelOptions o;
    o.model = mc;
    o.mp.param_dtype = dtype;
    o.comm = comm;
    Fixture off({}, o);
    o.activation_checkpointing = first < 0 ? fsdp::ActivationCheckpointing(true)
                                           : fsdp::ActivationCheckpointing::first_blocks(first);
    Fixture on({}, o);
    perturb_shards(off);
    perturb_shards(on);
    for (int step = 0; step < 2; ++step) {  // the second step reuses the buffers
      const double loss_off = off.loss_and_grads(), loss_on = on.loss_and_grads();
      EXPECT_TRUE(std::isfinite(loss_off)) << what;
      EXPECT_TRUE(same_bits(loss_off, loss_on)) << what << ": " << loss_off << " vs " << loss_on;
      ASSERT_EQ(off.engine.num_units(), on.engine.num_units());
      double grad_norm2 = 0;
      for (int u = 0; u < off.engine.num_units(); ++u) {
        const int64_t n = off.engine.shard_numel(u);
        ASSERT_EQ(n, on.engine.shard_numel(u));
        const float* g_off = off.engine.shard_grad(u).f32();
        const float* g_on = on.engine.shard_grad(u).f32();
        EXPECT_EQ(std::memcmp(g_off, g_on, static_cast<std::size_t>(n) * sizeof(float)), 0)
            << what << ": unit " << u << " step " << step;
        for (int64_t i = 0; i < n; ++i) grad_norm2 += static_cast<double>(g_off[i]) * g_off[i];
      }
      double total = grad_norm2;
      MPI_Allreduce(&grad_norm2, &total, 1, MPI_DOUBLE, MPI_SUM, comm);
      EXPECT_GT(total, 0.0) << what << ": gradients vanished";
      // Evaluation (forward only) runs the recomputing blocks through their shared set.
      EXPECT_TRUE(same_bits(off.loss(), on.loss())) << what;
    }
  }
}

// Document masking (data.attn_mask_type = "block_causal"): one row packing documents of 3
// and 5 tokens. With reset_position_ids (HF GPT2Model's position_ids restarting at each
// document) each document's logits, loss and gradients are those of the document run alone
// (logits and loss to rounding; gradients with grad_scale 1, summed over the documents).
// Without the reset the second document reads wpe at 3..7: its logits differ from its run
// alone while the first's still agree. The document buffers are in the plan.
TEST(Gpt2, DocumentMaskingEqualsEachDocumentAlone) {
  const std::vector<int64_t> lengths = {3, 5};
  const int64_t T = 8;
  for (bool reset : {true, false}) {
    const std::string what = reset ? "reset" : "row positions";
    ModelOptions o;
    o.B = 1;
    o.T = T;
    Fixture packed(gpt2_wrap(), o);
    perturb_shards(packed);
    const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4};
    packed.docs = {positions.data(), reset};
    const double packed_loss = packed.loss() * T;
    const int64_t Vp = packed.model.last_logits().shape[1];
    std::vector<float> logits(static_cast<std::size_t>(T * Vp));
    packed.be->copy_to_host(logits.data(), packed.model.last_logits());
    packed.loss_and_grads(1.f);
    EXPECT_EQ(static_cast<int64_t>(packed.be->memory().peak(fsdp::MemCategory::activations)),
              fsdp::Gpt2Model::activation_bytes(o.model, 1, T, fsdp::DType::f32, {},
                                                {true, reset}))
        << what;
    double doc_loss = 0;
    test_util::UnitGrads grads;
    int64_t t0 = 0;
    for (int64_t n : lengths) {
      o.T = n;
      Fixture alone(gpt2_wrap(), o);
      perturb_shards(alone);
      alone.tokens.assign(packed.tokens.begin() + t0, packed.tokens.begin() + t0 + n);
      alone.targets.assign(packed.targets.begin() + t0, packed.targets.begin() + t0 + n);
      doc_loss += alone.loss() * n;
      std::vector<float> l1(static_cast<std::size_t>(n * Vp));
      alone.be->copy_to_host(l1.data(), alone.model.last_logits());
      double worst = 0;
      for (int64_t i = 0; i < n * Vp; ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(
                                    logits[static_cast<std::size_t>(t0 * Vp + i)] -
                                    l1[static_cast<std::size_t>(i)])));
      }
      if (reset || t0 == 0) {
        EXPECT_LE(worst, 2e-5) << what << ": the document at " << t0;
      } else {
        EXPECT_GT(worst, 1e-2) << what << ": the document at " << t0 << " reads other positions";
      }
      alone.loss_and_grads(1.f);
      test_util::add_grads(alone, grads);
      t0 += n;
    }
    if (!reset) continue;
    EXPECT_NEAR(packed_loss, doc_loss, 1e-5 * std::abs(doc_loss)) << what;
    test_util::expect_grads_near(packed, grads, 2e-5, what);
  }
}

TEST(Gpt2, ActivationBytesWithCheckpointingArePlannedAndMeasured) {
  const int64_t B = Fixture::kB, T = Fixture::kT;
  for (auto dtype : {fsdp::DType::f32, fsdp::DType::bf16}) {
    const std::string what(fsdp::to_string(dtype));
    int64_t prev_on = 0, prev_off = 0;
    for (int64_t L : {1, 2, 3, 4}) {
      fsdp::Gpt2Config mc = tiny_model();
      mc.n_layer = L;
      const int64_t off = fsdp::Gpt2Model::activation_bytes(mc, B, T, dtype, false);
      const int64_t on = fsdp::Gpt2Model::activation_bytes(mc, B, T, dtype, true);
      EXPECT_EQ(off, fsdp::Gpt2Model::activation_bytes(mc, B, T, dtype)) << "default is off";
      if (L >= 2) {
        // Without checkpointing one more block keeps its residual stream, qkv [3C], the
        // attention output, res2 and the MLP's pre-activation [4C] (10 C per row; not the two
        // LayerNorm outputs, recomputed in backward), its four LayerNorm statistics and the
        // attention's logsumexp [H per row] in fp32.
        EXPECT_EQ(off - prev_off,
                  B * T * 10 * mc.n_embd * static_cast<int64_t>(fsdp::dtype_size(dtype)) +
                      4 * (4 * B * T + B * mc.n_head * T))
            << what << " n_layer " << L;
        EXPECT_LT(on, off) << what << " n_layer " << L;
        // One more block costs one more saved residual stream [B*T, C], nothing else.
        EXPECT_EQ(on - prev_on,
                  B * T * mc.n_embd * static_cast<int64_t>(fsdp::dtype_size(dtype)))
            << what << " n_layer " << L;
      } else {
        EXPECT_EQ(on, off) << what << ": one block, one buffer set either way";
      }
      prev_on = on;
      prev_off = off;
      // Only the first k blocks recomputing (fsdp.recompute_num_layers): they and the block
      // after them share one set of internals and every later block keeps its own, so each
      // recomputing block saves one block's set, (off - on) / (L - 1), up to L - 1 of them.
      for (int64_t k = 0; k <= L; ++k) {
        const int64_t first = fsdp::Gpt2Model::activation_bytes(
            mc, B, T, dtype, fsdp::ActivationCheckpointing::first_blocks(k));
        EXPECT_EQ(first, off - (L > 1 ? std::min(k, L - 1) * (off - on) / (L - 1) : 0))
            << what << " n_layer " << L << " first " << k;
      }
      // The plan equals what a training micro-batch allocates: none, every block, the first 2.
      for (auto ckpt : {fsdp::ActivationCheckpointing(false), fsdp::ActivationCheckpointing(true),
                        fsdp::ActivationCheckpointing::first_blocks(2)}) {
        ModelOptions o;
        o.model = mc;
        o.mp.param_dtype = dtype;
        o.activation_checkpointing = ckpt;
        Fixture f({}, o);
        f.loss_and_grads();
        EXPECT_EQ(static_cast<int64_t>(f.be->memory().peak(fsdp::MemCategory::activations)),
                  fsdp::Gpt2Model::activation_bytes(mc, B, T, dtype, ckpt))
            << what << " n_layer " << L << " recomputed " << ckpt.recomputed(L);
      }
    }
  }
}

}  // namespace
