// tests/test_cuda_device_runtime.cpp: the CUDA backend's DeviceRuntime half (fsdp/backend/
// device_runtime.hpp) against its CPU twin: device, streams and events, the stream-ordered
// caching allocator over cudaMalloc, fill/copy/host round trips, casts between every pair of
// float types bit for bit, the flat-shard arithmetic (axpy, scale_by, squared norm, clip
// coefficient, loss-scale unscaling), AdamW and SGD, bitwise repeatability of the squared norm,
// and the argument checks of these operations. Method and tolerances: tests/cuda_backend_pair.hpp.
// The model kernels are tests/test_cuda_kernels.cpp's. Runs only where a CUDA device is
// visible (gpu_main.cpp exits 77, "not run", elsewhere).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend_pair.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/core/caching_allocator.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/device.hpp"

namespace fsdp {
namespace {

using namespace cuda_test;

// ---------------------------------------------------------------------------------------
// memory

TEST(CudaRuntime, DeviceAndStreams) {
  EXPECT_EQ(gpu().device(), Device::cuda);
  EXPECT_EQ(gpu().compute_stream().device(), Device::cuda);
  auto s = gpu().create_stream();
  auto e = gpu().create_event();
  e->record(gpu().compute_stream());
  s->wait(*e);
  s->synchronize();
  e->synchronize();
  EXPECT_TRUE(e->query());
}

TEST(CudaRuntime, CachingAllocatorReusesBlocks) {
  Backend& g = gpu();
  EXPECT_EQ(g.allocate(0, MemCategory::other), nullptr);
  const AllocatorStats before = g.allocator_stats();
  const std::size_t used = g.memory().current(MemCategory::other);
  // A size no other test uses, so the first allocation is a raw one.
  constexpr std::size_t kBytes = 3000011, kSameClass = 3000100;
  void* p = g.allocate(kBytes, MemCategory::other);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_EQ(g.memory().current(MemCategory::other), used + kBytes);
  EXPECT_EQ(g.allocator_stats().raw_allocs, before.raw_allocs + 1);
  g.deallocate(p, kBytes, MemCategory::other);
  EXPECT_EQ(g.memory().current(MemCategory::other), used);
  // Same size class (both round up to the same multiple of 512): served from the cache.
  ASSERT_EQ(CachingAllocator::round_size(kBytes), CachingAllocator::round_size(kSameClass));
  void* q = g.allocate(kSameClass, MemCategory::other);
  EXPECT_EQ(q, p);
  EXPECT_EQ(g.allocator_stats().raw_allocs, before.raw_allocs + 1);
  EXPECT_EQ(g.allocator_stats().cache_hits, before.cache_hits + 1);
  // A block freed with a pending event is reused after the stream waits on it.
  auto ev = std::shared_ptr<Event>(g.create_event());
  ev->record(g.compute_stream());
  g.deallocate(q, kSameClass, MemCategory::other, ev);
  void* r = g.allocate(kBytes, MemCategory::other);
  EXPECT_EQ(r, p);
  EXPECT_EQ(g.allocator_stats().raw_allocs, before.raw_allocs + 1);
  g.deallocate(r, kBytes, MemCategory::other);
}

TEST(CudaRuntime, FillZeroCopyAndHostRoundTrip) {
  std::mt19937 rng(1);
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name(t));
    const Vec v = uniform(1001, rng);
    Pair a = make(t, v), b = make(t, Vec(1001, 5.0f));
    EXPECT_TRUE(read_bytes(gpu(), a.v(kGpu)) == encode(t, v));
    both([&](Backend& be, Side s) { be.copy(b.v(s), a.v(s)); });
    check(b, kExact, "copy");
    both([&](Backend& be, Side s) { be.fill_zero(a.v(s, 3, 995)); });
    check(a, kExact, "fill_zero of a slice");
  }
}

