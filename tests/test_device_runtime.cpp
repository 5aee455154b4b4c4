// tests/test_device_runtime.cpp: the CPU backend's DeviceRuntime half (fsdp/backend/
// device_runtime.hpp), what the FSDP engine and the optimizers run on: allocation and memory
// tracking, copies and streams/events, DeviceBuffer, the flat-shard arithmetic (axpy,
// scale_by, squared norms into fp64 device scalars, clip coefficient, loss-scale unscaling),
// AdamW / SGD steps against values produced by torch.optim (1.13), casts and their rounding
// against hand-computed bit patterns, the "store bf16/fp16, compute fp32" contract and the
// argument checks of these operations, and the stream-ordered caching allocator (reuse,
// pending events, empty_cache, logical-byte accounting). The model kernels are
// tests/test_kernels.cpp's; the helpers both use are tests/cpu_backend_util.hpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu_backend_util.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/backend/optimizer_math.hpp"
#include "fsdp/core/caching_allocator.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

using namespace cpu_test;

class CpuRuntime : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::mt19937 rng{1234};
};

// ---------------------------------------------------------------------------------------
// memory

TEST_F(CpuRuntime, AllocateIsAlignedAndTracked) {
  MemoryTracker& mem = be->memory();
  void* a = be->allocate(100, MemCategory::activations);
  void* b = be->allocate(1000, MemCategory::grads);
  void* c = be->allocate(0, MemCategory::other);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(c, nullptr);  // bytes == 0
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 256, 0u);
  EXPECT_EQ(mem.current(MemCategory::activations), 100u);
  EXPECT_EQ(mem.current(MemCategory::grads), 1000u);
  EXPECT_EQ(mem.current_total(), 1100u);
  std::memset(b, 0xff, 1000);
  be->fill_zero(TensorView(b, DType::u8, {1000}));
  EXPECT_EQ(static_cast<unsigned char*>(b)[999], 0);
  be->deallocate(a, 100, MemCategory::activations);
  EXPECT_EQ(mem.current(MemCategory::activations), 0u);
  EXPECT_EQ(mem.peak(MemCategory::activations), 100u);
  EXPECT_EQ(mem.current_total(), 1000u);
  EXPECT_EQ(mem.peak_total(), 1100u);
  be->deallocate(b, 1000, MemCategory::grads);
  be->deallocate(c, 0, MemCategory::other);
  be->deallocate(nullptr, 0, MemCategory::other);
  EXPECT_EQ(mem.current_total(), 0u);
  EXPECT_EQ(be->device(), Device::cpu);
}

TEST_F(CpuRuntime, HugeAllocationThrows) {
  EXPECT_THROW(be->allocate(std::size_t{1} << 62, MemCategory::other), Error);
  EXPECT_THROW(be->allocate(std::numeric_limits<std::size_t>::max(), MemCategory::other), Error);
  EXPECT_EQ(be->memory().current_total(), 0u);
}

TEST_F(CpuRuntime, BadThreadCountThrows) { EXPECT_THROW(make_cpu_backend(0), Error); }

TEST_F(CpuRuntime, CopyRoundTrip) {
  Vec src = random_vec(37, rng), mid(37), dst(37);
  be->copy_from_host(f32(mid), src.data());
  be->copy(f32(dst), f32(mid));
  Vec host(37);
  be->copy_to_host(host.data(), f32(dst));
  be->synchronize();
  EXPECT_EQ(host, src);
  // 16-bit views copy their bytes
  std::vector<uint16_t> h16 = {1, 2, 0x7FC0, 0x8000, 5}, d16(5);
  be->copy(TensorView(d16.data(), DType::bf16, {5}), TensorView(h16.data(), DType::bf16, {5}));
  EXPECT_EQ(d16, h16);
}

TEST_F(CpuRuntime, StreamsAndEvents) {
  EXPECT_EQ(be->compute_stream().device(), Device::cpu);
  auto s = be->create_stream();
  auto e = be->create_event();
  ASSERT_TRUE(s && e);
  e->record(*s);
  EXPECT_TRUE(e->query());  // host work is complete once recorded
  be->compute_stream().wait(*e);
  e->synchronize();
  s->synchronize();
}

TEST_F(CpuRuntime, DeviceBufferViews) {
  DeviceBuffer buf(*be, DType::bf16, 10, MemCategory::activations);
  EXPECT_EQ(buf.bytes(), 20u);
  EXPECT_EQ(be->memory().current(MemCategory::activations), 20u);
  EXPECT_EQ(buf.view().dtype, DType::bf16);
  EXPECT_EQ(buf.view({2, 5}).numel(), 10);
  EXPECT_THROW(buf.view({3, 5}), Error);
  be->fill_zero(buf.view());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(static_cast<uint16_t*>(buf.data())[i], 0u);
  buf.reset();
  EXPECT_EQ(be->memory().current(MemCategory::activations), 0u);
}

// ---------------------------------------------------------------------------------------
// flat-shard arithmetic

TEST_F(CpuRuntime, AxpyAndSquaredNorm) {
  const int64_t n = 70001;  // above the threading threshold, odd length
  Vec a = random_vec(n, rng), b = random_vec(n, rng);
  Vec y = a;
  be->axpy(f32(y), -0.5f, f32(b));
  for (int64_t i = 0; i < n; i += 997) EXPECT_FLOAT_EQ(y[i], a[i] - 0.5f * b[i]);
  double ref = 0.0;
  for (float v : b) ref += static_cast<double>(v) * v;
  double acc = 0.0;
  be->squared_norm(f64(acc), f32(b));
  EXPECT_NEAR(acc, ref, 1e-9 * ref);
  double zero = 0.0;
  be->squared_norm(f64(zero), f32(b).slice(0, 0));
  EXPECT_EQ(zero, 0.0);
}

// The squared norm's fixed blocks: the same bits whatever the thread count.
TEST_F(CpuRuntime, SquaredNormIndependentOfThreadCount) {
  auto one = make_cpu_backend(1);
  const Vec x = random_vec(512 * 96, rng);
  double n1 = 0.0, n2 = 0.0;
  one->squared_norm(f64(n1), f32(x));
  be->squared_norm(f64(n2), f32(x));
  EXPECT_EQ(bits(n1), bits(n2));
}

// ---------------------------------------------------------------------------------------
// optimizers: expected values from torch 1.13 (torch.optim.AdamW / SGD, fp32) for three
// steps with p0 = [1, -0.5, 0.25, 2] and the gradients below.

const Vec kP0 = {1.0f, -0.5f, 0.25f, 2.0f};
const std::vector<Vec> kGrads = {
    {0.5f, -0.1f, 0.0f, 3.0f}, {-0.2f, 0.3f, 1e-3f, -1.0f}, {0.1f, 0.1f, -2.0f, 0.5f}};

void expect_close(const Vec& got, const Vec& want, double rel, const char* what, int step) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::max(1e-3, std::abs(static_cast<double>(want[i]))))
        << what << " step " << step << " element " << i;
  }
}

