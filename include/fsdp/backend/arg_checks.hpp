// fsdp/backend/arg_checks.hpp: the argument checks every Backend implementation runs before
// touching memory (the contract of fsdp/backend/backend.hpp), written once for the CPU and
// CUDA backends. Failures throw fsdp::Error "<backend>: <kernel>: <argument> <what>", e.g.
//   cpu backend: gemm: C is fp32 [24] but needs at least 25 elements
// `Name` is a type with `static constexpr const char* name` ("cpu backend", "cuda backend").
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/tensor.hpp"

namespace fsdp {

template <class Name>
struct ArgChecks {
  [[noreturn]] static void error(const char* kernel, const char* arg, const std::string& what) {
    throw Error(std::string(Name::name) + ": " + kernel + ": " + arg + " " + what);
  }
  static std::string describe(const TensorView& v) {
    return std::string(to_string(v.dtype)) + " " + v.shape.str();
  }
  // A dimension passed explicitly: >= 0.
  static void dim(const char* kernel, const char* name, int64_t value) {
    if (value < 0) error(kernel, name, "= " + std::to_string(value) + " (expected >= 0)");
  }
  // At least n elements, and a pointer when any are needed.
  static void size(const char* kernel, const char* arg, const TensorView& v, int64_t n) {
    if (v.numel() < n) {
      error(kernel, arg,
            "is " + describe(v) + " but needs at least " + std::to_string(n) + " elements");
    }
    if (n > 0 && v.data == nullptr) error(kernel, arg, "is a null view");
  }
  // A "float" argument: fp32, bf16 or fp16 storage, at least n elements.
  static void need_float(const char* kernel, const char* arg, const TensorView& v, int64_t n) {
    if (v.dtype != DType::f32 && v.dtype != DType::bf16 && v.dtype != DType::f16) {
      error(kernel, arg, "is " + describe(v) + " (expected fp32, bf16 or fp16)");
    }
    size(kernel, arg, v, n);
  }
  // Exactly dtype t (fp32 statistics and optimizer shards, int32 indices), n elements.
  static void need_dtype(const char* kernel, const char* arg, const TensorView& v, DType t,
                         int64_t n) {
    if (v.dtype != t) {
      error(kernel, arg, "is " + describe(v) + " (expected " + std::string(to_string(t)) + ")");
    }
    size(kernel, arg, v, n);
  }
  // A device scalar: fp64 with at least one element.
  static double* scalar64(const char* kernel, const char* arg, const TensorView& v) {
    need_dtype(kernel, arg, v, DType::f64, 1);
    return static_cast<double*>(v.data);
  }
};

}  // namespace fsdp
