// T5 model tests (CPU backend): HF's relative position buckets against a torch fixture, the
// finite-difference gradient of every parameter tensor (relu / gated-gelu, tied / untied),
// padding invariance, activation checkpointing (bit-identical, and its activation memory:
// planned == measured), HF initialisation statistics, module/parameter names, the HF
// config.json round trip, and loss and gradients against tools/t5_reference.py's torch T5.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
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
#include "fsdp/model/t5.hpp"
#include "reference_file.hpp"

namespace {

using fsdp::T5Config;
using fsdp::T5FeedForward;

// A tiny T5: two blocks per stack, so block 1 reuses block 0's position bias.
T5Config tiny(T5FeedForward ff = T5FeedForward::relu, bool tied = true) {
  T5Config c;
  c.d_model = 8;
  c.d_kv = 4;
  c.num_heads = 2;
  c.d_ff = 12;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.feed_forward_proj = ff;
  c.tie_word_embeddings = tied;
  c.vocab_size = 40;
  return c;
}

// Encoder rows of different lengths (0-padded), labels with ignored (-100) tails.
fsdp::data::Batch sample_batch(int64_t V, unsigned seed = 3) {
  fsdp::data::Batch b;
  b.B = 2;
  b.L = 6;
  b.target_len = 5;
  std::mt19937 gen(seed);
  auto tok = [&] { return static_cast<int32_t>(3 + gen() % static_cast<uint32_t>(V - 3)); };
  const int64_t in_len[2] = {6, 4}, tgt_len[2] = {5, 3};
  for (int64_t r = 0; r < b.B; ++r) {
    for (int64_t t = 0; t < b.L; ++t) b.inputs.push_back(t < in_len[r] ? tok() : 0);
    for (int64_t t = 0; t < b.target_len; ++t) {
      b.targets.push_back(t + 1 < tgt_len[r] ? tok() : (t + 1 == tgt_len[r] ? 1 : -100));
    }
  }
  return b;
}

struct Options {
  T5Config model = tiny();
  fsdp::MixedPrecisionConfig mp{};
  fsdp::ActivationCheckpointing activation_checkpointing;  // none
  MPI_Comm comm = MPI_COMM_SELF;
  fsdp::AutoWrapPolicy wrap = fsdp::AutoWrapPolicy::TRANSFORMER_BASED_WRAP;
};

fsdp::FsdpConfig fsdp_config(const Options& o) {
  fsdp::FsdpConfig fc;
  fc.auto_wrap_policy = o.wrap;
  fc.transformer_layer_cls_to_wrap = {"T5Block"};
  return fc;
}

struct Fixture {
  std::unique_ptr<fsdp::Backend> be = fsdp::make_cpu_backend(1);
  fsdp::MpiCommunicator comm;
  fsdp::DeviceMesh mesh;
  fsdp::T5Model model;
  fsdp::FsdpEngine engine;
  fsdp::DeviceBuffer loss_dev{*be, fsdp::DType::f64, 1, fsdp::MemCategory::other};
  fsdp::data::Batch batch;