TEST_F(CpuRuntime, AdamWMatchesTorch) {
  // lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
  const std::vector<Vec> p_want = {{0.899000049f, -0.399500012f, 0.249750003f, 1.898f},
                                   {0.863540471f, -0.448519498f, 0.175087631f, 1.85608017f},
                                   {0.824737728f, -0.50376296f, 0.23876515f, 1.81368148f}};
  const std::vector<Vec> m_want = {{0.0500000007f, -0.0100000007f, 0.0f, 0.300000012f},
                                   {0.0249999966f, 0.0210000016f, 0.000100000005f, 0.170000017f},
                                   {0.0324999988f, 0.0289000012f, -0.19991f, 0.203000009f}};
  const std::vector<Vec> v_want = {
      {0.000250000012f, 1.00000007e-05f, 0.0f, 0.00899999961f},
      {0.000289750024f, 9.99900076e-05f, 1.00000019e-09f, 0.00999099948f},
      {0.000299460255f, 0.000109890025f, 0.00400000112f, 0.0102310078f}};
  Vec p = kP0, m(4, 0.0f), v(4, 0.0f);
  for (int s = 0; s < 3; ++s) {
    be->adamw_update(f32(p), f32(kGrads[s]), f32(m), f32(v), 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f,
                     s + 1);
    expect_close(p, p_want[s], 2e-6, "param", s + 1);
    expect_close(m, m_want[s], 2e-6, "exp_avg", s + 1);
    expect_close(v, v_want[s], 2e-6, "exp_avg_sq", s + 1);
  }
  EXPECT_THROW(be->adamw_update(f32(p), f32(kGrads[0]), f32(m), f32(v), 0.1f, 0.9f, 0.999f,
                                1e-8f, 0.01f, 0),
               Error);
}