// Page-locked host memory both ways (cudaHostAlloc below 64 MiB; mapped, touched by 4
// threads and cudaHostRegister'ed from 64 MiB): the driver sees each as pinned host memory, a
// device round trip through it returns the pattern, and each is freed the way it was made.
TEST(CudaRuntime, PinnedHostAllocBothWays) {
  for (const std::size_t bytes : {std::size_t{1} << 20, (std::size_t{96} << 20) + 12}) {
    SCOPED_TRACE(bytes);
    auto* h = static_cast<uint32_t*>(cuda::pinned_host_alloc(bytes, 4));
    ASSERT_NE(h, nullptr);
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, h), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost);
    const std::size_t n = bytes / sizeof(uint32_t);
    for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<uint32_t>(i * 2654435761u);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, nullptr), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    std::memset(h, 0, bytes);
    ASSERT_EQ(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += h[i] != static_cast<uint32_t>(i * 2654435761u);
    EXPECT_EQ(wrong, 0u);
    cudaFree(d);
    cuda::pinned_host_free(h);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  cuda::pinned_host_free(nullptr);
}

// FSDP_SMALL_READS=kernel: copy_to_host of at most 4096 bytes goes through one kernel into
// mapped host memory (words or bytes), larger reads through cudaMemcpyAsync as before; both
// return the device's bytes, an index error recorded on the device is raised by the read that
// follows it (once) and by synchronize(), and another value of the variable is refused.
TEST(CudaRuntime, KernelSmallReadsReturnTheDeviceBytesAndErrors) {
  auto backend_with = [](const char* value) {
    ::setenv("FSDP_SMALL_READS", value, 1);
    std::unique_ptr<Backend> be;
    std::string error;
    try {
      be = cuda::make_cuda_backend(0);
    } catch (const Error& e) {
      error = e.what();
    }
    ::unsetenv("FSDP_SMALL_READS");
    return std::make_pair(std::move(be), error);
  };
  auto [be, error] = backend_with("kernel");
  ASSERT_TRUE(be) << error;
  std::mt19937 rng(5);
  // bytes: empty, odd (the byte path), words, the limit, one past it, and a large read
  for (const int64_t bytes : {0, 1, 3, 6, 8, 24, 264, 4095, 4096, 4097, 1 << 20}) {
    SCOPED_TRACE(bytes);
    Bytes want(static_cast<std::size_t>(bytes));
    for (auto& b : want) b = static_cast<unsigned char>(rng());
    DeviceBuffer buf(*be, DType::u8, bytes, MemCategory::other);
    if (bytes > 0) be->copy_from_host(buf.view(), want.data());
    Bytes got(static_cast<std::size_t>(bytes) + 1, 0xAB);  // one guard byte after
    be->copy_to_host(got.data(), buf.view());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
    EXPECT_EQ(got.back(), 0xAB) << "wrote past the read";
    if (bytes >= 8) {  // a read at an odd device address (the byte path)
      Bytes tail(static_cast<std::size_t>(bytes - 1));
      be->copy_to_host(tail.data(), TensorView(static_cast<unsigned char*>(buf.view().data) + 1,
                                               DType::u8, {bytes - 1}));
      EXPECT_TRUE(std::equal(want.begin() + 1, want.end(), tail.begin()));
    }
  }
  // An index error: raised by the small read after the kernel that recorded it, then cleared.
  DeviceBuffer tokens(*be, DType::i32, 3, MemCategory::other);
  const int32_t bad[3] = {0, 7, 1};
  be->copy_from_host(tokens.view(), bad);
  DeviceBuffer wte = DeviceBuffer::floats(*be, 4 * 8, MemCategory::other);
  DeviceBuffer wpe = DeviceBuffer::floats(*be, 3 * 8, MemCategory::other);
  DeviceBuffer out = DeviceBuffer::floats(*be, 3 * 8, MemCategory::other);
  be->fill_zero(wte.view());
  be->fill_zero(wpe.view());
  be->embedding_forward(out.view(), tokens.view(), wte.view(), wpe.view(), 1, 3, 8);
  float first = -1;
  try {
    be->copy_to_host(&first, TensorView(out.view().data, DType::f32, {1}));
    ADD_FAILURE() << "no error for token 7 of 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens holds 7 at position 1"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(be->copy_to_host(&first, TensorView(out.view().data, DType::f32, {1})));
  be->embedding_forward(out.view(), tokens.view(), wte.view(), wpe.view(), 1, 3, 8);
  EXPECT_THROW(be->synchronize(), Error);  // fetch_device_error's kernel path
  EXPECT_NO_THROW(be->synchronize());
  // Another value is refused, naming the variable.
  auto [refused, why] = backend_with("dma");
  EXPECT_FALSE(refused);
  EXPECT_NE(why.find("FSDP_SMALL_READS=dma"), std::string::npos) << why;
}

// ---------------------------------------------------------------------------------------
// casts: every pair of fp32 / fp64 / bf16 / fp16, bit for bit (any NaN for a NaN)

TEST(CudaRuntime, CastEveryPairBitExact) {
  std::mt19937 rng(2);
  std::vector<double> vals = {0.0,
                              -0.0,
                              1.0,
                              -1.0,
                              65504.0,
                              65519.0,
                              65520.0,
                              70000.0,
                              1e-8,
                              6e-8,
                              3e-5,
                              1e-40,
                              3.0e38,
                              1e300,
                              -1e300,
                              1e-300,
                              std::numeric_limits<double>::infinity(),
                              -std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::quiet_NaN(),
                              1.0 + std::ldexp(1.0, -8),                         // bf16 tie
                              1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40),  // just above
                              1.0 + 3 * std::ldexp(1.0, -8),                     // tie, odd
                              1.0 + std::ldexp(1.0, -11),                        // fp16 tie
                              1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -45),
                              1.0 + std::ldexp(1.0, -24) + std::ldexp(1.0, -50)};  // fp32
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int i = 0; i < 1000; ++i) vals.push_back(nd(rng) * std::pow(10.0, i % 13 - 6));
  const auto n = static_cast<int64_t>(vals.size());
  Pair f64 = make_f64(vals);
  const DType all[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  for (DType from : all) {
    // The source values in `from`, rounded by the CPU backend, on both sides.
    Pair src = make_bytes(from, n, Bytes(static_cast<std::size_t>(n) * dtype_size(from)));
    cpu().cast(src.v(kCpu), f64.v(kCpu));
    src.cpu_to_gpu();
    for (DType to : all) {
      SCOPED_TRACE(name(from) + " -> " + name(to));
      Pair dst = make_bytes(to, n, Bytes(static_cast<std::size_t>(n) * dtype_size(to)));
      // Bit-exact, except that a NaN may come back with another payload.
      auto compare = [&](const char* what) {
        const Bytes c = read_bytes(cpu(), dst.v(kCpu)), g = read_bytes(gpu(), dst.v(kGpu));
        const std::vector<double> cd = decode(to, c), gd = decode(to, g);
        const std::size_t w = dtype_size(to);
        int bad = 0;
        for (std::size_t i = 0; i < cd.size(); ++i) {
          if (std::isnan(cd[i]) && std::isnan(gd[i])) continue;
          if (std::memcmp(&c[i * w], &g[i * w], w) != 0 && bad++ < 3) {
            ADD_FAILURE() << what << ": element " << i << " (" << vals[i] << "): cpu " << cd[i]
                          << ", cuda " << gd[i];
          }
        }
        EXPECT_EQ(bad, 0) << what;
      };
      both([&](Backend& be, Side s) { be.cast(dst.v(s), src.v(s)); });
      compare("aligned");
      // Views one element in: the element-by-element path.
      both([&](Backend& be, Side s) { be.fill_zero(dst.v(s)); });
      both([&](Backend& be, Side s) { be.cast(dst.v(s, 1, n - 2), src.v(s, 1, n - 2)); });
      compare("unaligned");
    }
  }
}