  explicit Fixture(const Options& o = {})
      : comm(o.comm),
        mesh(fsdp::DeviceMesh::create(comm, 0)),
        model(o.model, *be, o.mp.param_dtype, o.activation_checkpointing),
        engine(model.modules(), fsdp_config(o), o.mp, mesh, *be, 42),
        batch(sample_batch(o.model.vocab_size)) {}
  double read_loss() {
    double s = 0;
    be->copy_to_host(&s, loss_dev.view());
    return s;
  }
  // Summed cross-entropy of `b` (default: the fixture's batch).
  double loss(const fsdp::data::Batch* b = nullptr) {
    be->fill_zero(loss_dev.view());
    engine.begin_step(false);
    model.forward_loss(b ? *b : batch, engine, loss_dev.view());
    engine.end_step();
    return read_loss();
  }
  // Summed cross-entropy; gradients of the mean (grad_scale 1/num_targets) in the shards.
  double loss_and_grads(const fsdp::data::Batch* b = nullptr, float grad_scale = 0.f) {
    const fsdp::data::Batch& bb = b ? *b : batch;
    if (grad_scale == 0.f) grad_scale = 1.f / static_cast<float>(bb.num_targets());
    be->fill_zero(loss_dev.view());
    engine.zero_grad();
    engine.begin_step(true);
    model.forward_backward(bb, grad_scale, engine, loss_dev.view());
    engine.end_step();
    return read_loss();
  }
  std::vector<float> grads() {
    std::vector<float> out;
    for (int u = 0; u < engine.num_units(); ++u) {
      const float* g = engine.shard_grad(u).f32();
      out.insert(out.end(), g, g + engine.shard_numel(u));
    }
    return out;
  }
};

// Every element of this rank's fp32 shards += N(0, 0.3) (norm weights != 1), deterministic.
void perturb_shards(Fixture& f, unsigned seed = 7, float stddev = 0.3f) {
  std::mt19937 gen(seed + static_cast<unsigned>(f.comm.rank()));
  std::normal_distribution<float> nd(0.f, stddev);
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (int64_t i = 0; i < f.engine.shard_numel(u); ++i) p[i] += nd(gen);
  }
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(T5, RelativePositionBucketsMatchTorch) {
  std::ifstream in(std::string(FSDP_TEST_DATA_DIR) + "/t5/relative_position_buckets.txt");
  ASSERT_TRUE(in) << "fixture missing (tools/t5_reference.py buckets)";
  std::string line;
  int rows = 0, log_branch = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    int64_t rp = 0;
    int32_t bi = 0, ca = 0;
    s >> rp >> bi >> ca;
    EXPECT_EQ(fsdp::t5_relative_position_bucket(rp, true, 32, 128), bi) << "bidirectional rp " << rp;
    EXPECT_EQ(fsdp::t5_relative_position_bucket(rp, false, 32, 128), ca) << "causal rp " << rp;
    if (std::abs(rp) >= 8) ++log_branch;
    ++rows;
  }
  EXPECT_EQ(rows, 601);  // -300..300, including +-16, 32, 64 where the log lands on an integer
  EXPECT_GT(log_branch, 500);
  // Spot values of HF's table: exact buckets below max_exact, log buckets, saturation.
  EXPECT_EQ(fsdp::t5_relative_position_bucket(-16, true, 32, 128), 10);
  EXPECT_EQ(fsdp::t5_relative_position_bucket(3, true, 32, 128), 19);
  EXPECT_EQ(fsdp::t5_relative_position_bucket(5, false, 32, 128), 0);
  EXPECT_EQ(fsdp::t5_relative_position_bucket(-1000, false, 32, 128), 31);
  // The table by relative position: [Tq + Tk - 1], element o = bucket(o - (Tq - 1)), i.e.
  // the bucket of every (i, j) with j - i + Tq - 1 = o. Tq = 3, Tk = 5: j - i in -2..4;
  // bidirectional, 32 buckets: 16 per half, exact below 8, rp > 0 in the upper half.
  const auto t = fsdp::t5_relative_position_buckets(3, 5, true, 32, 128);
  EXPECT_EQ(t, (std::vector<int32_t>{2, 1, 0, 17, 18, 19, 20}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(t[static_cast<std::size_t>(j - i + 2)],
                fsdp::t5_relative_position_bucket(j - i, true, 32, 128));
  // Causal (decoder), Tq = Tk = 4: j - i in -3..3, bucket max(-(j - i), 0).
  EXPECT_EQ(fsdp::t5_relative_position_buckets(4, 4, false, 32, 128),
            (std::vector<int32_t>{3, 2, 1, 0, 0, 0, 0}));
  EXPECT_TRUE(fsdp::t5_relative_position_buckets(0, 5, true, 32, 128).empty());
  EXPECT_TRUE(fsdp::t5_relative_position_buckets(3, 0, true, 32, 128).empty());
}

TEST(T5, ShiftRightBuildsDecoderInputs) {
  const std::vector<int32_t> labels = {5, 6, 1, -100, 7, 1, -100, -100};
  EXPECT_EQ(fsdp::t5_shift_right(labels, 2, 4), (std::vector<int32_t>{0, 5, 6, 1, 0, 7, 1, 0}));
}

// The slope at t = 0 of the least-squares polynomial of degree `deg` through (t[k], y[k]),
// in units of s = t / h (normal equations, Gaussian elimination with partial pivoting; well
// conditioned for deg <= 4 on s in [-1, 1]).
double fitted_slope(const std::vector<double>& t, const std::vector<double>& y, int deg, double h) {
  const int n = deg + 1;
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
  for (std::size_t k = 0; k < t.size(); ++k) {
    std::vector<double> pw(2 * n, 1.0);
    for (int i = 1; i < 2 * n; ++i) pw[i] = pw[i - 1] * (t[k] / h);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) a[i][j] += pw[i + j];
      a[i][n] += pw[i] * y[k];
    }
  }
  for (int col = 0; col < n; ++col) {
    int piv = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
    }
    std::swap(a[col], a[piv]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int j = col; j <= n; ++j) a[r][j] -= f * a[col][j];
    }
  }
  return a[1][n] / a[1][1] / h;  // the coefficient of s, per unit of t
}