TEST_F(CpuRuntime, AdamWLargeThreadedMatchesSmall) {
  const int64_t n = 100000;
  Vec p = random_vec(n, rng), g = random_vec(n, rng), m(n, 0.0f), v(n, 0.0f);
  Vec p1(p.begin(), p.begin() + 5), m1(5, 0.0f), v1(5, 0.0f);
  be->adamw_update(f32(p), f32(g), f32(m), f32(v), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  be->adamw_update(f32(p1), f32(g), f32(m1), f32(v1), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p[i], p1[i]);
}

TEST_F(CpuRuntime, SgdMatchesTorch) {
  // lr=0.1, momentum=0.9, weight_decay=0.01 (dampening 0, nesterov off)
  const std::vector<Vec> p_want = {{0.949000001f, -0.489499986f, 0.249750003f, 1.69799995f},
                                   {0.922151029f, -0.509560466f, 0.249175251f, 1.52450192f},
                                   {0.887064755f, -0.537105381f, 0.448408812f, 1.3168292f}};
  const std::vector<Vec> buf_want = {{0.50999999f, -0.105000004f, 0.00249999994f, 3.01999998f},
                                     {0.268489987f, 0.200605005f, 0.00574749988f, 1.73497987f},
                                     {0.350862503f, 0.275448889f, -1.99233556f, 2.07672691f}};
  Vec p = kP0, buf(4, 12345.0f);  // garbage: step 1 must set buf = g, not read it
  for (int s = 0; s < 3; ++s) {
    be->sgd_update(f32(p), f32(kGrads[s]), f32(buf), 0.1f, 0.9f, 0.01f, s + 1);
    expect_close(p, p_want[s], 2e-6, "param", s + 1);
    expect_close(buf, buf_want[s], 2e-6, "momentum_buffer", s + 1);
  }
  // momentum 0: plain SGD, buffer untouched (may be an empty view)
  const std::vector<Vec> p0_want = {{0.949000001f, -0.489499986f, 0.249750003f, 1.69799995f},
                                    {0.968051016f, -0.519010484f, 0.249400258f, 1.79630196f},
                                    {0.957082987f, -0.528491497f, 0.44915086f, 1.74450564f}};
  Vec q = kP0;
  for (int s = 0; s < 3; ++s) {
    be->sgd_update(f32(q), f32(kGrads[s]), TensorView{}, 0.1f, 0.0f, 0.01f, s + 1);
    expect_close(q, p0_want[s], 2e-6, "param (momentum 0)", s + 1);
  }
}

// The CPU backend's vectorised, threaded AdamW and SGD equal fsdp/backend/optimizer_math.hpp's
// element updates applied one element at a time, bit for bit, with decay on some elements and
// not others. The CUDA kernels call the same functions (kernels_optim.cu), so an offloaded
// update (host) and a device update of the same shard agree bit for bit (issue 31: they used
// to differ in the last bits, each compiler contracting its own products into FMAs);
// tests/test_cuda_device_runtime.cpp (AdamWAndSgd) checks the CUDA side against this backend
// exactly. A loop that rounds p * (1 - lr wd) on its own first, as torch.optim and this
// backend did before, fails here.
TEST_F(CpuRuntime, UpdatesAreTheSharedElementOps) {
  const int64_t n = 70001;
  const std::vector<fsdp::ElementRange> ranges = {{3, 20000}, {35000, 35001}, {50000, n}};
  auto decayed = [&](int64_t i) {
    for (const auto& r : ranges) if (i >= r.begin && i < r.end) return true;
    return false;
  };
  Vec p = random_vec(n, rng), m(n, 0.f), v(n, 0.f);
  Vec q = p, mq = m, vq = v;
  for (int step = 1; step <= 3; ++step) {
    const Vec g = random_vec(n, rng);
    be->adamw_update(f32(p), f32(g), f32(m), f32(v), 1e-2f, 0.9f, 0.95f, 1e-8f,
                     fsdp::WeightDecay(0.1f, &ranges), step);
    const AdamWCoefficients c = adamw_coefficients(1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    for (int64_t i = 0; i < n; ++i) {
      adamw_element(q[i], g[i], mq[i], vq[i], decayed(i) ? c.decay : 1.0f, c);
    }
    ASSERT_EQ(p, q) << "adamw param, step " << step;
    ASSERT_EQ(m, mq) << "adamw exp_avg, step " << step;
    ASSERT_EQ(v, vq) << "adamw exp_avg_sq, step " << step;
  }
  for (float momentum : {0.0f, 0.9f}) {
    Vec a = random_vec(n, rng), b = a, buf(n, 0.f), bufq(n, 0.f);
    for (int step = 1; step <= 2; ++step) {
      const Vec g = random_vec(n, rng);
      be->sgd_update(f32(a), f32(g), momentum == 0 ? TensorView{} : f32(buf), 0.05f, momentum,
                     fsdp::WeightDecay(0.1f, &ranges), step);
      for (int64_t i = 0; i < n; ++i) {
        sgd_element(b[i], g[i], bufq[i], 0.05f, momentum, decayed(i) ? 0.1f : 0.0f, step == 1,
                    momentum != 0.0f);
      }
      ASSERT_EQ(a, b) << "sgd momentum " << momentum << " step " << step;
      ASSERT_EQ(buf, bufq) << "sgd momentum buffer " << momentum << " step " << step;
    }
  }
}

// One update over a whole shard with weight-decay ranges (the optimizer's call, one per
// FlatParameter shard) equals one update per piece with the rate or 0 (what it replaced), bit
// for bit, for AdamW and SGD with and without momentum, across the threads' shares.
TEST_F(CpuRuntime, DecayRangesEqualOneUpdatePerPiece) {
  const int64_t n = 70001;  // several threads' shares; ranges cross their boundaries
  const std::vector<fsdp::ElementRange> ranges = {{0, 17}, {18, 20000}, {35000, 35001}, {50000, n}};
  const Vec p0 = random_vec(n, rng);
  auto pieces = [&](auto&& update) {  // [lo, hi) and its rate, as the old optimizer split it
    int64_t at = 0;
    for (const auto& r : ranges) {
      if (at < r.begin) update(at, r.begin, 0.f);
      update(r.begin, r.end, 0.1f);
      at = r.end;
    }
    if (at < n) update(at, n, 0.f);
  };
  Vec p = p0, m(n, 0.f), v(n, 0.f), q = p0, mq(n, 0.f), vq(n, 0.f);
  for (int step = 1; step <= 3; ++step) {
    const Vec g = random_vec(n, rng);
    be->adamw_update(f32(p), f32(g), f32(m), f32(v), 1e-2f, 0.9f, 0.95f, 1e-8f,
                     fsdp::WeightDecay(0.1f, &ranges), step);
    pieces([&](int64_t lo, int64_t hi, float wd) {
      auto part = [&](Vec& x) { return f32(x).slice(lo, hi - lo); };
      be->adamw_update(part(q), f32(g).slice(lo, hi - lo), part(mq), part(vq), 1e-2f, 0.9f, 0.95f,
                       1e-8f, wd, step);
    });
    ASSERT_EQ(p, q) << "adamw step " << step;
    ASSERT_EQ(m, mq);
    ASSERT_EQ(v, vq);
  }
  for (float momentum : {0.0f, 0.9f}) {
    Vec a = p0, b = p0, ba(n, 0.f), bb(n, 0.f);
    for (int step = 1; step <= 2; ++step) {
      const Vec g = random_vec(n, rng);
      be->sgd_update(f32(a), f32(g), momentum == 0 ? TensorView{} : f32(ba), 0.05f, momentum,
                     fsdp::WeightDecay(0.1f, &ranges), step);
      pieces([&](int64_t lo, int64_t hi, float wd) {
        be->sgd_update(f32(b).slice(lo, hi - lo), f32(g).slice(lo, hi - lo),
                       momentum == 0 ? TensorView{} : f32(bb).slice(lo, hi - lo), 0.05f, momentum,
                       wd, step);
      });
      ASSERT_EQ(a, b) << "sgd momentum " << momentum << " step " << step;
    }
  }
  // Ranges must be sorted, disjoint, non-empty and inside the shard: else a clear error.
  for (const std::vector<fsdp::ElementRange>& bad :
       {std::vector<fsdp::ElementRange>{{5, 10}, {9, 12}}, {{5, 5}}, {{n - 1, n + 1}}, {{-1, 3}}}) {
    Vec x = p0;
    try {
      be->adamw_update(f32(x), f32(x), f32(m), f32(v), 1e-2f, 0.9f, 0.95f, 1e-8f,
                       fsdp::WeightDecay(0.1f, &bad), 1);
      ADD_FAILURE() << "bad ranges accepted, the first [" << bad[0].begin << ", " << bad[0].end << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("adamw_update: weight decay range"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(x, p0) << "nothing is updated before the check";
  }
}

// The optional param_dtype copy of an update (compute_copy: CPU offload's bf16/fp16 copy of
// the host shard, written in the update's pass) equals a cast of the updated param bit for
// bit, and the fp32 param and states equal the update without it: bf16 and fp16, AdamW and
// SGD with and without momentum, weight-decay ranges, sizes that are not multiples of the
// SIMD width or of the tiles and that split over threads, 1 and 2 threads (equal results),
// non-finite, overflowing and subnormal values.
TEST_F(CpuRuntime, ComputeCopyEqualsACastOfTheUpdate) {
  const std::vector<fsdp::ElementRange> ranges = {
      {0, 17}, {18, 2047}, {2049, 20000}, {35000, 35001}, {50000, 70001}};
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{70001}}) {
    Vec p0 = random_vec(n, rng, -2.0f, 2.0f);
    if (n >= 1001) {
      p0[1] = std::numeric_limits<float>::quiet_NaN();
      p0[2] = std::numeric_limits<float>::infinity();
      p0[3] = 70000.0f;  // fp16: rounds to infinity
      p0[4] = 3e-6f;     // fp16 subnormal
      p0[5] = 1e-30f;    // rounds to 0 in fp16
      p0[6] = -0.0f;
    }
    const Vec s0 = random_vec(n, rng, 0.0f, 1e-3f);
    std::vector<Vec> grads;
    for (int step = 0; step < 3; ++step) grads.push_back(random_vec(n, rng, -0.1f, 0.1f));
    const fsdp::WeightDecay wd = n == 70001 ? fsdp::WeightDecay(0.1f, &ranges)
                                            : fsdp::WeightDecay(0.1f);
    for (const DType t : {DType::bf16, DType::f16}) {
      for (int opt = 0; opt < 3; ++opt) {  // adamw, sgd with momentum, sgd without
        std::vector<Vec> fp32_by_threads;
        for (const int threads : {1, 2}) {
          SCOPED_TRACE("n " + std::to_string(n) + " " + std::string(to_string(t)) + " optimizer " +
                       std::to_string(opt) + " threads " + std::to_string(threads));
          const auto b = make_cpu_backend(threads);
          Vec pa = p0, pb = p0, ma = s0, mb = s0, va = s0, vb = s0;
          std::vector<uint16_t> copy(static_cast<std::size_t>(n), 0xdead),
              cast(static_cast<std::size_t>(n), 0xbeef);
          const TensorView cv(copy.data(), t, {n}), kv(cast.data(), t, {n});
          const float mom = opt == 1 ? 0.9f : 0.0f;
          for (int step = 1; step <= 3; ++step) {
            const Vec& g = grads[static_cast<std::size_t>(step - 1)];
            if (opt == 0) {
              b->adamw_update(f32(pa), f32(g), f32(ma), f32(va), 1e-2f, 0.9f, 0.95f, 1e-8f, wd,
                              step, cv);
              b->adamw_update(f32(pb), f32(g), f32(mb), f32(vb), 1e-2f, 0.9f, 0.95f, 1e-8f, wd,
                              step);
            } else {
              b->sgd_update(f32(pa), f32(g), mom == 0 ? TensorView{} : f32(ma), 0.05f, mom, wd,
                            step, cv);
              b->sgd_update(f32(pb), f32(g), mom == 0 ? TensorView{} : f32(mb), 0.05f, mom, wd,
                            step);
            }
            b->cast(kv, f32(pb));
            ASSERT_EQ(copy, cast) << "step " << step;
            // fp32 results: bitwise equal (memcmp: NaN elements compare too)
            ASSERT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * 4), 0) << "param, step " << step;
            ASSERT_EQ(std::memcmp(ma.data(), mb.data(), ma.size() * 4), 0) << "state, step " << step;
            ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * 4), 0) << "state, step " << step;
          }
          fp32_by_threads.push_back(pa);
        }
        EXPECT_EQ(std::memcmp(fp32_by_threads[0].data(), fp32_by_threads[1].data(), 4 * n), 0)
            << "1 and 2 threads differ";
      }
    }
  }
}

