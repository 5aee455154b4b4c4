// tests/cuda_backend_pair.hpp: what the CUDA backend's two test files share
// (tests/test_cuda_device_runtime.cpp: the DeviceRuntime half; tests/test_cuda_kernels.cpp:
// the model Kernels): both backends, Pair tensors, the comparison and its tolerances.
//
// Method: each logical tensor is a Pair, one buffer per backend holding the same bytes (the
// values are rounded to the storage dtype on the host first). Each kernel runs on both
// backends with the same arguments; outputs are copied back and compared elementwise:
//     |cuda - cpu| <= rel * |cpu| + abs * max(1, max |cpu|)
// with a tolerance per kind of kernel and dtype (below). Shapes are deliberately odd (not
// multiples of 8, 32 or 128) so the vectorised paths' tails and partial tiles run, and
// outputs that accumulate are pre-filled with random values.
//
// Tolerances, and why:
//  - Casts, copies, clip coefficient: exact (same IEEE roundings on both sides).
//  - fp32 elementwise (add, axpy, scale, GELU, bias add): rel 1e-5. expf vs the CPU's
//    polynomial exp, and FMA contraction, differ in the last bits only.
//  - fp32 GEMM, attention, LayerNorm, reductions: rel 1e-4 (different summation orders).
//  - bf16 storage: the CPU backend run in bf16 storage is the reference (it converts to
//    fp32, computes, rounds once). Both sides round nearly equal fp32 values to bf16, which
//    can land on adjacent bf16 values: one bf16 ulp is up to 2^-7 ~ 7.8e-3 relative, hence
//    rel 1e-2. Attention also rounds P and dS to bf16 before its second products on the GPU
//    (the tensor-core kernels, as flash-attention; the CPU keeps them fp32), which adds ~2^-9
//    relative per term: rel 2e-2 there.
//  - fp16 storage: the same reasoning with a 2^-10 ulp: rel 2e-3 (attention 1e-2).
//  - Loss and squared-norm device scalars (fp64): rel 1e-5 / 1e-12 (fp32 math inside the
//    loss; fp64 sums of the same squares for the norm).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/cuda_backend.hpp"

namespace fsdp::cuda_test {

using Vec = std::vector<float>;
using Bytes = std::vector<unsigned char>;

enum Side { kCpu = 0, kGpu = 1 };

struct Tol {
  double rel;
  double abs;
};
inline constexpr Tol kExact{0.0, 0.0};
inline constexpr Tol kElemF32{1e-5, 1e-6};
inline constexpr Tol kReduceF32{1e-4, 1e-5};
inline constexpr Tol kBf16{1e-2, 2e-3};
inline constexpr Tol kF16{2e-3, 5e-4};
inline constexpr Tol kAttnBf16{2e-2, 1e-2};
inline constexpr Tol kAttnF16{1e-2, 2e-3};

// The tolerance for a kernel family: fp32 as given, 16-bit storage as above.
inline Tol tol_for(DType t, Tol f32) {
  if (t == DType::bf16) return kBf16;
  if (t == DType::f16) return kF16;
  return f32;
}
inline Tol attn_tol(DType t) {
  if (t == DType::bf16) return kAttnBf16;
  if (t == DType::f16) return kAttnF16;
  return kReduceF32;
}

// ---------------------------------------------------------------------------------------
// the two backends (created once; a cuBLAS handle is slow to create)

class Backends {
 public:
  static Backend& get(Side s) {
    static Backends b;
    return s == kCpu ? *b.cpu_ : *b.gpu_;
  }

 private:
  Backends() : cpu_(make_cpu_backend(1)), gpu_(cuda::make_cuda_backend(0)) {}
  std::unique_ptr<Backend> cpu_, gpu_;
};
inline Backend& be(Side s) { return Backends::get(s); }
inline Backend& cpu() { return be(kCpu); }
inline Backend& gpu() { return be(kGpu); }

// Runs f on the CPU backend, then on the CUDA backend.
inline void both(const std::function<void(Backend&, Side)>& f) {
  f(cpu(), kCpu);
  f(gpu(), kGpu);
}

// ---------------------------------------------------------------------------------------
// host encoding of values in a storage dtype

inline Bytes encode(DType t, const Vec& v) {
  Bytes b(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::f32:
        std::memcpy(&b[4 * i], &v[i], 4);
        break;
      case DType::f64: {
        const double d = v[i];
        std::memcpy(&b[8 * i], &d, 8);
        break;
      }
      case DType::bf16: {
        const uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(&b[2 * i], &h, 2);
        break;
      }
      case DType::f16: {
        const uint16_t h = f32_to_f16(v[i]);
        std::memcpy(&b[2 * i], &h, 2);
        break;
      }
      default:
        ADD_FAILURE() << "encode: unsupported dtype";
    }
  }
  return b;
}