// Directional finite differences of the mean loss for every parameter tensor.
void check_gradients(const T5Config& c) {
  Options o;
  o.model = c;
  Fixture f(o);
  perturb_shards(f, 5, 0.1f);
  const double n = static_cast<double>(f.batch.num_targets());
  const double base = f.loss_and_grads() / n;
  ASSERT_TRUE(std::isfinite(base));
  // forward_loss agrees with forward_backward's loss
  EXPECT_NEAR(f.loss() / n, base, 1e-6 * std::abs(base));
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  int checked = 0;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    const float* g = f.engine.shard_grad(u).f32();
    const std::vector<float> grad(g, g + f.engine.shard_numel(u));
    for (const auto& e : f.engine.layout(u).entries) {
      const int64_t m = e.spec.numel();
      std::vector<float> d(static_cast<std::size_t>(m));
      for (auto& x : d) x = nd(gen);
      double analytic = 0, norm_g = 0, norm_d = 0;
      for (int64_t i = 0; i < m; ++i) {
        analytic += static_cast<double>(grad[e.offset + i]) * d[i];
        norm_g += static_cast<double>(grad[e.offset + i]) * grad[e.offset + i];
        norm_d += static_cast<double>(d[i]) * d[i];
      }
      // Loss along the direction: L(t) = loss(p + t d) at 2K + 1 points t = h k / K. Each
      // loss carries the fp32 forward's rounding, which does not shrink with h, so the slope
      // is a least-squares fit, not a difference of two or four points: a quartic through
      // all of them (central; exact to O(h^4) on a smooth piece) and cubics through k >= 0
      // and k <= 0 (one-sided, forward and backward).
      std::vector<float> saved(p + e.offset, p + e.offset + m);
      auto L = [&](float t) {
        for (int64_t i = 0; i < m; ++i) p[e.offset + i] = saved[i] + t * d[i];
        const double l = f.loss() / n;
        std::copy(saved.begin(), saved.end(), p + e.offset);
        return l;
      };
      const float h = 2e-3f;
      constexpr int K = 8;
      std::vector<double> ts, ls, tf, lf, tb, lb;
      for (int k = -K; k <= K; ++k) {
        const float t = h * static_cast<float>(k) / K;
        const double l = L(t);
        ts.push_back(t);
        ls.push_back(l);
        if (k >= 0) tf.push_back(t), lf.push_back(l);
        if (k <= 0) tb.push_back(t), lb.push_back(l);
      }
      const double central = fitted_slope(ts, ls, 4, h);
      const double forward = fitted_slope(tf, lf, 3, h);
      const double backward = fitted_slope(tb, lb, 3, h);
      const double scale = std::sqrt(norm_g * norm_d);
      const double tol = 2e-3 * scale + 1e-6;
      EXPECT_GT(scale, 1e-6) << e.spec.name << ": gradient vanished";
      // gated-gelu is smooth: the central difference must match. ReLU's loss is only piecewise
      // smooth: a unit changing sign within [-h, h] breaks one side, and the other side must match.
      double err = std::abs(analytic - central);
      if (c.feed_forward_proj == T5FeedForward::relu) {
        err = std::min({err, std::abs(analytic - forward), std::abs(analytic - backward)});
      }
      EXPECT_LE(err, tol) << e.spec.name << " (" << to_string(c.feed_forward_proj) << ", tied "
                          << c.tie_word_embeddings << "): analytic " << analytic << ", central "
                          << central << ", forward " << forward << ", backward " << backward;
      ++checked;
    }
  }
  // Restored parameters give the same loss again.
  EXPECT_NEAR(f.loss() / n, base, 1e-6 * std::abs(base));
  const int ff = c.feed_forward_proj == T5FeedForward::relu ? 2 : 3;
  const int enc_block = 4 + 1 + ff + 1, dec_block = 4 + 1 + 4 + 1 + ff + 1;
  EXPECT_EQ(checked, 1 + 2 * enc_block + 1 + 2 * dec_block + 2 + 1 + (c.tie_word_embeddings ? 0 : 1));
}

TEST(T5, FiniteDifferenceReluTied) { check_gradients(tiny(T5FeedForward::relu, true)); }
TEST(T5, FiniteDifferenceReluUntied) { check_gradients(tiny(T5FeedForward::relu, false)); }
TEST(T5, FiniteDifferenceGatedGeluTied) { check_gradients(tiny(T5FeedForward::gated_gelu, true)); }
TEST(T5, FiniteDifferenceGatedGeluUntied) { check_gradients(tiny(T5FeedForward::gated_gelu, false)); }