// An update's grad_scale (the clip coefficient folded into the step) equals scale_by on the
// gradient followed by the update without it, bit for bit, and leaves the gradient as it is:
// AdamW and SGD with and without momentum, a coefficient below 1 and exactly 1, weight-decay
// ranges, a fused compute_copy, 1 and 2 threads, non-finite and subnormal gradients. A
// grad_scale that is not an fp32 scalar throws naming it.
TEST_F(CpuRuntime, GradScaleEqualsScaleByThenTheUpdate) {
  const std::vector<fsdp::ElementRange> ranges = {{0, 17}, {18, 2047}, {2049, 20000}};
  const int64_t n = 30001;
  const fsdp::WeightDecay wd(0.1f, &ranges);
  for (const float c : {0.37f, 1.0f})
  for (const int threads : {1, 2})
  for (int opt = 0; opt < 3; ++opt) {  // adamw, sgd with momentum, sgd without
    SCOPED_TRACE("coefficient " + std::to_string(c) + " threads " + std::to_string(threads) +
                 " optimizer " + std::to_string(opt));
    const auto b = make_cpu_backend(threads);
    Vec pa = random_vec(n, rng, -2.0f, 2.0f), pb = pa;
    Vec ma = random_vec(n, rng, 0.0f, 1e-3f), mb = ma, va = ma, vb = ma;
    std::vector<uint16_t> copy_a(static_cast<std::size_t>(n)), copy_b = copy_a;
    Vec coef{c};
    const float mom = opt == 1 ? 0.9f : 0.0f;
    for (int step = 1; step <= 3; ++step) {
      Vec g = random_vec(n, rng, -0.1f, 0.1f);
      g[1] = std::numeric_limits<float>::infinity();
      g[2] = 1e-40f;  // subnormal
      g[3] = -0.0f;
      const Vec g0 = g;
      Vec scaled = g;
      b->scale_by(f32(scaled), f32(coef));
      const TensorView ca(copy_a.data(), DType::bf16, {n}), cb(copy_b.data(), DType::bf16, {n});
      if (opt == 0) {
        b->adamw_update(f32(pa), f32(g), f32(ma), f32(va), 1e-2f, 0.9f, 0.95f, 1e-8f, wd, step,
                        ca, f32(coef));
        b->adamw_update(f32(pb), f32(scaled), f32(mb), f32(vb), 1e-2f, 0.9f, 0.95f, 1e-8f, wd,
                        step, cb);
      } else {
        b->sgd_update(f32(pa), f32(g), mom == 0 ? TensorView{} : f32(ma), 0.05f, mom, wd, step,
                      ca, f32(coef));
        b->sgd_update(f32(pb), f32(scaled), mom == 0 ? TensorView{} : f32(mb), 0.05f, mom, wd,
                      step, cb);
      }
      ASSERT_EQ(std::memcmp(g.data(), g0.data(), g.size() * 4), 0) << "grad written, step " << step;
      ASSERT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * 4), 0) << "param, step " << step;
      ASSERT_EQ(std::memcmp(ma.data(), mb.data(), ma.size() * 4), 0) << "state, step " << step;
      ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * 4), 0) << "state, step " << step;
      ASSERT_EQ(copy_a, copy_b) << "compute_copy, step " << step;
    }
  }
  Vec p(8, 1.0f), g(8, 1.0f), m(8), v(8);
  double wide = 1.0;
  uint16_t half = 0x3f80;  // bf16 1.0
  for (const TensorView bad : {TensorView(&wide, DType::f64, {1}), TensorView(&half, DType::bf16, {1}),
                               TensorView(m.data(), DType::f32, {0})}) {
    try {
      be->adamw_update(f32(p), f32(g), f32(m), f32(v), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, {},
                       bad);
      ADD_FAILURE() << "expected fsdp::Error";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("adamw_update: grad_scale"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(be->sgd_update(f32(p), f32(g), f32(m), 0.1f, 0.9f, 0.0f, 1, {}, bad),
                 fsdp::Error);
  }
}

// The CPU backend's fp32 -> fp16 conversion (a branch-free twin of fsdp::f32_to_f16, so that
// casts and the fused compute_copy vectorise) gives f32_to_f16's bits: a sweep of the 2^32
// patterns, every pattern near the subnormal, overflow and infinity boundaries, both signs.
TEST_F(CpuRuntime, Fp16CastEqualsTheScalarConversion) {
  std::vector<uint32_t> bits;
  for (uint64_t x = 0; x < (uint64_t{1} << 32); x += 1021) bits.push_back(static_cast<uint32_t>(x));
  for (const uint32_t edge : {0x33000000u, 0x33800000u, 0x387fe000u, 0x38800000u, 0x477fe000u,
                              0x477ff000u, 0x7f7ff000u, 0x7f800000u, 0x7fc00000u, 0x00000000u}) {
    for (uint32_t d = 0; d < 0x2000u; ++d) {
      bits.push_back(edge + d);
      bits.push_back((edge + d) | 0x80000000u);
      bits.push_back(edge - d);
    }
  }
  Vec src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> got(bits.size());
  be->cast(TensorView(got.data(), DType::f16, {static_cast<int64_t>(got.size())}), f32(src));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (got[i] != f32_to_f16(src[i]) && bad++ < 5) {
      ADD_FAILURE() << std::hex << "0x" << bits[i] << " -> 0x" << got[i] << ", f32_to_f16 0x"
                    << f32_to_f16(src[i]);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// ---------------------------------------------------------------------------------------
// "store bf16/fp16, compute fp32" (tests/cpu_backend_util.hpp)

TEST_F(CpuRuntime, StoreContractMixedDtypes) {
  // axpy with y fp32 and x bf16, and y bf16 and x fp16.
  const int64_t n = 1001;
  const Vec x = rounded(random_vec(n, rng), DType::bf16), y0 = random_vec(n, rng);
  Vec y = y0, yref = y0;
  Store xs(DType::bf16, x);
  be->axpy(f32(y), 0.3f, xs.view());
  be->axpy(f32(yref), 0.3f, f32(x));
  EXPECT_EQ(y, yref);  // fp32 output: no rounding at all
  const Vec y16 = rounded(y0, DType::bf16), x16 = rounded(x, DType::f16);
  Store ys(DType::bf16, y16), xh(DType::f16, x16);
  Vec r = y16;
  be->axpy(ys.view(), -1.7f, xh.view());
  be->axpy(f32(r), -1.7f, f32(x16));
  expect_rounded(DType::bf16, r, ys.values(), "mixed axpy");
}

TEST_F(CpuRuntime, StoreContractArithmetic) {
  for (DType dt : k16) {
    for (int64_t n : {int64_t{13}, int64_t{70001}}) {  // tail only / threaded
      const Vec a = rounded(random_vec(n, rng), dt), b = rounded(random_vec(n, rng), dt);
      const std::string sz = " n=" + std::to_string(n);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store y(st, a), x(st, b);
            be->axpy(y.view(), -0.37f, x.view());
            return Outputs{{y.values()}, {}, {}};
          },
          "axpy" + sz);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store x(st, a);
            float coef = 0.71f;
            be->scale_by(x.view(), f32(Vec{coef}));
            return Outputs{{x.values()}, {}, {}};
          },
          "scale_by" + sz);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store x(st, a);
            double acc = 0.25;
            be->squared_norm(f64(acc), x.view());
            return Outputs{{}, {}, {acc}};
          },
          "squared_norm" + sz);
    }
  }
}