// ---------------------------------------------------------------------------------------
// flat-shard arithmetic

TEST(CudaRuntime, AxpyAndScaleBy) {
  std::mt19937 rng(6);
  const int64_t n = 100003;  // odd: vector body + scalar tail
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name(t));
    const Tol tol = tol_for(t, kElemF32);
    Pair o = make(t, uniform(n, rng));
    for (DType tx : kFloatTypes) {
      SCOPED_TRACE("axpy x " + name(tx));
      Pair x = make(tx, uniform(n, rng));
      both([&](Backend& be, Side s) { be.axpy(o.v(s), -0.37f, x.v(s)); });
      check_sync(o, tol, "axpy");
    }
    Pair coef = make(DType::f32, {0.3f});
    both([&](Backend& be, Side s) { be.scale_by(o.v(s), coef.v(s)); });
    check_sync(o, tol, "scale_by");
  }
}

// ---------------------------------------------------------------------------------------
// device scalars

TEST(CudaRuntime, SquaredNormClipCoefficientUnscale) {
  std::mt19937 rng(10);
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}, int64_t{3000017}}) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      Pair x = make(t, uniform(n, rng)), acc = make_f64({3.5});
      both([&](Backend& be, Side s) { be.squared_norm(acc.v(s), x.v(s)); });
      check(acc, {1e-12, 0.0}, "squared_norm (accumulates)");
    }
  }
  Pair parts = make_f64({1.0, 2.0, 3.0, 0.25});
  for (double max_norm : {1.0, 10.0, 0.0, 2.5}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    Pair norm = make_f64({-1.0}), coef = make(DType::f32, {-1.0f});
    both([&](Backend& be, Side s) {
      be.clip_coefficient(norm.v(s), coef.v(s), parts.v(s), max_norm);
    });
    check(norm, kExact, "norm");
    check(coef, kExact, "coef");
  }
  // Loss-scale unscaling: found_inf is set to 1 by an inf or a NaN, left alone otherwise.
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE("kind " + std::to_string(kind));
    Vec v = uniform(10007, rng);
    if (kind == 1) v[5003] = std::numeric_limits<float>::infinity();
    if (kind == 2) v[10006] = std::nanf("");
    Pair x = make(DType::f32, v), found = make_f64({0.0});
    both([&](Backend& be, Side s) { be.unscale_and_check(x.v(s), 0.125f, found.v(s)); });
    check(x, kExact, "x * inv_scale");
    check(found, kExact, "found_inf");
    EXPECT_EQ(read(gpu(), found.v(kGpu))[0], kind == 0 ? 0.0 : 1.0);
  }
}