// One example, alone (no padding) and as row 0 of a batch padded to a longer example's lengths.
TEST(T5, PaddingDoesNotChangeAnExample) {
  for (auto ff : {T5FeedForward::relu, T5FeedForward::gated_gelu}) {
    Options o;
    o.model = tiny(ff, ff == T5FeedForward::relu);
    Fixture f(o);
    perturb_shards(f, 9);
    fsdp::data::Batch a, c, both;
    a.B = 1; a.L = 3; a.target_len = 2;
    a.inputs = {7, 12, 1};
    a.targets = {9, 1};
    c.B = 1; c.L = 7; c.target_len = 5;
    c.inputs = {4, 5, 6, 30, 31, 32, 1};
    c.targets = {20, 21, 22, 23, 1};
    both.B = 2; both.L = 7; both.target_len = 5;
    both.inputs = {7, 12, 1, 0, 0, 0, 0, 4, 5, 6, 30, 31, 32, 1};
    both.targets = {9, 1, -100, -100, -100, 20, 21, 22, 23, 1};
    const double la = f.loss_and_grads(&a, 1.f);
    const std::vector<float> ga = f.grads();
    const double lc = f.loss_and_grads(&c, 1.f);
    const std::vector<float> gc = f.grads();
    const double lb = f.loss_and_grads(&both, 1.f);
    const std::vector<float> gb = f.grads();
    EXPECT_NEAR(lb, la + lc, 1e-5 * (la + lc));
    EXPECT_NEAR(f.loss(&both) - f.loss(&c), la, 1e-5 * (la + lc));
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < gb.size(); ++i) {
      const double e = static_cast<double>(ga[i]) + gc[i];
      diff += (gb[i] - e) * (gb[i] - e);
      norm += e * e;
    }
    EXPECT_GT(norm, 0.0);
    // fp32 reassociation only: the blocked attention's online softmax rescales per key tile
    // and a batch of 2 x 7 tiles differently from 1 x 3, and OpenBLAS picks its GEMM kernels
    // by shape (the padded LM head); measured 1.04e-5 relative with both, under 1e-5 with
    // either alone.
    EXPECT_LT(std::sqrt(diff), 2e-5 * std::sqrt(norm)) << to_string(ff);
    // The equalities above are not vacuous: turning row 0's first pad into a real token
    // changes the loss (the pad positions are only hidden by the mask).
    fsdp::data::Batch unmasked = both;
    unmasked.inputs[3] = 8;
    EXPECT_GT(std::abs(f.loss(&unmasked) - lb), 1e-6);
  }
}

TEST(T5, ActivationCheckpointingIsBitIdentical) {
  // Every block, the first 2 (encoder blocks only) and the first 4 (the 3 encoder blocks and
  // the first decoder block) of 5 (fsdp.recompute_num_layers).
  for (int64_t first : {int64_t{-1}, int64_t{2}, int64_t{4}})
  for (auto ff : {T5FeedForward::relu, T5FeedForward::gated_gelu}) {
    for (auto dtype : {fsdp::DType::f32, fsdp::DType::bf16}) {
      for (MPI_Comm comm : {MPI_COMM_SELF, MPI_COMM_WORLD}) {
        const std::string what = std::string(to_string(ff)) + " " + std::string(fsdp::to_string(dtype)) +
                                 (comm == MPI_COMM_SELF ? " one rank" : " world") +
                                 " recompute_num_layers " + std::to_string(first);
        Options o;
        o.model = tiny(ff, ff == T5FeedForward::relu);
        o.model.num_layers = 3;  // encoder and decoder of different depths
        o.mp.param_dtype = dtype;
        o.comm = comm;
        Fixture off(o);
        o.activation_checkpointing = first < 0 ? fsdp::ActivationCheckpointing(true)
                                               : fsdp::ActivationCheckpointing::first_blocks(first);
        Fixture on(o);
        perturb_shards(off);
        perturb_shards(on);
        for (int step = 0; step < 2; ++step) {
          const double loss_off = off.loss_and_grads(), loss_on = on.loss_and_grads();
          EXPECT_TRUE(std::isfinite(loss_off)) << what;
          EXPECT_TRUE(same_bits(loss_off, loss_on)) << what << ": " << loss_off << " vs " << loss_on;
          const auto g_off = off.grads(), g_on = on.grads();
          ASSERT_EQ(g_off.size(), g_on.size());
          EXPECT_EQ(std::memcmp(g_off.data(), g_on.data(), g_off.size() * sizeof(float)), 0) << what;
          double n2 = 0;
          for (float x : g_off) n2 += static_cast<double>(x) * x;
          double total = n2;
          MPI_Allreduce(&n2, &total, 1, MPI_DOUBLE, MPI_SUM, comm);
          EXPECT_GT(total, 0.0) << what;
          EXPECT_TRUE(same_bits(off.loss(), on.loss())) << what;
        }
      }
    }
  }
}