// ---------------------------------------------------------------------------------------
// casts: bit patterns computed by hand

// be->cast from an array of `From` bit patterns/values to `To`.
template <class To, class From>
std::vector<To> do_cast(Backend& be, DType to, DType from, const std::vector<From>& src) {
  std::vector<To> dst(src.size());
  const int64_t n = static_cast<int64_t>(src.size());
  be.cast(TensorView(dst.data(), to, {n}), TensorView(src.data(), from, {n}));
  return dst;
}
template <class T>
std::vector<T> from_bits(const std::vector<uint32_t>& b) {
  std::vector<T> v(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) v[i] = std::bit_cast<float>(b[i]);
  return v;
}
bool is_nan16(DType t, uint16_t h) {
  return t == DType::bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0)
                          : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
}

TEST_F(CpuRuntime, CastF32ToBf16Rounding) {
  const std::vector<uint32_t> in = {0x3F800000,              // 1
                                    0x3F808000,              // 1 + 2^-8: tie, even below -> 1
                                    0x3F818000,              // 1 + 3*2^-8: tie, odd below -> up
                                    0x3F808001,              // just above the tie -> up
                                    0xBF808001,              // negative, just above the tie
                                    0x7F7FFFFF,              // FLT_MAX rounds to inf
                                    0x7F800000, 0xFF800000,  // +-inf
                                    0x80000000,              // -0
                                    0x00010000, 0x00008000,
                                    0x00018000};  // subnormals: exact, tie to 0, tie to 2
  const std::vector<uint16_t> want = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xBF81, 0x7F80,
                                      0x7F80, 0xFF80, 0x8000, 0x0001, 0x0000, 0x0002};
  EXPECT_EQ((do_cast<uint16_t>(*be, DType::bf16, DType::f32, from_bits<float>(in))), want);
  // NaNs stay NaN (quiet, sign kept)
  const auto nan = do_cast<uint16_t>(*be, DType::bf16, DType::f32,
                                     from_bits<float>({0x7FC00000, 0x7F800001, 0xFFC00000}));
  EXPECT_EQ(nan[0], 0x7FC0);
  EXPECT_TRUE(is_nan16(DType::bf16, nan[1]));
  EXPECT_EQ(nan[2], 0xFFC0);
}