// ---------------------------------------------------------------------------------------
// optimizers

// Bit for bit equal to the CPU backend: both run fsdp/backend/optimizer_math.hpp's element
// updates (explicit FMAs), so an offloaded step on the host and a step on the device agree;
// the same with a grad_scale (the clip coefficient, read from a device scalar) at step 2.
TEST(CudaRuntime, AdamWAndSgd) {
  std::mt19937 rng(16);
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{65539}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    Pair p = make(DType::f32, uniform(n, rng)), m = make(DType::f32, Vec(n)),
         v = make(DType::f32, Vec(n)), coef = make(DType::f32, Vec{0.37f});
    for (int64_t step = 1; step <= 3; ++step) {
      Pair g = make(DType::f32, uniform(n, rng, -0.1f, 0.1f));
      both([&](Backend& be, Side s) {
        be.adamw_update(p.v(s), g.v(s), m.v(s), v.v(s), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, step,
                        TensorView(), step == 2 ? coef.v(s) : TensorView());
      });
      check_sync(p, kExact, "adamw param");
      check_sync(m, kExact, "adamw exp_avg");
      check_sync(v, kExact, "adamw exp_avg_sq");
    }
    for (float momentum : {0.0f, 0.9f}) {
      Pair buf = make(DType::f32, uniform(n, rng));  // garbage before step 1
      for (int64_t step = 1; step <= 2; ++step) {
        Pair g = make(DType::f32, uniform(n, rng));
        both([&](Backend& be, Side s) {
          const TensorView b = momentum == 0.0f ? TensorView() : buf.v(s);
          be.sgd_update(p.v(s), g.v(s), b, 0.05f, momentum, 1e-2f, step, TensorView(),
                        step == 2 ? coef.v(s) : TensorView());
        });
        check_sync(p, kExact, "sgd param");
        if (momentum != 0.0f) check_sync(buf, kExact, "sgd momentum");
      }
    }
  }
}