TEST(T5, ActivationBytesArePlannedAndMeasured) {
  const fsdp::data::BatchShape shape{6, 5};
  for (auto ff : {T5FeedForward::relu, T5FeedForward::gated_gelu}) {
    for (auto dtype : {fsdp::DType::f32, fsdp::DType::bf16}) {
      for (int64_t layers : {1, 2, 3}) {
        T5Config c = tiny(ff);
        c.num_layers = layers;
        c.num_decoder_layers = layers;
        const int64_t off = fsdp::T5Model::activation_bytes(c, 2, shape, dtype, false);
        const int64_t on = fsdp::T5Model::activation_bytes(c, 2, shape, dtype, true);
        EXPECT_EQ(off, fsdp::T5Model::activation_bytes(c, 2, shape, dtype)) << "default is off";
        if (layers >= 2) EXPECT_LT(on, off);
        // The first blocks only (fsdp.recompute_num_layers): the encoder's, and the encoder's
        // and the first decoder block.
        for (auto ckpt : {fsdp::ActivationCheckpointing(false), fsdp::ActivationCheckpointing(true),
                          fsdp::ActivationCheckpointing::first_blocks(layers),
                          fsdp::ActivationCheckpointing::first_blocks(layers + 1)}) {
          Options o;
          o.model = c;
          o.mp.param_dtype = dtype;
          o.activation_checkpointing = ckpt;
          Fixture f(o);
          f.loss_and_grads();
          EXPECT_EQ(static_cast<int64_t>(f.be->memory().peak(fsdp::MemCategory::activations)),
                    fsdp::T5Model::activation_bytes(c, 2, shape, dtype, ckpt))
              << to_string(ff) << " " << fsdp::to_string(dtype) << " layers " << layers
              << " recomputed " << ckpt.recomputed(2 * layers);
        }
        const int64_t enc_only = fsdp::T5Model::activation_bytes(
            c, 2, shape, dtype, fsdp::ActivationCheckpointing::first_blocks(layers));
        const int64_t into_dec = fsdp::T5Model::activation_bytes(
            c, 2, shape, dtype, fsdp::ActivationCheckpointing::first_blocks(layers + 1));
        // The recomputing blocks and the one after them share one set (the largest of their
        // internals, field by field); each later block keeps its own.
        EXPECT_LT(enc_only, off);
        EXPECT_EQ(into_dec == on, layers <= 2)  // the shared set then spans every block
            << to_string(ff) << " " << fsdp::to_string(dtype) << " layers " << layers;
        if (layers >= 2) EXPECT_LT(into_dec, enc_only);
      }
    }
  }
  // One more block per stack under checkpointing costs exactly its two residual streams.
  T5Config c = tiny();
  const int64_t on2 = fsdp::T5Model::activation_bytes(c, 2, shape, fsdp::DType::f32, true);
  c.num_layers = 3;
  c.num_decoder_layers = 3;
  const int64_t on3 = fsdp::T5Model::activation_bytes(c, 2, shape, fsdp::DType::f32, true);
  EXPECT_EQ(on3 - on2, (2 * 6 + 2 * 5) * c.d_model * 4);
}

TEST(T5, InitialisationFollowsHuggingFace) {
  Options o;
  o.model.d_model = 64;
  o.model.d_kv = 16;
  o.model.num_heads = 4;
  o.model.d_ff = 128;
  o.model.vocab_size = 384;
  o.model.num_layers = 1;
  o.model.num_decoder_layers = 1;
  o.model.feed_forward_proj = T5FeedForward::gated_gelu;
  o.model.tie_word_embeddings = false;
  o.wrap = fsdp::AutoWrapPolicy::NO_WRAP;
  Fixture f(o);
  const auto p = f.engine.gather_full_params();
  auto stdev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) { s += x; s2 += static_cast<double>(x) * x; }
    const double m = s / static_cast<double>(v.size());
    return std::sqrt(s2 / static_cast<double>(v.size()) - m * m);
  };
  auto expect_std = [&](const std::string& name, double want, double rel) {
    ASSERT_TRUE(p.count(name)) << name;
    EXPECT_NEAR(stdev(p.at(name)), want, rel * want) << name;
  };
  const double D = 64, DKV = 16, H = 4, F = 128;
  expect_std("shared.weight", 1.0, 0.03);
  expect_std("lm_head.weight", 1.0, 0.03);
  for (const std::string s : {"encoder.block.0.layer.0.SelfAttention.", "decoder.block.0.layer.0.SelfAttention.",
                              "decoder.block.0.layer.1.EncDecAttention."}) {
    expect_std(s + "q.weight", 1 / std::sqrt(D * DKV), 0.05);
    expect_std(s + "k.weight", 1 / std::sqrt(D), 0.05);
    expect_std(s + "v.weight", 1 / std::sqrt(D), 0.05);
    expect_std(s + "o.weight", 1 / std::sqrt(H * DKV), 0.05);
  }
  expect_std("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 1 / std::sqrt(D), 0.25);
  expect_std("encoder.block.0.layer.1.DenseReluDense.wi_0.weight", 1 / std::sqrt(D), 0.05);
  expect_std("decoder.block.0.layer.2.DenseReluDense.wi_1.weight", 1 / std::sqrt(D), 0.05);
  expect_std("decoder.block.0.layer.2.DenseReluDense.wo.weight", 1 / std::sqrt(F), 0.05);
  for (const std::string n : {"encoder.block.0.layer.0.layer_norm.weight", "decoder.block.0.layer.1.layer_norm.weight",
                              "encoder.final_layer_norm.weight", "decoder.final_layer_norm.weight"}) {
    ASSERT_TRUE(p.count(n)) << n;
    for (float x : p.at(n)) EXPECT_EQ(x, 1.f) << n;
  }
  // No weight decay on norms and embeddings.
  for (const auto& m : f.model.modules()) {
    for (const auto& ps : m.params) {
      const bool no_decay = ps.name.find("layer_norm") != std::string::npos ||
                            ps.name == "shared.weight" ||
                            ps.name.find("relative_attention_bias") != std::string::npos;
      EXPECT_EQ(ps.weight_decay, !no_decay) << ps.name;
    }
  }
}