TEST_F(CpuRuntime, CastF32ToF16Rounding) {
  const Vec in = {1.0f,
                  -2.0f,
                  0.5f,
                  65504.0f,
                  65519.0f,
                  65520.0f,
                  1e6f,
                  -1e6f,  // max, below/at overflow bound
                  std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(),
                  std::bit_cast<float>(0x3F801000u),  // 1 + 2^-11: tie, even -> 1
                  std::bit_cast<float>(0x3F803000u),  // 1 + 3*2^-11: tie, odd -> up
                  std::ldexp(1.0f, -24),              // smallest subnormal
                  std::ldexp(1.0f, -25),              // tie between 0 and 2^-24 -> 0
                  std::ldexp(3.0f, -25),              // 1.5 * 2^-24: tie -> 2
                  std::ldexp(3.0f, -26),              // 0.75 * 2^-24 -> 1
                  std::ldexp(1.0f, -14),              // smallest normal
                  std::ldexp(1023.0f, -24),           // largest subnormal
                  std::ldexp(2047.0f, -25),           // 1023.5 * 2^-24: tie -> 1024 (normal)
                  std::ldexp(2045.0f, -25),           // 1022.5 * 2^-24: tie -> 1022
                  -std::ldexp(1.0f, -24),
                  1e-10f,
                  -0.0f};
  const std::vector<uint16_t> want = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x7BFF, 0x7C00,
                                      0x7C00, 0xFC00, 0x7C00, 0xFC00, 0x3C00, 0x3C02,
                                      0x0001, 0x0000, 0x0002, 0x0001, 0x0400, 0x03FF,
                                      0x0400, 0x03FE, 0x8001, 0x0000, 0x8000};
  EXPECT_EQ((do_cast<uint16_t>(*be, DType::f16, DType::f32, in)), want);
  const auto nan =
      do_cast<uint16_t>(*be, DType::f16, DType::f32, Vec{std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(is_nan16(DType::f16, nan[0]));
}

TEST_F(CpuRuntime, Cast16BitToWider) {
  const std::vector<uint16_t> h = {0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00,
                                   0xFC00, 0x8000, 0x3C00, 0xC000};
  const std::vector<uint32_t> want = {0x33800000, 0x387FC000, 0x38800000, 0x477FE000, 0x7F800000,
                                      0xFF800000, 0x80000000, 0x3F800000, 0xC0000000};
  const auto f = do_cast<float>(*be, DType::f32, DType::f16, h);
  for (std::size_t i = 0; i < h.size(); ++i) EXPECT_EQ(bits(f[i]), want[i]) << i;
  const auto d = do_cast<double>(*be, DType::f64, DType::f16, h);
  for (std::size_t i = 0; i < h.size(); ++i) EXPECT_EQ(bits(d[i]), bits(static_cast<double>(f[i])));
  EXPECT_TRUE(
      std::isnan(do_cast<float>(*be, DType::f32, DType::f16, std::vector<uint16_t>{0x7E00})[0]));
  const std::vector<uint16_t> b = {0x3F80, 0x0001, 0x7F80, 0xC2F7};
  const auto fb = do_cast<float>(*be, DType::f32, DType::bf16, b);
  EXPECT_EQ(bits(fb[0]), 0x3F800000u);
  EXPECT_EQ(bits(fb[1]), 0x00010000u);
  EXPECT_EQ(bits(fb[2]), 0x7F800000u);
  EXPECT_EQ(fb[3], -123.5f);
  EXPECT_TRUE(
      std::isnan(do_cast<double>(*be, DType::f64, DType::bf16, std::vector<uint16_t>{0xFFC0})[0]));
}

TEST_F(CpuRuntime, CastBetween16BitFormats) {
  // bf16 -> fp16: 1 + 2^-7 exact; 99840 overflows; 2^-24 exact subnormal; 2^-25 ties to 0
  EXPECT_EQ((do_cast<uint16_t>(*be, DType::f16, DType::bf16,
                               std::vector<uint16_t>{0x3F81, 0x47C3, 0x3380, 0x3300, 0xFF80})),
            (std::vector<uint16_t>{0x3C08, 0x7C00, 0x0001, 0x0000, 0xFC00}));
  // fp16 -> bf16: 1 + 2^-10 down; 1 + 6*2^-10 up; 1 + 2^-8 ties to even; 65504 -> 65536
  EXPECT_EQ((do_cast<uint16_t>(*be, DType::bf16, DType::f16,
                               std::vector<uint16_t>{0x3C01, 0x3C06, 0x3C04, 0x7BFF, 0x0001})),
            (std::vector<uint16_t>{0x3F80, 0x3F81, 0x3F80, 0x4780, 0x3380}));
}

TEST_F(CpuRuntime, CastFromF64RoundsOnce) {
  const double inf = std::numeric_limits<double>::infinity();
  // fp64 -> fp32
  const auto f = do_cast<float>(
      *be, DType::f32, DType::f64,
      std::vector<double>{1 + 0x1p-24, 1 + 0x1p-24 + 0x1p-50, 1e300, -1e300, 1e-50, -inf});
  EXPECT_EQ(bits(f[0]), 0x3F800000u);  // tie -> even
  EXPECT_EQ(bits(f[1]), 0x3F800001u);
  EXPECT_EQ(bits(f[2]), 0x7F800000u);
  EXPECT_EQ(bits(f[3]), 0xFF800000u);
  EXPECT_EQ(bits(f[4]), 0u);
  EXPECT_EQ(bits(f[5]), 0xFF800000u);
  // fp64 -> bf16: 1 + 2^-8 + 2^-30 is above the tie: up (via fp32 it would tie to even, down)
  EXPECT_EQ(
      (do_cast<uint16_t>(*be, DType::bf16, DType::f64,
                         std::vector<double>{1 + 0x1p-8 + 0x1p-30, 1 + 0x1p-8, 1 + 0x1p-7 + 0x1p-8,
                                             1e300, 3.5e38, 1e-300, -1e-300, inf})),
      (std::vector<uint16_t>{0x3F81, 0x3F80, 0x3F82, 0x7F80, 0x7F80, 0x0000, 0x8000, 0x7F80}));
  // fp64 -> fp16: the same double-rounding traps, in the normal and subnormal ranges
  EXPECT_EQ((do_cast<uint16_t>(*be, DType::f16, DType::f64,
                               std::vector<double>{1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11, 65519.99,
                                                   65520.0, 0x1p-25 + 0x1p-60, 0x1p-25, -inf})),
            (std::vector<uint16_t>{0x3C01, 0x3C00, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0xFC00}));
  const auto nan = do_cast<uint16_t>(*be, DType::bf16, DType::f64,
                                     std::vector<double>{std::numeric_limits<double>::quiet_NaN()});
  EXPECT_TRUE(is_nan16(DType::bf16, nan[0]));
}

TEST_F(CpuRuntime, CastRoundTrips) {
  // Every 16-bit pattern survives 16 -> fp32 -> 16 and 16 -> fp64 -> 16 (NaNs stay NaN);
  // 65536 elements also take the threaded path.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (DType t : k16) {
    for (DType wide : {DType::f32, DType::f64}) {
      std::vector<uint16_t> back;
      if (wide == DType::f32) {
        back = do_cast<uint16_t>(*be, t, wide, do_cast<float>(*be, wide, t, all));
      } else {
        back = do_cast<uint16_t>(*be, t, wide, do_cast<double>(*be, wide, t, all));
      }
      int bad = 0;
      for (uint32_t i = 0; i < all.size(); ++i) {
        const bool ok = is_nan16(t, all[i]) ? is_nan16(t, back[i]) : back[i] == all[i];
        if (!ok && bad++ < 3)
          ADD_FAILURE() << to_string(t) << " via " << to_string(wide) << ": " << all[i] << " -> "
                        << back[i];
      }
    }
  }
  // fp32 -> 16 -> fp32 is round_to; fp32 -> fp64 -> fp32 and same-dtype casts are exact
  const Vec x = random_vec(40000, rng, -70000.0f, 70000.0f);
  for (DType t : k16) {
    const auto back = do_cast<float>(*be, DType::f32, t, do_cast<uint16_t>(*be, t, DType::f32, x));
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(back[i]), bits(round_to(t, x[i])));
  }
  EXPECT_EQ((do_cast<float>(*be, DType::f32, DType::f64,
                            do_cast<double>(*be, DType::f64, DType::f32, x))),
            x);
  EXPECT_EQ((do_cast<float>(*be, DType::f32, DType::f32, x)), x);
}

// ---------------------------------------------------------------------------------------
// device-scalar reductions, clipping and loss-scale unscaling

TEST_F(CpuRuntime, SquaredNormAccumulates) {
  const Vec x = random_vec(100003, rng);  // several chunks, threaded
  double first = 0.0;
  be->squared_norm(f64(first), f32(x));
  double ref = 0.0;
  for (float v : x) ref += static_cast<double>(v) * v;
  EXPECT_NEAR(first, ref, 1e-12 * ref);
  double acc = 2.5;
  be->squared_norm(f64(acc), f32(x));
  EXPECT_EQ(bits(acc), bits(2.5 + first));         // acc += the same sum
  be->squared_norm(f64(acc), f32(x).slice(0, 0));  // empty: unchanged
  EXPECT_EQ(bits(acc), bits(2.5 + first));
  auto one = make_cpu_backend(1);
  double single = 0.0;
  one->squared_norm(f64(single), f32(x));
  EXPECT_EQ(bits(single), bits(first));
}

TEST_F(CpuRuntime, ClipCoefficient) {
  std::vector<double> parts = {3.0, 4.0, 9.0};  // total 16, norm 4
  double norm = -1.0;
  Vec coef = {-1.0f};
  be->clip_coefficient(f64(norm), f32(coef), TensorView(parts.data(), DType::f64, {3}), 1.0);
  EXPECT_EQ(norm, 4.0);
  EXPECT_EQ(coef[0], static_cast<float>(1.0 / (4.0 + 1e-6)));  // clipping
  for (double max_norm : {10.0, 4.0, 0.0, -1.0}) {             // no clipping: exactly 1
    coef[0] = -1.0f;
    be->clip_coefficient(f64(norm), f32(coef), TensorView(parts.data(), DType::f64, {3}), max_norm);
    EXPECT_EQ(norm, 4.0);
    EXPECT_EQ(bits(coef[0]), bits(1.0f)) << "max_norm " << max_norm;
  }
  // parts are summed in index order: (1e16 + 1) - 1e16 = 0 in double
  parts = {1e16, 1.0, -1e16};
  be->clip_coefficient(f64(norm), f32(coef), TensorView(parts.data(), DType::f64, {3}), 1.0);
  EXPECT_EQ(norm, 0.0);
  EXPECT_EQ(coef[0], 1.0f);
  // scaling by a coefficient of exactly 1 leaves gradients bitwise unchanged, in any dtype
  const Vec g = random_vec(1000, rng);
  Vec h = g;
  be->scale_by(f32(h), f32(coef));
  EXPECT_EQ(h, g);
  Store s(DType::bf16, rounded(g, DType::bf16));
  be->scale_by(s.view(), f32(coef));
  EXPECT_EQ(s.values(), rounded(g, DType::bf16));
  coef[0] = 0.5f;
  be->scale_by(f32(h), f32(coef));
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(h[i], g[i] * 0.5f);
}