inline std::vector<double> decode(DType t, const Bytes& b) {
  const std::size_t n = b.size() / dtype_size(t);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::f32: {
        float f;
        std::memcpy(&f, &b[4 * i], 4);
        v[i] = f;
        break;
      }
      case DType::f64:
        std::memcpy(&v[i], &b[8 * i], 8);
        break;
      case DType::bf16: {
        uint16_t h;
        std::memcpy(&h, &b[2 * i], 2);
        v[i] = bf16_to_f32(h);
        break;
      }
      case DType::f16: {
        uint16_t h;
        std::memcpy(&h, &b[2 * i], 2);
        v[i] = f16_to_f32(h);
        break;
      }
      case DType::i32: {
        int32_t x;
        std::memcpy(&x, &b[4 * i], 4);
        v[i] = x;
        break;
      }
      default:
        ADD_FAILURE() << "decode: unsupported dtype";
    }
  }
  return v;
}

inline Bytes read_bytes(Backend& b, const TensorView& v) {
  Bytes out(v.bytes());
  b.copy_to_host(out.data(), v);
  return out;
}
inline std::vector<double> read(Backend& b, const TensorView& v) {
  return decode(v.dtype, read_bytes(b, v));
}

// ---------------------------------------------------------------------------------------
// Pair: one logical tensor, the same bytes on both backends

struct Pair {
  DeviceBuffer buf[2];
  DType t = DType::f32;
  int64_t n = 0;
  TensorView v(Side s) const { return buf[s].view(); }
  // Elements [off, off + len) (misaligned views for the scalar / unaligned-GEMM paths).
  TensorView v(Side s, int64_t off, int64_t len) const { return buf[s].view().slice(off, len); }
  void upload(const Bytes& b) {
    cpu().copy_from_host(v(kCpu), b.data());
    gpu().copy_from_host(v(kGpu), b.data());
  }
  // Makes the CUDA copy equal to the CPU copy (inputs computed by a CPU kernel).
  void cpu_to_gpu() { gpu().copy_from_host(v(kGpu), read_bytes(cpu(), v(kCpu)).data()); }
};

inline Pair make_bytes(DType t, int64_t n, const Bytes& bytes) {
  Pair p;
  p.t = t;
  p.n = n;
  p.buf[kCpu] = DeviceBuffer(cpu(), t, n, MemCategory::other);
  p.buf[kGpu] = DeviceBuffer(gpu(), t, n, MemCategory::other);
  if (n > 0) p.upload(bytes);
  return p;
}
inline Pair make(DType t, const Vec& values) {
  return make_bytes(t, static_cast<int64_t>(values.size()), encode(t, values));
}
inline Pair make_f64(const std::vector<double>& values) {
  Bytes b(values.size() * 8);
  if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
  return make_bytes(DType::f64, static_cast<int64_t>(values.size()), b);
}
inline Pair make_i32(const std::vector<int32_t>& values) {
  Bytes b(values.size() * 4);
  if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
  return make_bytes(DType::i32, static_cast<int64_t>(values.size()), b);
}

inline Vec uniform(std::size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// |cuda - cpu| <= rel |cpu| + abs max(1, max |cpu|) for every element (NaN only with NaN,
// an infinity only with the same infinity).
inline void expect_close(const std::vector<double>& ref, const std::vector<double>& got, Tol tol,
                  const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  double scale = 1.0;
  for (double r : ref) {
    if (std::isfinite(r)) scale = std::max(scale, std::abs(r));
  }
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    if (std::isnan(r) || std::isnan(g)) {
      if (std::isnan(r) != std::isnan(g)) {
        ++bad;
        worst = i;
        worst_excess = std::numeric_limits<double>::infinity();
      }
      continue;
    }
    if (r == g) continue;  // equal infinities included
    if (std::isinf(r) || std::isinf(g)) {  // an infinity on one side only
      ++bad;
      worst = i;
      worst_excess = std::numeric_limits<double>::infinity();
      continue;
    }
    const double limit = tol.rel * std::abs(r) + tol.abs * scale;
    const double diff = std::abs(g - r);
    if (!(diff <= limit)) {
      ++bad;
      if (diff - limit > worst_excess) {
        worst_excess = diff - limit;
        worst = i;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                     << " elements outside the tolerance (rel " << tol.rel << ", abs " << tol.abs
                     << "); worst at " << worst << ": cpu " << (ref.empty() ? 0.0 : ref[worst])
                     << ", cuda " << (got.empty() ? 0.0 : got[worst]);
}

// The CPU and CUDA contents of p agree within tol.
inline void check(const Pair& p, Tol tol, const std::string& what) {
  expect_close(read(cpu(), p.v(kCpu)), read(gpu(), p.v(kGpu)), tol, what);
}

// check(), then makes the CUDA copy equal to the CPU one, so that a kernel that reads p next
// sees identical inputs on both sides (differences do not compound along a chain of ops).
inline void check_sync(Pair& p, Tol tol, const std::string& what) {
  check(p, tol, what);
  p.cpu_to_gpu();
}

// The CUDA contents of p are bitwise equal to `bytes`.
inline void expect_bytes(const Pair& p, const Bytes& bytes, const std::string& what) {
  EXPECT_TRUE(read_bytes(gpu(), p.v(kGpu)) == bytes) << what << ": not bitwise repeatable";
}

inline const DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};

inline std::string name(DType t) { return std::string(to_string(t)); }

// `f` throws fsdp::Error whose message contains `text` (the backends' argument checks:
// "cuda backend: KERNEL: ARG ...", the CPU backend's rules).
inline void expect_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no fsdp::Error; expected one containing \"" << text << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

}  // namespace fsdp::cuda_test