TEST(T5, ModulesCarryHuggingFaceNames) {
  const auto mods = fsdp::t5_modules(tiny(T5FeedForward::gated_gelu, false));
  std::vector<std::string> names;
  for (const auto& m : mods) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"shared", "encoder.block.0", "encoder.block.1",
                                             "encoder.final_layer_norm", "decoder.block.0",
                                             "decoder.block.1", "decoder.final_layer_norm", "lm_head"}));
  EXPECT_EQ(mods[1].cls, "T5Block");
  EXPECT_EQ(mods[3].cls, "T5LayerNorm");
  std::vector<std::string> dec0;
  for (const auto& p : mods[4].params) dec0.push_back(p.name);
  const std::string b = "decoder.block.0.layer.";
  EXPECT_EQ(dec0, (std::vector<std::string>{
                      b + "0.SelfAttention.q.weight", b + "0.SelfAttention.k.weight",
                      b + "0.SelfAttention.v.weight", b + "0.SelfAttention.o.weight",
                      b + "0.SelfAttention.relative_attention_bias.weight", b + "0.layer_norm.weight",
                      b + "1.EncDecAttention.q.weight", b + "1.EncDecAttention.k.weight",
                      b + "1.EncDecAttention.v.weight", b + "1.EncDecAttention.o.weight",
                      b + "1.layer_norm.weight", b + "2.DenseReluDense.wi_0.weight",
                      b + "2.DenseReluDense.wi_1.weight", b + "2.DenseReluDense.wo.weight",
                      b + "2.layer_norm.weight"}));
  EXPECT_EQ(mods[2].params.size(), 4u + 1 + 3 + 1);  // block 1: no relative_attention_bias
  EXPECT_EQ(mods[4].params[4].shape, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(mods[4].params[6].shape, (std::vector<int64_t>{8, 8}));     // [H*d_kv, d_model]
  EXPECT_EQ(mods[4].params[13].shape, (std::vector<int64_t>{8, 12}));   // wo [d_model, d_ff]
  const auto tied = fsdp::t5_modules(tiny());
  EXPECT_EQ(tied.size(), 7u);
  EXPECT_EQ(tied[1].params[6].name, "encoder.block.0.layer.1.DenseReluDense.wi.weight");
}