TEST_F(CpuRuntime, UnscaleAndCheck) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // finite: unscaled, found_inf untouched (0 stays 0, 1 stays 1)
  Vec x = {2.0f, -4.0f, 1e-3f};
  double found = 0.0;
  be->unscale_and_check(f32(x), 0.5f, f64(found));
  EXPECT_EQ(x, (Vec{1.0f, -2.0f, 0.5e-3f}));
  EXPECT_EQ(found, 0.0);
  found = 1.0;
  be->unscale_and_check(f32(x), 1.0f, f64(found));
  EXPECT_EQ(found, 1.0);
  // inf, -inf and NaN set it
  for (float bad : {inf, -inf, nan}) {
    Vec y = {1.0f, bad, 4.0f};
    found = 0.0;
    be->unscale_and_check(f32(y), 0.25f, f64(found));
    EXPECT_EQ(found, 1.0) << bad;
    EXPECT_EQ(y[0], 0.25f);
    EXPECT_EQ(y[2], 1.0f);
  }
  // threaded, the bad element at the very end
  Vec big = random_vec(100001, rng);
  found = 0.0;
  be->unscale_and_check(f32(big), 0.5f, f64(found));
  EXPECT_EQ(found, 0.0);
  big.back() = nan;
  be->unscale_and_check(f32(big), 0.5f, f64(found));
  EXPECT_EQ(found, 1.0);
}

// ---------------------------------------------------------------------------------------
// argument checks (expect_arg_error: tests/cpu_backend_util.hpp)

TEST_F(CpuRuntime, RejectsWrongDtypesAndSmallViews) {
  Vec a(64, 0.5f), b(64, 0.5f), c(64, 0.5f), d(64, 0.5f);
  std::vector<uint16_t> h(64, 0);
  const TensorView bf(h.data(), DType::bf16, {64});
  const Tokens tok(8, 0);
  double s = 0.0;
  auto sv = [&] { return f64(s); };
  expect_arg_error([&] { be->axpy(f32(a), 1.0f, TensorView(d.data(), DType::f64, {8})); }, "axpy",
                   "x");
  expect_arg_error([&] { be->squared_norm(f32(a).slice(0, 1), f32(b)); }, "squared_norm", "acc");
  expect_arg_error([&] { be->squared_norm(TensorView(&s, DType::f64, {0}), f32(b)); },
                   "squared_norm", "acc");
  expect_arg_error(
      [&] { be->adamw_update(f32(a), bf, f32(c), f32(d), 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f, 1); },
      "adamw_update", "grad");
  expect_arg_error(
      [&] { be->adamw_update(bf, f32(b), f32(c), f32(d), 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f, 1); },
      "adamw_update", "param");
  expect_arg_error(
      [&] {
        be->adamw_update(f32(a), f32(b), f32(c).slice(0, 63), f32(d), 0.1f, 0.9f, 0.99f, 1e-8f,
                         0.0f, 1);
      },
      "adamw_update", "exp_avg");
  expect_arg_error([&] { be->sgd_update(f32(a), f32(b), TensorView{}, 0.1f, 0.9f, 0.0f, 1); },
                   "sgd_update", "momentum_buf");
  expect_arg_error(  // compute_copy: none, bf16 or fp16, n elements
      [&] { be->adamw_update(f32(a), f32(b), f32(c), f32(d), 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f, 1, f32(d)); },
      "adamw_update", "compute_copy");
  expect_arg_error(
      [&] { be->sgd_update(f32(a), f32(b), f32(c), 0.1f, 0.9f, 0.0f, 1, bf.slice(0, 63)); },
      "sgd_update", "compute_copy");
  expect_arg_error([&] { be->unscale_and_check(bf, 0.5f, sv()); }, "unscale_and_check", "x");
  expect_arg_error([&] { be->unscale_and_check(f32(a), 0.5f, f32(b)); }, "unscale_and_check",
                   "found_inf");
  expect_arg_error([&] { be->scale_by(f32(a), TensorView(&s, DType::f64, {1})); }, "scale_by",
                   "coef");
  expect_arg_error([&] { be->clip_coefficient(sv(), f32(a), f32(b), 1.0); }, "clip_coefficient",
                   "parts");
  expect_arg_error([&] { be->clip_coefficient(sv(), bf, TensorView(&s, DType::f64, {1}), 1.0); },
                   "clip_coefficient", "coef");
  expect_arg_error([&] { be->copy(f32(a), bf); }, "copy", "dst");
  expect_arg_error([&] { be->cast(f32(a), bf.slice(0, 8)); }, "cast", "dst");
  expect_arg_error([&] { be->cast(f32(a).slice(0, 8), i32(tok)); }, "cast", "src");
}

// ---------------------------------------------------------------------------------------
// the stream-ordered caching allocator

// An Event that stays pending until flipped, or until synchronize() (which completes it).
class ManualEvent final : public Event {
 public:
  void record(Stream&) override {}
  void synchronize() override {
    ++syncs;
    done = true;
  }
  bool query() override { return done; }
  bool done = false;
  int syncs = 0;
};

TEST_F(CpuRuntime, AllocatorReusesFreedBlocks) {
  const AllocatorStats& st = be->allocator_stats();
  void* p = be->allocate(1000, MemCategory::activations);
  const int64_t raw = st.raw_allocs, hits = st.cache_hits;
  EXPECT_EQ(st.reserved_bytes, 1024);  // size class: 512-byte multiples
  EXPECT_EQ(be->memory().current(MemCategory::activations), 1000u);  // logical bytes
  be->deallocate(p, 1000, MemCategory::activations);
  EXPECT_EQ(be->memory().current(MemCategory::activations), 0u);
  void* q = be->allocate(1000, MemCategory::grads);
  EXPECT_EQ(q, p);
  EXPECT_EQ(st.raw_allocs, raw);
  EXPECT_EQ(st.cache_hits, hits + 1);
  EXPECT_EQ(be->memory().current(MemCategory::grads), 1000u);
  be->deallocate(q, 1000, MemCategory::grads);
  void* r = be->allocate(600, MemCategory::other);  // same 1024-byte class
  EXPECT_EQ(r, p);
  EXPECT_EQ(be->memory().current(MemCategory::other), 600u);
  void* s = be->allocate(600, MemCategory::other);  // class empty: a new raw block
  EXPECT_NE(s, p);
  EXPECT_EQ(st.raw_allocs, raw + 1);
  EXPECT_EQ(st.reserved_bytes, 2048);
  be->deallocate(r, 600, MemCategory::other);
  be->deallocate(s, 600, MemCategory::other);
  EXPECT_EQ(be->memory().current_total(), 0u);
  EXPECT_EQ(st.raw_frees, 0);
}