// Weight-decay ranges: as kernel arguments (up to kMaxDecayRanges) and piece by piece past
// that, against the CPU twin.
TEST(CudaRuntime, AdamWAndSgdWithDecayRanges) {
  std::mt19937 rng(18);
  const int64_t n = 65539;
  std::vector<fsdp::ElementRange> few = {{0, 3}, {4, 1000}, {1001, 1002}, {40000, n}}, many;
  for (int64_t b = 1; b + 7 < n && many.size() < 40; b += 1601) many.push_back({b, b + 7 + b % 5});
  for (const auto* ranges : {&few, &many}) {
    SCOPED_TRACE(std::to_string(ranges->size()) + " ranges");
    const fsdp::WeightDecay wd(0.1f, ranges);
    Pair p = make(DType::f32, uniform(n, rng)), m = make(DType::f32, Vec(n)),
         v = make(DType::f32, Vec(n));
    for (int64_t step = 1; step <= 3; ++step) {
      Pair g = make(DType::f32, uniform(n, rng, -0.1f, 0.1f));
      both([&](Backend& be, Side s) {
        be.adamw_update(p.v(s), g.v(s), m.v(s), v.v(s), 1e-3f, 0.9f, 0.999f, 1e-8f, wd, step);
      });
      check_sync(p, kExact, "adamw param");
      check_sync(m, kExact, "adamw exp_avg");
      check_sync(v, kExact, "adamw exp_avg_sq");
    }
    for (float momentum : {0.0f, 0.9f}) {
      Pair buf = make(DType::f32, uniform(n, rng));
      for (int64_t step = 1; step <= 2; ++step) {
        Pair g = make(DType::f32, uniform(n, rng));
        both([&](Backend& be, Side s) {
          const TensorView b = momentum == 0.0f ? TensorView() : buf.v(s);
          be.sgd_update(p.v(s), g.v(s), b, 0.05f, momentum, wd, step);
        });
        check_sync(p, kExact, "sgd param");
        if (momentum != 0.0f) check_sync(buf, kExact, "sgd momentum");
      }
    }
  }
}

// A fused param_dtype copy (compute_copy, CPU offload's) equals a cast of the updated param
// bit for bit, and the fp32 results equal the update without it: on the float4 path and on
// misaligned views (the scalar path), with weight-decay ranges as kernel arguments and piece
// by piece, for AdamW and SGD with and without momentum.
TEST(CudaRuntime, UpdateWithComputeCopyEqualsUpdateThenCast) {
  Backend& g = gpu();
  std::mt19937 rng(19);
  const int64_t n = 65539, len = n - 1;
  std::vector<fsdp::ElementRange> few = {{0, 3}, {4, 1000}, {40000, len}}, many;
  for (int64_t b = 1; b + 12 < len && many.size() < 40; b += 1601) many.push_back({b, b + 7 + b % 5});
  auto upload = [&](const Vec& x) {
    DeviceBuffer d(g, DType::f32, n, MemCategory::other);
    g.copy_from_host(d.view(), x.data());
    return d;
  };
  for (DType t : {DType::bf16, DType::f16}) {
    for (int64_t off : {int64_t{0}, int64_t{1}}) {  // 1: misaligned views (the scalar path)
      for (const auto* ranges : {&few, &many}) {
        SCOPED_TRACE(name(t) + " offset " + std::to_string(off) + ", " +
                     std::to_string(ranges->size()) + " ranges");
        const fsdp::WeightDecay wd(0.1f, ranges);
        Vec p0 = uniform(n, rng, -2.0f, 2.0f);
        p0[5] = 70000.0f;  // fp16 overflow: inf in both
        p0[9] = 1e-6f;     // an fp16 subnormal
        const Vec g0 = uniform(n, rng, -0.1f, 0.1f), s0 = uniform(n, rng, 0.0f, 1e-3f);
        for (int opt = 0; opt < 3; ++opt) {  // adamw, sgd with momentum, sgd without
          SCOPED_TRACE("optimizer " + std::to_string(opt));
          DeviceBuffer pa = upload(p0), pb = upload(p0), gr = upload(g0), ma = upload(s0),
                       mb = upload(s0), va = upload(s0), vb = upload(s0);
          DeviceBuffer copy(g, t, n, MemCategory::other), cast(g, t, n, MemCategory::other);
          auto part = [&](const DeviceBuffer& b) { return b.view().slice(off, len); };
          const float mom = opt == 1 ? 0.9f : 0.0f;
          for (int64_t step = 1; step <= 2; ++step) {
            if (opt == 0) {
              g.adamw_update(part(pa), part(gr), part(ma), part(va), 1e-3f, 0.9f, 0.999f, 1e-8f,
                             wd, step, part(copy));
              g.adamw_update(part(pb), part(gr), part(mb), part(vb), 1e-3f, 0.9f, 0.999f, 1e-8f,
                             wd, step);
            } else {
              g.sgd_update(part(pa), part(gr), mom == 0.0f ? TensorView() : part(ma), 0.05f, mom,
                           wd, step, part(copy));
              g.sgd_update(part(pb), part(gr), mom == 0.0f ? TensorView() : part(mb), 0.05f, mom,
                           wd, step);
            }
            g.cast(part(cast), part(pb));
            EXPECT_TRUE(read_bytes(g, part(copy)) == read_bytes(g, part(cast)))
                << "compute_copy != cast, step " << step;
            EXPECT_TRUE(read_bytes(g, pa.view()) == read_bytes(g, pb.view())) << "param";
            EXPECT_TRUE(read_bytes(g, ma.view()) == read_bytes(g, mb.view())) << "state 1";
            EXPECT_TRUE(read_bytes(g, va.view()) == read_bytes(g, vb.view())) << "state 2";
          }
        }
      }
    }
  }
  // And against the CPU backend's fused copy, bit for bit: both backends run
  // fsdp/backend/optimizer_math.hpp's element update.
  Pair p = make(DType::f32, uniform(1001, rng)), gg = make(DType::f32, uniform(1001, rng)),
       m = make(DType::f32, Vec(1001)), v = make(DType::f32, Vec(1001)),
       c = make(DType::bf16, Vec(1001));
  both([&](Backend& be, Side s) {
    be.adamw_update(p.v(s), gg.v(s), m.v(s), v.v(s), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, c.v(s));
  });
  check(p, kExact, "adamw param");
  check(c, kExact, "adamw compute_copy");
}

