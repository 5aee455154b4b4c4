// tests/cpu_backend_util.hpp: what the CPU backend's two test files share
// (tests/test_device_runtime.cpp: the DeviceRuntime half of the backend; tests/test_kernels.cpp:
// the model Kernels): views of host vectors (the CPU backend's memory is host memory), random
// data, and the checks both apply: the "store bf16/fp16, compute fp32" contract and the
// argument-check messages.
//
// Store contract: inputs are rounded to the 16-bit dtype, the operation runs once on fp32
// views of those values and once on 16-bit views of them, and every 16-bit output must be
// round_to(dtype, fp32 output) exactly, element for element (fp32-only outputs and fp64
// scalars must be equal).
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/tensor.hpp"

namespace fsdp::cpu_test {

using Vec = std::vector<float>;
using Tokens = std::vector<int32_t>;

inline Vec random_vec(std::size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Views of host vectors (the CPU backend's memory is host memory).
inline TensorView f32(const Vec& v) {
  return {v.data(), DType::f32, {static_cast<int64_t>(v.size())}};
}
inline TensorView i32(const Tokens& v) {
  return {v.data(), DType::i32, {static_cast<int64_t>(v.size())}};
}
inline TensorView f64(double& d) { return {&d, DType::f64, {1}}; }

inline uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
inline uint64_t bits(double d) { return std::bit_cast<uint64_t>(d); }

// ---------------------------------------------------------------------------------------
// "store bf16/fp16, compute fp32": every operation on 16-bit views equals the fp32 operation
// on the same (rounded) values, rounded to the storage dtype

inline constexpr DType k16[] = {DType::bf16, DType::f16};

inline Vec rounded(const Vec& v, DType t) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

// Host storage of float values in a storage dtype (fp32, bf16 or fp16 bit patterns).
class Store {
 public:
  Store(DType t, const Vec& v) : t_(t), n_(static_cast<int64_t>(v.size())) {
    if (t == DType::f32) {
      f_ = v;
    } else {
      h_.resize(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        h_[i] = t == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      }
    }
  }
  TensorView view() {
    return {t_ == DType::f32 ? static_cast<void*>(f_.data()) : h_.data(), t_, {n_}};
  }
  Vec values() const {
    if (t_ == DType::f32) return f_;
    Vec v(h_.size());
    for (std::size_t i = 0; i < h_.size(); ++i) {
      v[i] = t_ == DType::bf16 ? bf16_to_f32(h_[i]) : f16_to_f32(h_[i]);
    }
    return v;
  }

 private:
  DType t_;
  int64_t n_;
  Vec f_;
  std::vector<uint16_t> h_;
};

struct Outputs {
  std::vector<Vec> stored;      // float outputs, in the storage dtype of the run
  std::vector<Vec> fp32;        // fp32-only outputs (LayerNorm statistics)
  std::vector<double> scalars;  // fp64 device scalars (losses, squared norms)
};

// got[i] == round_to(dt, ref[i]) bit for bit, for every element.
inline void expect_rounded(DType dt, const Vec& ref, const Vec& got, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (bits(round_to(dt, ref[i])) != bits(got[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << " (" << to_string(dt) << "): first mismatch at " << first
                     << ": got " << got[first] << ", want round_to(" << ref[first]
                     << ") = " << round_to(dt, ref[first]);
}

// Runs `run` with fp32 storage and with `dt` storage (of the same values, already rounded to
// dt by the caller) and checks the store contract on every output.
inline void expect_store_contract(DType dt, const std::function<Outputs(DType)>& run,
                                  const std::string& what) {
  const Outputs ref = run(DType::f32), got = run(dt);
  ASSERT_EQ(ref.stored.size(), got.stored.size());
  for (std::size_t k = 0; k < ref.stored.size(); ++k) {
    expect_rounded(dt, ref.stored[k], got.stored[k], what + " output " + std::to_string(k));
  }
  ASSERT_EQ(ref.fp32.size(), got.fp32.size());
  for (std::size_t k = 0; k < ref.fp32.size(); ++k) {
    EXPECT_EQ(ref.fp32[k], got.fp32[k])
        << what << " fp32 output " << k << " (" << to_string(dt) << ")";
  }
  ASSERT_EQ(ref.scalars.size(), got.scalars.size());
  for (std::size_t k = 0; k < ref.scalars.size(); ++k) {
    EXPECT_EQ(bits(ref.scalars[k]), bits(got.scalars[k]))
        << what << " scalar " << k << " (" << to_string(dt) << "): " << ref.scalars[k] << " vs "
        << got.scalars[k];
  }
}

// ---------------------------------------------------------------------------------------
// argument checks

// `f` throws fsdp::Error whose message names `kernel` and `arg`.
inline void expect_arg_error(const std::function<void()>& f, const std::string& kernel,
                             const std::string& arg) {
  try {
    f();
    ADD_FAILURE() << kernel << ": no error for " << arg;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(kernel + ":"), std::string::npos) << m;
    EXPECT_NE(m.find(" " + arg + " "), std::string::npos) << m;
  }
}

}  // namespace fsdp::cpu_test