TEST_F(CpuRuntime, AllocatorWaitsForPendingEvent) {
  const AllocatorStats& st = be->allocator_stats();
  void* p = be->allocate(4096, MemCategory::comm_buffers);
  void* q = be->allocate(4096, MemCategory::comm_buffers);
  auto ev = std::make_shared<ManualEvent>();
  be->deallocate(p, 4096, MemCategory::comm_buffers, ev);  // e.g. a reduce-scatter input
  be->deallocate(q, 4096, MemCategory::comm_buffers);
  // The ready block is preferred; the pending one is neither handed out nor waited on.
  EXPECT_EQ(be->allocate(4096, MemCategory::comm_buffers), q);
  EXPECT_EQ(ev->syncs, 0);
  EXPECT_FALSE(ev->done);
  // Only the pending block is left: the host stream waits on the event (synchronizes it)
  // before the block is returned.
  const int64_t raw = st.raw_allocs;
  EXPECT_EQ(be->allocate(4096, MemCategory::comm_buffers), p);
  EXPECT_EQ(ev->syncs, 1);
  EXPECT_TRUE(ev->done);
  EXPECT_EQ(st.raw_allocs, raw);
  // An event that completed on its own is not waited on.
  auto ev2 = std::make_shared<ManualEvent>();
  be->deallocate(p, 4096, MemCategory::comm_buffers, ev2);
  ev2->done = true;
  EXPECT_EQ(be->allocate(4096, MemCategory::comm_buffers), p);
  EXPECT_EQ(ev2->syncs, 0);
  be->deallocate(p, 4096, MemCategory::comm_buffers);
  be->deallocate(q, 4096, MemCategory::comm_buffers);
  EXPECT_EQ(be->memory().current_total(), 0u);
}

// A CachingAllocator over a raw allocator with a byte budget, counting its calls.
struct BudgetRaw {
  explicit BudgetRaw(std::size_t bytes) : budget(bytes) {}
  std::size_t budget, live = 0;
  int allocs = 0, frees = 0;
  std::vector<std::pair<void*, std::size_t>> blocks;
  void* alloc(std::size_t n) {
    if (live + n > budget) return nullptr;
    void* p = std::aligned_alloc(256, n);
    live += n;
    ++allocs;
    blocks.emplace_back(p, n);
    return p;
  }
  void free(void* p) {
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      if (it->first == p) {
        live -= it->second;
        blocks.erase(it);
        break;
      }
    }
    ++frees;
    std::free(p);
  }
};

TEST(CachingAllocatorTest, EmptyCacheReleasesCompletedBlocks) {
  BudgetRaw raw{1 << 20};
  MemoryTracker mem;
  HostStream stream;
  {
    CachingAllocator alloc([&](std::size_t n) { return raw.alloc(n); },
                           [&](void* p) { raw.free(p); }, mem);
    void* a = alloc.allocate(100, MemCategory::other, stream);
    void* b = alloc.allocate(5000, MemCategory::other, stream);
    void* c = alloc.allocate(20000, MemCategory::other, stream);
    EXPECT_EQ(mem.current_total(), 25100u);  // logical bytes
    EXPECT_EQ(alloc.stats().reserved_bytes, 512 + 5120 + 20480);
    auto ev = std::make_shared<ManualEvent>();
    alloc.deallocate(a, 100, MemCategory::other);
    alloc.deallocate(b, 5000, MemCategory::other, ev);
    EXPECT_EQ(mem.current_total(), 20000u);
    alloc.empty_cache();  // a goes back; b waits for its event
    EXPECT_EQ(raw.frees, 1);
    EXPECT_EQ(alloc.stats().raw_frees, 1);
    EXPECT_EQ(alloc.stats().reserved_bytes, 5120 + 20480);
    EXPECT_EQ(ev->syncs, 0);
    ev->done = true;
    alloc.empty_cache();
    EXPECT_EQ(raw.frees, 2);
    EXPECT_EQ(alloc.stats().reserved_bytes, 20480);
    // emptied: the next allocation of a's size is a raw one
    void* a2 = alloc.allocate(100, MemCategory::other, stream);
    EXPECT_EQ(raw.allocs, 4);
    alloc.deallocate(a2, 100, MemCategory::other);
    alloc.deallocate(c, 20000, MemCategory::other);
    EXPECT_EQ(mem.current_total(), 0u);
  }
  EXPECT_EQ(raw.live, 0u);  // the destructor returned the cached blocks
}

// Default reuse takes the oldest block whose work is done; ordered reuse (train.cuda_graphs)
// takes the lowest address whatever the device's progress, the stream waiting on its work.
TEST(CachingAllocatorTest, OrderedReuseTakesTheLowestAddress) {
  MemoryTracker mem;
  HostStream stream;
  CachingAllocator alloc([](std::size_t n) { return std::aligned_alloc(256, n); },
                         [](void* p) { std::free(p); }, mem);
  for (const bool ordered : {false, true}) {
    alloc.set_ordered_reuse(ordered);
    void* x = alloc.allocate(1000, MemCategory::other, stream);
    void* y = alloc.allocate(1000, MemCategory::other, stream);
    void* lo = std::less<void*>()(x, y) ? x : y;
    void* hi = lo == x ? y : x;
    auto busy = std::make_shared<ManualEvent>();
    alloc.deallocate(lo, 1000, MemCategory::other, busy);  // older, its work not done
    alloc.deallocate(hi, 1000, MemCategory::other);
    void* got = alloc.allocate(1000, MemCategory::other, stream);
    EXPECT_EQ(got, ordered ? lo : hi) << (ordered ? "ordered" : "default");
    EXPECT_EQ(busy->syncs, ordered ? 1 : 0) << "the stream waits on the work it reuses after";
    void* other = alloc.allocate(1000, MemCategory::other, stream);
    EXPECT_EQ(other, ordered ? hi : lo);
    // Freed and taken again in another order: ordered reuse hands out the same places.
    alloc.deallocate(got, 1000, MemCategory::other);
    alloc.deallocate(other, 1000, MemCategory::other);
    if (ordered) {
      EXPECT_EQ(alloc.allocate(1000, MemCategory::other, stream), lo);
      EXPECT_EQ(alloc.allocate(1000, MemCategory::other, stream), hi);
      alloc.deallocate(lo, 1000, MemCategory::other);
      alloc.deallocate(hi, 1000, MemCategory::other);
    }
    alloc.empty_cache();
  }
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesCacheThenThrows) {
  BudgetRaw raw{3072};
  MemoryTracker mem;
  HostStream stream;
  CachingAllocator alloc([&](std::size_t n) { return raw.alloc(n); }, [&](void* p) { raw.free(p); },
                         mem);
  void* a = alloc.allocate(1024, MemCategory::other, stream);
  alloc.deallocate(a, 1024, MemCategory::other);               // cached, still reserved
  void* b = alloc.allocate(3072, MemCategory::grads, stream);  // fits only once a is released
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(raw.frees, 1);
  try {
    alloc.allocate(4096, MemCategory::activations, stream);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(mem.current_total(), 3072u);
  alloc.deallocate(b, 3072, MemCategory::grads);
}

}  // namespace
}  // namespace fsdp