// ---------------------------------------------------------------------------------------
// determinism: the squared norm gives the same bits on every run

TEST(CudaRuntime, SquaredNormIsBitwiseRepeatable) {
  std::mt19937 rng(17);
  const int64_t R = 1031, C = 200;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(name(t));
    Pair x = make(t, uniform(R * C, rng));
    Bytes first;
    for (int run = 0; run < 2; ++run) {
      Pair acc = make_f64({0.0});
      gpu().squared_norm(acc.v(kGpu), x.v(kGpu));
      if (run == 0) {
        first = read_bytes(gpu(), acc.v(kGpu));
      } else {
        expect_bytes(acc, first, "squared_norm");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// argument checks: the CPU backend's rules, "cuda backend: KERNEL: ARG ..."

TEST(CudaRuntime, WrongDtypesAndSizesThrow) {
  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 64, MemCategory::other),
      bf(g, DType::bf16, 64, MemCategory::other), i32(g, DType::i32, 64, MemCategory::other),
      f64(g, DType::f64, 4, MemCategory::other);
  const TensorView F = f32.view(), Hb = bf.view(), I = i32.view(), D = f64.view();
  expect_error([&] { g.adamw_update(Hb, Hb, Hb, Hb, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1); },
               "cuda backend: adamw_update: param is bf16");
  expect_error([&] { g.adamw_update(F, F, F, F, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0); },
               "step = 0");
  expect_error([&] { g.adamw_update(F, F, F, F, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, F); },
               "cuda backend: adamw_update: compute_copy is fp32 [64] (expected bf16 or fp16)");
  expect_error([&] { g.sgd_update(F, F, F, 1e-3f, 0.9f, 0.0f, 1, Hb.slice(0, 63)); },
               "cuda backend: sgd_update: compute_copy is bf16 [63] but needs at least 64");
  expect_error([&] { g.squared_norm(F, F); }, "cuda backend: squared_norm: acc is fp32");
  expect_error([&] { g.unscale_and_check(Hb, 1.0f, D); },
               "cuda backend: unscale_and_check: x is bf16");
  expect_error([&] { g.cast(F, I); }, "cuda backend: cast: src is int32");
  expect_error([&] { g.copy(F, Hb); }, "cuda backend: copy: dst");
  expect_error([&] { g.scale_by(F, D); }, "cuda backend: scale_by: coef is fp64");
  g.synchronize();  // nothing was enqueued by the failed calls
}

}  // namespace
}  // namespace fsdp