TEST(T5, HuggingFaceConfigRoundTrip) {
  for (auto ff : {T5FeedForward::relu, T5FeedForward::gated_gelu}) {
    for (bool tied : {true, false}) {
      T5Config c = tiny(ff, tied);
      c.num_decoder_layers = 3;
      c.layer_norm_epsilon = 1e-5;
      const nlohmann::json j = fsdp::t5_hf_config(c);
      EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"T5ForConditionalGeneration"}));
      EXPECT_EQ(j.at("model_type"), "t5");
      EXPECT_EQ(j.at("feed_forward_proj"), ff == T5FeedForward::relu ? "relu" : "gated-gelu");
      EXPECT_EQ(j.at("is_encoder_decoder"), true);
      EXPECT_EQ(j.at("decoder_start_token_id"), 0);
      EXPECT_EQ(j.at("dropout_rate"), 0.0);
      EXPECT_EQ(fsdp::t5_config_from_hf(j, "config.json"), c);
      // Every attribute, as fsdp_merge has always written it (the keys from the table, the
      // rest constants).
      const nlohmann::json expected{
          {"architectures", {"T5ForConditionalGeneration"}},
          {"model_type", "t5"},
          {"vocab_size", 40},
          {"d_model", 8},
          {"d_kv", 4},
          {"d_ff", 12},
          {"num_layers", 2},
          {"num_decoder_layers", 3},
          {"num_heads", 2},
          {"relative_attention_num_buckets", 32},
          {"relative_attention_max_distance", 128},
          {"dropout_rate", 0.0},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_factor", 1.0},
          {"feed_forward_proj", ff == T5FeedForward::relu ? "relu" : "gated-gelu"},
          {"is_encoder_decoder", true},
          {"tie_word_embeddings", tied},
          {"pad_token_id", 0},
          {"eos_token_id", 1},
          {"decoder_start_token_id", 0},
          {"torch_dtype", "float32"},
      };
      EXPECT_EQ(j.dump(), expected.dump());
    }
  }
  // HF's null num_decoder_layers means num_layers; optional fields take HF's defaults.
  nlohmann::json j = {{"vocab_size", 384}, {"d_model", 16}, {"d_kv", 4}, {"d_ff", 32},
                      {"num_layers", 3}, {"num_heads", 4}, {"num_decoder_layers", nullptr}};
  const T5Config c = fsdp::t5_config_from_hf(j, "x.json");
  EXPECT_EQ(c.num_decoder_layers, 3);
  EXPECT_EQ(c.relative_attention_num_buckets, 32);
  EXPECT_EQ(c.relative_attention_max_distance, 128);
  EXPECT_EQ(c.feed_forward_proj, T5FeedForward::relu);
  EXPECT_TRUE(c.tie_word_embeddings);
  auto fails_naming = [](const nlohmann::json& bad, const std::string& field) {
    try {
      fsdp::t5_config_from_hf(bad, "x.json");
      ADD_FAILURE() << "accepted a config with bad " << field;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
      EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  nlohmann::json bad = j;
  bad.erase("d_model");
  fails_naming(bad, "d_model");
  bad = j;
  bad["feed_forward_proj"] = "gated-silu";
  fails_naming(bad, "feed_forward_proj");
  // The row's choices, with the TOML config's wording after the field.
  fails_naming(bad, "x.json: \"feed_forward_proj\": unknown value \"gated-silu\" (expected one of relu, gated-gelu)");
  EXPECT_EQ(fsdp::t5_feed_forward_from_string("gated-gelu"), T5FeedForward::gated_gelu);
  EXPECT_FALSE(fsdp::t5_feed_forward_from_string("Relu").has_value());
  bad = j;
  bad["num_heads"] = "4";
  fails_naming(bad, "num_heads");
  bad = j;
  bad["model_type"] = "bart";
  fails_naming(bad, "model_type");
  bad = j;
  bad["decoder_start_token_id"] = 2;
  fails_naming(bad, "decoder_start_token_id");
  bad = j;
  bad["num_layers"] = 0;
  fails_naming(bad, "num_layers");
  // Ranges and relations have the TOML config's wording after the field.
  fails_naming(bad, "x.json: \"num_layers\": 0 is out of range (expected an integer 1 <= x <= 10000)");
  bad = j;
  bad["relative_attention_num_buckets"] = 2;
  fails_naming(bad, "x.json: \"relative_attention_num_buckets\": 2 is out of range (expected an integer 4 <= x <= 16777216)");
  bad = j;
  bad["relative_attention_max_distance"] = 16;
  fails_naming(bad, "x.json: \"relative_attention_max_distance\": 16 is out of range (expected > "
                    "\"relative_attention_num_buckets\" / 2 = 16)");
  bad = j;
  bad["layer_norm_epsilon"] = 0.0;
  fails_naming(bad, "x.json: \"layer_norm_epsilon\": 0 is out of range (expected > 0)");
  bad = j;
  bad["is_encoder_decoder"] = false;
  fails_naming(bad, "x.json: \"is_encoder_decoder\" false is not supported (expected true)");
  // HF's T5Config derives dense_act_fn and is_gated_act from feed_forward_proj, but a
  // config.json's own override them: they must agree (equivalent spellings accepted).
  nlohmann::json ok = j;
  ok["dense_act_fn"] = "relu";
  ok["is_gated_act"] = false;
  EXPECT_EQ(fsdp::t5_config_from_hf(ok, "x.json").feed_forward_proj, T5FeedForward::relu);
  ok["feed_forward_proj"] = "gated-gelu";
  for (const char* act : {"gelu_new", "gelu_pytorch_tanh"}) {
    ok["dense_act_fn"] = act;
    ok["is_gated_act"] = true;
    EXPECT_EQ(fsdp::t5_config_from_hf(ok, "x.json").feed_forward_proj, T5FeedForward::gated_gelu) << act;
  }
  bad = ok;
  bad["dense_act_fn"] = "gelu";  // the exact (erf) GELU: not ours
  fails_naming(bad, "x.json: \"dense_act_fn\" \"gelu\" is not supported (expected \"gelu_new\" or "
                    "\"gelu_pytorch_tanh\" with \"feed_forward_proj\" \"gated-gelu\")");
  bad = ok;
  bad["is_gated_act"] = false;
  fails_naming(bad, "x.json: \"is_gated_act\" false is not supported (expected true with "
                    "\"feed_forward_proj\" \"gated-gelu\")");
  bad = j;  // relu, gated by its own attributes
  bad["dense_act_fn"] = "gelu_new";
  fails_naming(bad, "\"dense_act_fn\" \"gelu_new\" is not supported (expected \"relu\" with");
  bad = j;
  bad["is_gated_act"] = true;
  fails_naming(bad, "is_gated_act");
}

// A T5Config built in code is checked with the config's messages (model.<key>).
TEST(T5, ModelChecksItsConfigWithTheConfigMessages) {
  auto fails_with = [](const T5Config& c, const std::string& message) {
    try {
      fsdp::t5_modules(c);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  T5Config c = tiny();
  c.d_kv = 0;
  fails_with(c, "model.d_kv: 0 is out of range (expected an integer 1 <= x <= 16777216)");
  c = tiny();
  c.relative_attention_num_buckets = 3;
  fails_with(c, "model.relative_attention_num_buckets: 3 is out of range (expected an integer 4 <= x <= 16777216)");
  c = tiny();
  c.relative_attention_max_distance = 16;
  fails_with(c, "model.relative_attention_max_distance: 16 is out of range (expected > "
                "model.relative_attention_num_buckets / 2 = 16)");
  c = tiny();
  c.pad_vocab_multiple = 0;
  fails_with(c, "model.pad_vocab_multiple: 0 is out of range (expected an integer >= 1)");
  // The [model] section read as a T5Config: an unknown feed_forward_proj (a ModelConfig built
  // in code is not validated) is the config's message, not the enum's default.
  fsdp::ModelConfig m = fsdp::model_defaults("t5");
  m.set("feed_forward_proj", std::string("gelu"));
  try {
    T5Config::from(m);
    ADD_FAILURE() << "read an unknown feed_forward_proj";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "model.feed_forward_proj: unknown value \"gelu\" (expected one of relu, gated-gelu)");
  }
  // The [model] defaults are T5Config's.
  EXPECT_EQ(T5Config::from(fsdp::model_defaults("t5")), T5Config{});
}

// tools/t5_reference.py's float64 torch T5 (HF T5ForConditionalGeneration's forward) on the same
// float32 weights and padded batch: our fp32 summed loss and every parameter's gradient. Our
// model runs with the default vocabulary padding (40 -> 128 rows): the reference's vocabulary
// rows fill the model rows, and the pad rows' gradients must be exactly 0.
void check_reference(const std::string& file) {
  test_util::ReferenceFile ref;
  test_util::read_reference(std::string(FSDP_TEST_DATA_DIR) + "/t5/" + file,
                            "tools/t5_reference.py model", &ref);
  if (testing::Test::HasFatalFailure()) return;
  const std::string& config_json = ref.config_json;
  fsdp::data::Batch batch;
  const auto shape = ref.as<int64_t>("batch");
  ASSERT_EQ(shape.size(), 3u) << file << ": batch B L target_len";
  batch.B = shape[0];
  batch.L = shape[1];
  batch.target_len = shape[2];
  batch.inputs = ref.as<int32_t>("inputs");
  batch.targets = ref.as<int32_t>("targets");
  const double ref_loss = ref.scalar("loss");
  const auto& params = ref.params;
  const auto& grads = ref.grads;
  Options o;
  o.model = fsdp::t5_config_from_hf(nlohmann::json::parse(config_json), file);
  Fixture f(o);
  f.batch = batch;
  int set = 0;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    float* p = f.engine.shard_param(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      ASSERT_TRUE(params.count(e.spec.name)) << file << ": no " << e.spec.name;
      // The reference's [vocab_size, d_model] fills the model rows of our vocabulary-padded
      // shared/lm_head (model.pad_vocab_multiple: 40 -> 128 rows); the pad rows stay 0.
      const auto& v = params.at(e.spec.name);
      ASSERT_EQ(static_cast<int64_t>(v.size()), e.spec.unpadded_numel()) << e.spec.name;
      for (int64_t i = e.spec.unpadded_numel(); i < e.spec.numel(); ++i) ASSERT_EQ(p[e.offset + i], 0.f);
      std::copy(v.begin(), v.end(), p + e.offset);
      ++set;
    }
  }
  EXPECT_EQ(set, static_cast<int>(params.size())) << file << ": parameters the model does not declare";
  const double loss = f.loss_and_grads(nullptr, 1.f);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << file;
  EXPECT_NEAR(f.loss(), ref_loss, 1e-5 * std::abs(ref_loss)) << file;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* g = f.engine.shard_grad(u).f32();
    for (const auto& e : f.engine.layout(u).entries) {
      const auto& r = grads.at(e.spec.name);
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < e.spec.unpadded_numel(); ++i) {
        const double d = g[e.offset + i] - r[static_cast<std::size_t>(i)];
        diff += d * d;
        norm += r[static_cast<std::size_t>(i)] * r[static_cast<std::size_t>(i)];
      }
      for (int64_t i = e.spec.unpadded_numel(); i < e.spec.numel(); ++i) {
        ASSERT_EQ(g[e.offset + i], 0.f) << file << ": " << e.spec.name << " pad element " << i;
      }
      EXPECT_GT(norm, 0.0) << file << ": " << e.spec.name;
      EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << file << ": " << e.spec.name;
    }
  }
}

TEST(T5, MatchesTorchReferenceReluTied) { check_reference("reference_relu_tied.txt"); }
TEST(T5, MatchesTorchReferenceReluUntied) { check_reference("reference_relu_untied.txt"); }
TEST(T5, MatchesTorchReferenceGatedGeluTied) { check_reference("reference_gated-gelu_tied.txt"); }
TEST(T5, MatchesTorchReferenceGatedGeluUntied) { check_reference("reference_gated-gelu_untied.txt"); }

TEST(T5, RejectsOutOfRangeIds) {
  Fixture f;
  fsdp::data::Batch b = f.batch;
  b.inputs[0] = 40;
  EXPECT_THROW(f.loss(&b), fsdp::Error);
  b = f.batch;
  b.targets[0] = -1;
  EXPECT_THROW(f.loss(&b), fsdp::Error);
}

}  // namespace
