// fsdp/backend/arg_checks.hpp: the argument checks every Backend implementation runs before
// touching memory (the contract of fsdp/backend/device_runtime.hpp and kernels.hpp), written once for the CPU and
// CUDA backends. Failures throw fsdp::Error "<backend>: <kernel>: <argument> <what>", e.g.
//   cpu backend: gemm: C is fp32 [24] but needs at least 25 elements
// `Name` is a type with `static constexpr const char* name` ("cpu backend", "cuda backend").
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/backend/kernels.hpp"
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
  // Two views whose bytes must not overlap (an output a fused kernel writes while reading
  // the other).
  static void distinct(const char* kernel, const char* a, const TensorView& va, const char* b,
                       const TensorView& vb) {
    const auto* pa = static_cast<const char*>(va.data);
    const auto* pb = static_cast<const char*>(vb.data);
    if (pa && pb && pa < pb + vb.bytes() && pb < pa + va.bytes()) {
      error(kernel, a, std::string("overlaps ") + b + " (expected distinct memory)");
    }
  }
  // A device scalar: fp64 with at least one element.
  static double* scalar64(const char* kernel, const char* arg, const TensorView& v) {
    need_dtype(kernel, arg, v, DType::f64, 1);
    return static_cast<double*>(v.data);
  }

  // ---- the check sequence of each Backend kernel, in the order both backends run it ----
  // Value checks that need the data (token/bucket ranges) and backend-specific limits are
  // left to each backend, after these.

  // memory and casts
  static void fill_zero(const TensorView& dst) { size("fill_zero", "dst", dst, dst.numel()); }
  static void copy(const TensorView& dst, const TensorView& src) {
    if (dst.dtype != src.dtype || dst.numel() != src.numel()) {
      error("copy", "dst",
            "is " + describe(dst) + " but src is " + describe(src) +
                " (expected the same dtype and numel)");
    }
    size("copy", "dst", dst, dst.numel());
    size("copy", "src", src, src.numel());
  }
  static void cast(const TensorView& dst, const TensorView& src) {
    if (dst.numel() != src.numel()) {
      error("cast", "dst",
            "is " + describe(dst) + " but src is " + describe(src) + " (expected the same numel)");
    }
    for (const auto& [name, v] : {std::pair{"dst", &dst}, std::pair{"src", &src}}) {
      if (!is_floating(v->dtype)) {
        error("cast", name, "is " + describe(*v) + " (expected fp32, fp64, bf16 or fp16)");
      }
      size("cast", name, *v, v->numel());
    }
  }
  static void copy_to_host(const TensorView& src) {
    size("copy_to_host", "src", src, src.numel());
  }
  static void copy_from_host(const TensorView& dst) {
    size("copy_from_host", "dst", dst, dst.numel());
  }

  // dense algebra
  static void gemm(int64_t M, int64_t N, int64_t K, const TensorView& A, const TensorView& B,
                   const TensorView& C) {
    dim("gemm", "M", M);
    dim("gemm", "N", N);
    dim("gemm", "K", K);
    need_float("gemm", "A", A, M * K);
    need_float("gemm", "B", B, K * N);
    need_float("gemm", "C", C, M * N);
  }
  static void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) {
    dim("add_bias", "R", R);
    dim("add_bias", "C", C);
    need_float("add_bias", "out", out, R * C);
    need_float("add_bias", "bias", bias, C);
  }
  static void bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                            int64_t C) {
    dim("bias_backward", "R", R);
    dim("bias_backward", "C", C);
    need_float("bias_backward", "dbias", dbias, C);
    need_float("bias_backward", "dout", dout, R * C);
  }
  // out = f(a, b) elementwise over n = out.numel() (add, mul): "out", "a", "b".
  static void binary(const char* kernel, const TensorView& out, const TensorView& a,
                     const TensorView& b) {
    const int64_t n = out.numel();
    need_float(kernel, "out", out, n);
    need_float(kernel, "a", a, n);
    need_float(kernel, "b", b, n);
  }
  static void axpy(const TensorView& y, const TensorView& x) {
    need_float("axpy", "y", y, y.numel());
    need_float("axpy", "x", x, y.numel());
  }
  static void scale(const TensorView& x) { need_float("scale", "x", x, x.numel()); }

  // reductions into device scalars (each returns the fp64 scalar it checked)
  static double* squared_norm(const TensorView& acc, const TensorView& x) {
    double* a = scalar64("squared_norm", "acc", acc);
    need_float("squared_norm", "x", x, x.numel());
    return a;
  }
  static double* clip_coefficient(const TensorView& norm, const TensorView& coef,
                                  const TensorView& parts) {
    double* nrm = scalar64("clip_coefficient", "norm", norm);
    need_dtype("clip_coefficient", "coef", coef, DType::f32, 1);
    need_dtype("clip_coefficient", "parts", parts, DType::f64, parts.numel());
    return nrm;
  }
  static void scale_by(const TensorView& x, const TensorView& coef) {
    need_dtype("scale_by", "coef", coef, DType::f32, 1);
    need_float("scale_by", "x", x, x.numel());
  }
  static double* unscale_and_check(const TensorView& x, const TensorView& found_inf) {
    double* found = scalar64("unscale_and_check", "found_inf", found_inf);
    need_dtype("unscale_and_check", "x", x, DType::f32, x.numel());
    return found;
  }

  // transformer pieces. The embeddings return V = rows of the table (table.numel() / C), or
  // -1 when C == 0; the token values are the backend's to check against it.
  static int64_t embedding_forward(const TensorView& out, const TensorView& tokens,
                                   const TensorView& wte, const TensorView& wpe, int64_t B,
                                   int64_t T, int64_t C) {
    const char* k = "embedding_forward";
    dim(k, "B", B);
    dim(k, "T", T);
    dim(k, "C", C);
    need_float(k, "wte", wte, 0);
    need_dtype(k, "tokens", tokens, DType::i32, B * T);
    need_float(k, "wpe", wpe, T * C);
    need_float(k, "out", out, B * T * C);
    return C > 0 ? wte.numel() / C : -1;
  }
  static int64_t embedding_backward(const TensorView& dwte, const TensorView& dwpe,
                                    const TensorView& dout, const TensorView& tokens, int64_t B,
                                    int64_t T, int64_t C) {
    const char* k = "embedding_backward";
    dim(k, "B", B);
    dim(k, "T", T);
    dim(k, "C", C);
    need_float(k, "dwte", dwte, 0);
    need_dtype(k, "tokens", tokens, DType::i32, B * T);
    need_float(k, "dwpe", dwpe, T * C);
    need_float(k, "dout", dout, B * T * C);
    return C > 0 ? dwte.numel() / C : -1;
  }
  static void layernorm_forward(const TensorView& out, const TensorView& mean,
                                const TensorView& rstd, const TensorView& x,
                                const TensorView& weight, const TensorView& bias, int64_t R,
                                int64_t C, const char* k = "layernorm_forward") {
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "out", out, R * C);
    need_dtype(k, "mean", mean, DType::f32, R);
    need_dtype(k, "rstd", rstd, DType::f32, R);
    need_float(k, "x", x, R * C);
    need_float(k, "weight", weight, C);
    need_float(k, "bias", bias, C);
  }
  // The fused residual adds (kernels.hpp): proj_bias empty or [C]; h and residual [R,C]
  // distinct; then the norm's own checks (h as its x) and out distinct from h and residual.
  static void add_bias_residual(const char* k, const TensorView& h, const TensorView& proj_bias,
                                const TensorView& residual, int64_t R, int64_t C) {
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "h", h, R * C);
    need_float(k, "residual", residual, R * C);
    if (proj_bias.data) need_float(k, "proj_bias", proj_bias, C);
    distinct(k, "h", h, "residual", residual);
  }
  static void add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                                const TensorView& residual, int64_t R, int64_t C) {
    add_bias_residual("add_bias_residual", h, proj_bias, residual, R, C);
  }
  static void add_layernorm_forward(const TensorView& h, const TensorView& out,
                                    const TensorView& mean, const TensorView& rstd,
                                    const TensorView& residual, const TensorView& proj_bias,
                                    const TensorView& weight, const TensorView& bias, int64_t R,
                                    int64_t C) {
    const char* k = "add_layernorm_forward";
    add_bias_residual(k, h, proj_bias, residual, R, C);
    layernorm_forward(out, mean, rstd, h, weight, bias, R, C, k);
    distinct(k, "out", out, "h", h);
    distinct(k, "out", out, "residual", residual);
  }
  static void add_rmsnorm_forward(const TensorView& h, const TensorView& out,
                                  const TensorView& rstd, const TensorView& residual,
                                  const TensorView& proj_bias, const TensorView& weight, int64_t R,
                                  int64_t C) {
    const char* k = "add_rmsnorm_forward";
    add_bias_residual(k, h, proj_bias, residual, R, C);
    rmsnorm_forward(out, rstd, h, weight, R, C, k);
    distinct(k, "out", out, "h", h);
    distinct(k, "out", out, "residual", residual);
  }
  static void layernorm_backward(const TensorView& dx, const TensorView& dweight,
                                 const TensorView& dbias, const TensorView& dout,
                                 const TensorView& x, const TensorView& weight,
                                 const TensorView& mean, const TensorView& rstd, int64_t R,
                                 int64_t C) {
    const char* k = "layernorm_backward";
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "dx", dx, R * C);
    need_float(k, "dweight", dweight, C);
    need_float(k, "dbias", dbias, C);
    need_float(k, "dout", dout, R * C);
    need_float(k, "x", x, R * C);
    need_float(k, "weight", weight, C);
    need_dtype(k, "mean", mean, DType::f32, R);
    need_dtype(k, "rstd", rstd, DType::f32, R);
  }
  static void bias_gelu_forward(const TensorView& out, const TensorView& fc,
                                const TensorView& bias, int64_t R, int64_t C) {
    const char* k = "bias_gelu_forward";
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "out", out, R * C);
    need_float(k, "fc", fc, R * C);
    need_float(k, "bias", bias, C);
  }
  static void gelu_bias_backward(const TensorView& dfc, const TensorView& dbias,
                                 const TensorView& fc, const TensorView& dout, int64_t R,
                                 int64_t C) {
    const char* k = "gelu_bias_backward";
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "dfc", dfc, R * C);
    need_float(k, "dbias", dbias, C);
    need_float(k, "fc", fc, R * C);
    need_float(k, "dout", dout, R * C);
  }
  // out = f(x) elementwise over n = out.numel() (gelu_forward, relu_forward): "out", "x".
  static void unary_forward(const char* kernel, const TensorView& out, const TensorView& x) {
    need_float(kernel, "out", out, out.numel());
    need_float(kernel, "x", x, out.numel());
  }
  // dx = dout f'(x) over n = dx.numel() (gelu_backward, relu_backward): "dx", "x", "dout".
  static void unary_backward(const char* kernel, const TensorView& dx, const TensorView& x,
                             const TensorView& dout) {
    const int64_t n = dx.numel();
    need_float(kernel, "dx", dx, n);
    need_float(kernel, "x", x, n);
    need_float(kernel, "dout", dout, n);
  }
  static void attention_dims(const char* k, int64_t B, int64_t T, int64_t C, int64_t H) {
    dim(k, "B", B);
    dim(k, "T", T);
    dim(k, "C", C);
    dim(k, "H", H);
  }
  static void attention_forward(const TensorView& out, const TensorView& lse,
                                const TensorView& qkv, int64_t B, int64_t T, int64_t C,
                                int64_t H, const TensorView& doc_start) {
    const char* k = "attention_forward";
    attention_dims(k, B, T, C, H);
    if (doc_start) need_dtype(k, "doc_start", doc_start, DType::i32, B * T);
    need_float(k, "out", out, B * T * C);
    need_dtype(k, "lse", lse, DType::f32, B * H * T);
    need_float(k, "qkv", qkv, B * T * 3 * C);
  }
  static void attention_backward(const TensorView& dqkv, const TensorView& dout,
                                 const TensorView& qkv, const TensorView& out,
                                 const TensorView& lse, int64_t B, int64_t T, int64_t C,
                                 int64_t H, const TensorView& doc_start) {
    const char* k = "attention_backward";
    attention_dims(k, B, T, C, H);
    if (doc_start) need_dtype(k, "doc_start", doc_start, DType::i32, B * T);
    need_float(k, "dqkv", dqkv, B * T * 3 * C);
    need_float(k, "dout", dout, B * T * C);
    need_float(k, "qkv", qkv, B * T * 3 * C);
    need_float(k, "out", out, B * T * C);
    need_dtype(k, "lse", lse, DType::f32, B * H * T);
  }
  // cross_entropy_forward(_backward): returns the fp64 loss scalar.
  static double* cross_entropy(const char* kernel, const TensorView& loss, const TensorView& logits,
                               const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                               float softcap) {
    double* l = scalar64(kernel, "loss", loss);
    dim(kernel, "R", R);
    dim(kernel, "V", V);
    softcap_value(kernel, softcap);
    if (ld < V) {
      error(kernel, "ld", "= " + std::to_string(ld) + " (expected the row stride >= V = " +
                              std::to_string(V) + ")");
    }
    need_float(kernel, "logits", logits, R * ld);
    need_dtype(kernel, "targets", targets, DType::i32, R);
    return l;
  }

  // T5 pieces. The lookups return V (rows of the table, -1 when C == 0) and the position
  // biases NB (rows of the table, -1 when H == 0) for the backend's value checks.
  static int64_t embedding_lookup_forward(const TensorView& out, const TensorView& tokens,
                                          const TensorView& table, int64_t N, int64_t C) {
    const char* k = "embedding_lookup_forward";
    dim(k, "N", N);
    dim(k, "C", C);
    need_float(k, "table", table, 0);
    need_dtype(k, "tokens", tokens, DType::i32, N);
    need_float(k, "out", out, N * C);
    return C > 0 ? table.numel() / C : -1;
  }
  static int64_t embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                           const TensorView& tokens, int64_t N, int64_t C) {
    const char* k = "embedding_lookup_backward";
    dim(k, "N", N);
    dim(k, "C", C);
    need_float(k, "dtable", dtable, 0);
    need_dtype(k, "tokens", tokens, DType::i32, N);
    need_float(k, "dout", dout, N * C);
    return C > 0 ? dtable.numel() / C : -1;
  }
  static void rmsnorm_forward(const TensorView& out, const TensorView& rstd, const TensorView& x,
                              const TensorView& weight, int64_t R, int64_t C,
                              const char* k = "rmsnorm_forward") {
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "out", out, R * C);
    need_dtype(k, "rstd", rstd, DType::f32, R);
    need_float(k, "x", x, R * C);
    need_float(k, "weight", weight, C);
  }
  static void rmsnorm_backward(const TensorView& dx, const TensorView& dweight,
                               const TensorView& dout, const TensorView& x,
                               const TensorView& weight, const TensorView& rstd, int64_t R,
                               int64_t C) {
    const char* k = "rmsnorm_backward";
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "dx", dx, R * C);
    need_float(k, "dweight", dweight, C);
    need_float(k, "dout", dout, R * C);
    need_float(k, "x", x, R * C);
    need_float(k, "weight", weight, C);
    need_dtype(k, "rstd", rstd, DType::f32, R);
  }
  static int64_t position_bias_forward(const TensorView& bias, const TensorView& table,
                                       const TensorView& buckets, int64_t H, int64_t Tq,
                                       int64_t Tk) {
    const char* k = "position_bias_forward";
    dim(k, "H", H);
    dim(k, "Tq", Tq);
    dim(k, "Tk", Tk);
    need_float(k, "table", table, 0);
    need_dtype(k, "buckets", buckets, DType::i32, relative_positions(Tq, Tk));
    need_dtype(k, "bias", bias, DType::f32, H * relative_positions(Tq, Tk));
    return H > 0 ? table.numel() / H : -1;
  }
  static int64_t position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                                        const TensorView& buckets, int64_t H, int64_t Tq,
                                        int64_t Tk) {
    const char* k = "position_bias_backward";
    dim(k, "H", H);
    dim(k, "Tq", Tq);
    dim(k, "Tk", Tk);
    need_float(k, "dtable", dtable, 0);
    need_dtype(k, "buckets", buckets, DType::i32, relative_positions(Tq, Tk));
    need_dtype(k, "dbias", dbias, DType::f32, H * relative_positions(Tq, Tk));
    return H > 0 ? dtable.numel() / H : -1;
  }
  // mha_forward/backward: `limits` (may be null) is a backend's own shape check, run after
  // the dimensions and before the views.
  using MhaLimits = void (*)(const char* kernel, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                             int64_t D);
  static void mha_dims(const char* k, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D,
                       MhaLimits limits) {
    dim(k, "B", B);
    dim(k, "Tq", Tq);
    dim(k, "Tk", Tk);
    dim(k, "H", H);
    dim(k, "D", D);
    if (limits) limits(k, B, Tq, Tk, H, D);
  }
  static void mha_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                          const TensorView& kv_k, const TensorView& v, const TensorView& bias,
                          const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk,
                          int64_t H, int64_t D, MhaLimits limits = nullptr) {
    const char* k = "mha_forward";
    mha_dims(k, B, Tq, Tk, H, D, limits);
    const int64_t nq = B * Tq * H * D, nk = B * Tk * H * D;
    need_float(k, "out", out, nq);
    need_dtype(k, "lse", lse, DType::f32, B * H * Tq);
    need_float(k, "q", q, nq);
    need_float(k, "k", kv_k, nk);
    need_float(k, "v", v, nk);
    if (bias) need_dtype(k, "bias", bias, DType::f32, H * relative_positions(Tq, Tk));
    if (key_mask) need_dtype(k, "key_mask", key_mask, DType::i32, B * Tk);
  }
  static void mha_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                           const TensorView& dbias, const TensorView& dout, const TensorView& q,
                           const TensorView& kv_k, const TensorView& v, const TensorView& out,
                           const TensorView& lse, const TensorView& bias,
                           const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk,
                           int64_t H, int64_t D, MhaLimits limits = nullptr) {
    const char* k = "mha_backward";
    mha_dims(k, B, Tq, Tk, H, D, limits);
    const int64_t nq = B * Tq * H * D, nk = B * Tk * H * D;
    need_float(k, "dq", dq, nq);
    need_float(k, "dk", dk, nk);
    need_float(k, "dv", dv, nk);
    if (dbias) need_dtype(k, "dbias", dbias, DType::f32, H * relative_positions(Tq, Tk));
    need_float(k, "dout", dout, nq);
    need_float(k, "q", q, nq);
    need_float(k, "k", kv_k, nk);
    need_float(k, "v", v, nk);
    need_float(k, "out", out, nq);
    need_dtype(k, "lse", lse, DType::f32, B * H * Tq);
    if (bias) need_dtype(k, "bias", bias, DType::f32, H * relative_positions(Tq, Tk));
    if (key_mask) need_dtype(k, "key_mask", key_mask, DType::i32, B * Tk);
  }

  // Llama pieces.
  static void rope(const char* k, const char* out_name, const TensorView& out,
                   const char* in_name, const TensorView& x, const TensorView& cos,
                   const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                   int64_t R) {
    dim(k, "B", B);
    dim(k, "T", T);
    dim(k, "H", H);
    dim(k, "D", D);
    if (R % 2 != 0 || R < 2 || R > D) {
      error(k, "R", "= " + std::to_string(R) + " (expected an even rotary width in [2, D = " +
                        std::to_string(D) + "])");
    }
    const int64_t n = B * T * H * D;
    need_float(k, out_name, out, n);
    need_float(k, in_name, x, n);
    need_dtype(k, "cos", cos, DType::f32, T * (R / 2));
    need_dtype(k, "sin", sin, DType::f32, T * (R / 2));
  }
  static void rope_forward(const TensorView& out, const TensorView& x, const TensorView& cos,
                           const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                           int64_t R) {
    rope("rope_forward", "out", out, "x", x, cos, sin, B, T, H, D, R);
  }
  static void rope_backward(const TensorView& dx, const TensorView& dout, const TensorView& cos,
                            const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                            int64_t R) {
    rope("rope_backward", "dx", dx, "dout", dout, cos, sin, B, T, H, D, R);
  }
  static void geglu_forward(const TensorView& out, const TensorView& gate, const TensorView& up) {
    swiglu_forward(out, gate, up, "geglu_forward");
  }
  static void geglu_backward(const TensorView& dgate, const TensorView& dup,
                             const TensorView& dout, const TensorView& gate,
                             const TensorView& up) {
    swiglu_backward(dgate, dup, dout, gate, up, "geglu_backward");
    distinct("geglu_backward", "dup", dup, "dout", dout);
    distinct("geglu_backward", "dup", dup, "gate", gate);
    distinct("geglu_backward", "dup", dup, "up", up);
  }
  static void swiglu_forward(const TensorView& out, const TensorView& gate, const TensorView& up,
                             const char* k = "swiglu_forward") {
    const int64_t n = out.numel();
    need_float(k, "out", out, n);
    need_float(k, "gate", gate, n);
    need_float(k, "up", up, n);
  }
  static void swiglu_backward(const TensorView& dgate, const TensorView& dup,
                              const TensorView& dout, const TensorView& gate,
                              const TensorView& up, const char* k = "swiglu_backward") {
    const int64_t n = dgate.numel();
    need_float(k, "dgate", dgate, n);
    need_float(k, "dup", dup, n);
    need_float(k, "dout", dout, n);
    need_float(k, "gate", gate, n);
    need_float(k, "up", up, n);
  }
  static void sigmoid_gate_forward(const TensorView& out, const TensorView& x,
                                   const TensorView& gate) {
    const char* k = "sigmoid_gate_forward";
    const int64_t n = out.numel();
    need_float(k, "out", out, n);
    need_float(k, "x", x, n);
    need_float(k, "gate", gate, n);
    distinct(k, "out", out, "gate", gate);
  }
  static void sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate,
                                    const TensorView& dout, const TensorView& x,
                                    const TensorView& gate) {
    const char* k = "sigmoid_gate_backward";
    const int64_t n = dout.numel();
    need_float(k, "dx", dx, n);
    need_float(k, "dgate", dgate, n);
    need_float(k, "dout", dout, n);
    need_float(k, "x", x, n);
    need_float(k, "gate", gate, n);
    distinct(k, "dx", dx, "x", x);
    distinct(k, "dx", dx, "gate", gate);
    distinct(k, "dx", dx, "dgate", dgate);
    distinct(k, "dgate", dgate, "dout", dout);
    distinct(k, "dgate", dgate, "x", x);
  }
  // clamped_swiglu_forward/backward: finite alpha, a finite positive limit, gate_up [2n].
  static void clamp_values(const char* k, float alpha, float limit) {
    if (!std::isfinite(alpha)) error(k, "alpha", "= " + std::to_string(alpha) + " (not finite)");
    if (!(limit > 0.f) || std::isinf(limit)) {
      error(k, "limit", "= " + std::to_string(limit) + " (expected > 0 and finite)");
    }
  }
  static void clamped_swiglu_forward(const TensorView& out, const TensorView& gate_up, float alpha,
                                     float limit) {
    const char* k = "clamped_swiglu_forward";
    clamp_values(k, alpha, limit);
    const int64_t n = out.numel();
    need_float(k, "out", out, n);
    need_float(k, "gate_up", gate_up, 2 * n);
    distinct(k, "out", out, "gate_up", gate_up);
  }
  static void clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                                      const TensorView& gate_up, float alpha, float limit) {
    const char* k = "clamped_swiglu_backward";
    clamp_values(k, alpha, limit);
    const int64_t n = dout.numel();
    need_float(k, "dgate_up", dgate_up, 2 * n);
    need_float(k, "dout", dout, n);
    need_float(k, "gate_up", gate_up, 2 * n);
    distinct(k, "dout", dout, "dgate_up", dgate_up);
    distinct(k, "dout", dout, "gate_up", gate_up);
  }
  // A logit soft-cap: 0 (none) or a finite positive cap.
  static void softcap_value(const char* k, float softcap) {
    if (!(softcap >= 0.f) || std::isinf(softcap)) {
      error(k, "softcap", "= " + std::to_string(softcap) + " (expected >= 0 and finite; 0 = none)");
    }
  }
  // gqa_attention_forward/backward: dimensions, the window, the soft-cap, Hkv >= 1 dividing H,
  // doc_start (null, or int32 [B,T]), then `limits` (may be null; the backend's own check of
  // mha_forward, called with Tq = Tk = T), then the views.
  static void gqa_dims(const char* k, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       int64_t window, float softcap, MhaLimits limits) {
    dim(k, "B", B);
    dim(k, "T", T);
    dim(k, "H", H);
    dim(k, "Hkv", Hkv);
    dim(k, "D", D);
    dim(k, "window", window);
    softcap_value(k, softcap);
    if (Hkv < 1 || H % Hkv != 0) {
      error(k, "Hkv", "= " + std::to_string(Hkv) + " (expected >= 1 and dividing H = " +
                          std::to_string(H) + ")");
    }
    if (limits) limits(k, B, T, T, H, D);
  }
  static void gqa_attention_forward(const TensorView& out, const TensorView& lse,
                                    const TensorView& q, const TensorView& kv_k,
                                    const TensorView& v, int64_t B, int64_t T, int64_t H,
                                    int64_t Hkv, int64_t D, int64_t window, float softcap,
                                    const TensorView& doc_start, MhaLimits limits = nullptr) {
    const char* k = "gqa_attention_forward";
    gqa_dims(k, B, T, H, Hkv, D, window, softcap, limits);
    if (doc_start) need_dtype(k, "doc_start", doc_start, DType::i32, B * T);
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
    need_float(k, "out", out, nq);
    need_dtype(k, "lse", lse, DType::f32, B * H * T);
    need_float(k, "q", q, nq);
    need_float(k, "k", kv_k, nk);
    need_float(k, "v", v, nk);
  }
  static void gqa_attention_backward(const TensorView& dq, const TensorView& dk,
                                     const TensorView& dv, const TensorView& dout,
                                     const TensorView& q, const TensorView& kv_k,
                                     const TensorView& v, const TensorView& out,
                                     const TensorView& lse, int64_t B, int64_t T, int64_t H,
                                     int64_t Hkv, int64_t D, int64_t window, float softcap,
                                     const TensorView& doc_start, MhaLimits limits = nullptr) {
    const char* k = "gqa_attention_backward";
    gqa_dims(k, B, T, H, Hkv, D, window, softcap, limits);
    if (doc_start) need_dtype(k, "doc_start", doc_start, DType::i32, B * T);
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
    need_float(k, "dq", dq, nq);
    need_float(k, "dk", dk, nk);
    need_float(k, "dv", dv, nk);
    need_float(k, "dout", dout, nq);
    need_float(k, "q", q, nq);
    need_float(k, "k", kv_k, nk);
    need_float(k, "v", v, nk);
    need_float(k, "out", out, nq);
    need_dtype(k, "lse", lse, DType::f32, B * H * T);
  }

  // attention_sink_forward/backward: out (and dout) [B,T,H*D], lse fp32 [B,H,T], sinks (and
  // dsinks) [H].
  static void attention_sink_forward(const TensorView& out, const TensorView& lse,
                                     const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                                     int64_t D, const char* k = "attention_sink_forward") {
    dim(k, "B", B);
    dim(k, "T", T);
    dim(k, "H", H);
    dim(k, "D", D);
    need_float(k, "out", out, B * T * H * D);
    need_dtype(k, "lse", lse, DType::f32, B * H * T);
    need_float(k, "sinks", sinks, H);
  }
  static void attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                                      int64_t D) {
    const char* k = "attention_sink_backward";
    attention_sink_forward(out, lse, sinks, B, T, H, D, k);
    need_float(k, "dsinks", dsinks, H);
    need_float(k, "dout", dout, B * T * H * D);
    for (const auto& [name, v] : {std::pair{"dout", &dout}, std::pair{"out", &out},
                                  std::pair{"lse", &lse}, std::pair{"sinks", &sinks}}) {
      distinct(k, "dsinks", dsinks, name, *v);
    }
  }

  // causal_conv1d_forward/backward: B, T, C, K >= 1; x, out (dx, dout) [B,T,C]; weight
  // (dweight) [C,K]; the outputs distinct from the inputs and each other.
  static void conv1d_inputs(const char* k, const TensorView& x, const TensorView& weight,
                            int64_t B, int64_t T, int64_t C, int64_t K,
                            const TensorView& doc_start) {
    for (const auto& [name, v] : {std::pair{"B", B}, std::pair{"T", T}, std::pair{"C", C},
                                  std::pair{"K", K}}) {
      if (v < 1) error(k, name, "= " + std::to_string(v) + " (expected >= 1)");
    }
    need_float(k, "x", x, B * T * C);
    need_float(k, "weight", weight, C * K);
    if (doc_start) need_dtype(k, "doc_start", doc_start, DType::i32, B * T);
  }
  static void causal_conv1d_forward(const TensorView& out, const TensorView& x,
                                    const TensorView& weight, int64_t B, int64_t T, int64_t C,
                                    int64_t K, const TensorView& doc_start) {
    const char* k = "causal_conv1d_forward";
    conv1d_inputs(k, x, weight, B, T, C, K, doc_start);
    need_float(k, "out", out, B * T * C);
    distinct(k, "out", out, "x", x);
    distinct(k, "out", out, "weight", weight);
  }
  static void causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                                     const TensorView& dout, const TensorView& x,
                                     const TensorView& weight, int64_t B, int64_t T, int64_t C,
                                     int64_t K, const TensorView& doc_start) {
    const char* k = "causal_conv1d_backward";
    conv1d_inputs(k, x, weight, B, T, C, K, doc_start);
    need_float(k, "dout", dout, B * T * C);
    need_float(k, "dx", dx, B * T * C);
    need_float(k, "dweight", dweight, C * K);
    distinct(k, "dx", dx, "dweight", dweight);
    for (const auto& [name, v] :
         {std::pair{"dout", &dout}, std::pair{"x", &x}, std::pair{"weight", &weight}}) {
      distinct(k, "dx", dx, name, *v);
      distinct(k, "dweight", dweight, name, *v);
    }
  }
  // gated_delta_rule_forward/backward: every dimension >= 1, Hv a multiple of Hk; qkv
  // [B,T,2*Hk*Dk + Hv*Dv], a and b [B,T,Hv], A_log and dt_bias [Hv], out (dout) [B,T,Hv*Dv];
  // the outputs distinct from the inputs and each other.
  static void delta_rule_inputs(const char* k, const TensorView& qkv, const TensorView& a,
                                const TensorView& b, const TensorView& A_log,
                                const TensorView& dt_bias, int64_t B, int64_t T, int64_t Hk,
                                int64_t Hv, int64_t Dk, int64_t Dv, const TensorView& doc_start) {
    for (const auto& [name, v] : {std::pair{"B", B}, std::pair{"T", T}, std::pair{"Hk", Hk},
                                  std::pair{"Hv", Hv}, std::pair{"Dk", Dk}, std::pair{"Dv", Dv}}) {
      if (v < 1) error(k, name, "= " + std::to_string(v) + " (expected >= 1)");
    }
    if (Hv % Hk != 0) {
      error(k, "Hv", "= " + std::to_string(Hv) + " (expected a multiple of Hk = " +
                         std::to_string(Hk) + ")");
    }
    need_float(k, "qkv", qkv, B * T * (2 * Hk * Dk + Hv * Dv));
    need_float(k, "a", a, B * T * Hv);
    need_float(k, "b", b, B * T * Hv);
    need_float(k, "A_log", A_log, Hv);
    need_float(k, "dt_bias", dt_bias, Hv);
    if (doc_start) need_dtype(k, "doc_start", doc_start, DType::i32, B * T);
  }
  static void gated_delta_rule_forward(const TensorView& out, const TensorView& qkv,
                                       const TensorView& a, const TensorView& b,
                                       const TensorView& A_log, const TensorView& dt_bias,
                                       int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                                       int64_t Dv, const TensorView& doc_start) {
    const char* k = "gated_delta_rule_forward";
    delta_rule_inputs(k, qkv, a, b, A_log, dt_bias, B, T, Hk, Hv, Dk, Dv, doc_start);
    need_float(k, "out", out, B * T * Hv * Dv);
    for (const auto& [name, v] : {std::pair{"qkv", &qkv}, std::pair{"a", &a}, std::pair{"b", &b},
                                  std::pair{"A_log", &A_log}, std::pair{"dt_bias", &dt_bias}}) {
      distinct(k, "out", out, name, *v);
    }
  }
  static void gated_delta_rule_backward(const TensorView& dqkv, const TensorView& da,
                                        const TensorView& db, const TensorView& dA_log,
                                        const TensorView& ddt_bias, const TensorView& dout,
                                        const TensorView& qkv, const TensorView& a,
                                        const TensorView& b, const TensorView& A_log,
                                        const TensorView& dt_bias, int64_t B, int64_t T,
                                        int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                        const TensorView& doc_start) {
    const char* k = "gated_delta_rule_backward";
    delta_rule_inputs(k, qkv, a, b, A_log, dt_bias, B, T, Hk, Hv, Dk, Dv, doc_start);
    need_float(k, "dout", dout, B * T * Hv * Dv);
    need_float(k, "dqkv", dqkv, B * T * (2 * Hk * Dk + Hv * Dv));
    need_float(k, "da", da, B * T * Hv);
    need_float(k, "db", db, B * T * Hv);
    need_float(k, "dA_log", dA_log, Hv);
    need_float(k, "ddt_bias", ddt_bias, Hv);
    const std::pair<const char*, const TensorView*> outs[] = {
        {"dqkv", &dqkv}, {"da", &da}, {"db", &db}, {"dA_log", &dA_log}, {"ddt_bias", &ddt_bias}};
    const std::pair<const char*, const TensorView*> ins[] = {
        {"dout", &dout}, {"qkv", &qkv}, {"a", &a}, {"b", &b}, {"A_log", &A_log},
        {"dt_bias", &dt_bias}};
    for (const auto& [oname, o] : outs) {
      for (const auto& [iname, i] : ins) distinct(k, oname, *o, iname, *i);
      for (const auto& [o2name, o2] : outs) {
        if (o2 != o) distinct(k, oname, *o, o2name, *o2);
      }
    }
  }

  // strided_copy: every stride >= 0, dst.col >= 1, and each view long enough for its last
  // element.
  static void strided_copy(const TensorView& dst, const Kernels::Strided& d, const TensorView& src,
                           const Kernels::Strided& s, int64_t R, int64_t G, int64_t W) {
    const char* k = "strided_copy";
    dim(k, "R", R);
    dim(k, "G", G);
    dim(k, "W", W);
    for (const auto& [name, v, at] : {std::tuple{"dst", &dst, &d}, std::tuple{"src", &src, &s}}) {
      if (at->row < 0 || at->offset < 0 || at->group < 0 || at->col < 0) {
        error(k, name, "has a negative stride or offset");
      }
      need_float(k, name, *v, at->extent(R, G, W));
    }
    if (d.col < 1) {
      error(k, "dst", "has column stride " + std::to_string(d.col) + " (expected >= 1)");
    }
  }

  // Mixture of experts: R tokens, E experts, K of them per token (1 <= K <= E).
  static void moe_dims(const char* k, int64_t R, int64_t E, int64_t K) {
    dim(k, "R", R);
    dim(k, "E", E);
    if (K < 1 || K > E) {
      error(k, "K", "= " + std::to_string(K) + " (expected 1 <= K <= E = " + std::to_string(E) +
                        ")");
    }
  }
  static void moe_router_forward(const TensorView& idx, const TensorView& weights,
                                 const TensorView& logits, int64_t R, int64_t E, int64_t K) {
    const char* k = "moe_router_forward";
    moe_dims(k, R, E, K);
    need_dtype(k, "idx", idx, DType::i32, R * K);
    need_dtype(k, "weights", weights, DType::f32, R * K);
    need_float(k, "logits", logits, R * E);
  }
  static void moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                  const TensorView& logits, const TensorView& idx, int64_t R,
                                  int64_t E, int64_t K) {
    const char* k = "moe_router_backward";
    moe_dims(k, R, E, K);
    need_float(k, "dlogits", dlogits, R * E);
    need_dtype(k, "dweights", dweights, DType::f32, R * K);
    need_float(k, "logits", logits, R * E);
    need_dtype(k, "idx", idx, DType::i32, R * K);
  }
  static void sigmoid_routing(const char* k, int64_t R, int64_t E, int64_t K,
                              const Kernels::SigmoidRouting& g) {
    moe_dims(k, R, E, K);
    const std::string groups = "n_group = " + std::to_string(g.n_group);
    if (g.n_group < 1 || E % g.n_group != 0 || (g.n_group > 1 && E / g.n_group < 2)) {
      error(k, groups.c_str(), "(expected 1, or a divisor of E = " + std::to_string(E) +
                                   " into groups of at least 2 experts)");
    }
    if (g.topk_group < 1 || g.topk_group > g.n_group) {
      error(k, "topk_group",
            "= " + std::to_string(g.topk_group) + " (expected 1 <= topk_group <= " + groups + ")");
    }
  }
  static void moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                         const TensorView& logits, const TensorView& bias,
                                         int64_t R, int64_t E, int64_t K,
                                         const Kernels::SigmoidRouting& g) {
    const char* k = "moe_sigmoid_router_forward";
    sigmoid_routing(k, R, E, K, g);
    need_dtype(k, "idx", idx, DType::i32, R * K);
    need_dtype(k, "weights", weights, DType::f32, R * K);
    need_float(k, "logits", logits, R * E);
    need_float(k, "bias", bias, E);
  }
  static void moe_sigmoid_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                          const TensorView& logits, const TensorView& idx,
                                          int64_t R, int64_t E, int64_t K,
                                          const Kernels::SigmoidRouting& g) {
    const char* k = "moe_sigmoid_router_backward";
    sigmoid_routing(k, R, E, K, g);
    need_float(k, "dlogits", dlogits, R * E);
    need_dtype(k, "dweights", dweights, DType::f32, R * K);
    need_float(k, "logits", logits, R * E);
    need_dtype(k, "idx", idx, DType::i32, R * K);
  }
  // moe_combine_*: returns N, the rows' count (rows.numel() / C).
  static int64_t moe_combine_dims(const char* k, const TensorView& rows, const TensorView& slot,
                                  int64_t R, int64_t K, int64_t C) {
    dim(k, "R", R);
    dim(k, "C", C);
    if (K < 1) error(k, "K", "= " + std::to_string(K) + " (expected >= 1)");
    need_float(k, "rows", rows, 0);
    need_dtype(k, "slot", slot, DType::i32, R * K);
    return C > 0 ? rows.numel() / C : 0;
  }
  static int64_t moe_combine_forward(const TensorView& out, const TensorView& rows,
                                     const TensorView& weights, const TensorView& slot, int64_t R,
                                     int64_t K, int64_t C) {
    const char* k = "moe_combine_forward";
    const int64_t N = moe_combine_dims(k, rows, slot, R, K, C);
    need_float(k, "out", out, R * C);
    if (weights) need_dtype(k, "weights", weights, DType::f32, R * K);
    distinct(k, "out", out, "rows", rows);
    return N;
  }
  static int64_t moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                                      const TensorView& dout, const TensorView& rows,
                                      const TensorView& weights, const TensorView& slot,
                                      int64_t R, int64_t K, int64_t C) {
    const char* k = "moe_combine_backward";
    const int64_t N = moe_combine_dims(k, rows, slot, R, K, C);
    need_float(k, "drows", drows, N * C);
    need_dtype(k, "dweights", dweights, DType::f32, R * K);
    need_float(k, "dout", dout, R * C);
    need_dtype(k, "weights", weights, DType::f32, R * K);
    distinct(k, "drows", drows, "dout", dout);
    distinct(k, "drows", drows, "rows", rows);
    return N;
  }

  static void moe_router_prob_sums(const TensorView& psum, const TensorView& logits, int64_t R,
                                   int64_t E) {
    const char* k = "moe_router_prob_sums";
    dim(k, "R", R);
    dim(k, "E", E);
    need_dtype(k, "psum", psum, DType::f32, E);
    need_float(k, "logits", logits, R * E);
  }
  static double* moe_aux_loss(const TensorView& loss, const TensorView& counts,
                              const TensorView& psum, int64_t E) {
    const char* k = "moe_aux_loss";
    double* l = scalar64(k, "loss", loss);
    dim(k, "E", E);
    need_dtype(k, "counts", counts, DType::f32, E);
    need_dtype(k, "psum", psum, DType::f32, E);
    return l;
  }
  static void moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                                    const TensorView& dprobs, int64_t R, int64_t E) {
    const char* k = "moe_aux_loss_backward";
    dim(k, "R", R);
    dim(k, "E", E);
    need_float(k, "dlogits", dlogits, R * E);
    need_float(k, "logits", logits, R * E);
    need_dtype(k, "dprobs", dprobs, DType::f32, E);
  }

  static void moe_shared_gate_forward(const TensorView& out, const TensorView& shared,
                                      const TensorView& logit, int64_t R, int64_t C) {
    const char* k = "moe_shared_gate_forward";
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "out", out, R * C);
    need_float(k, "shared", shared, R * C);
    need_float(k, "logit", logit, R);
    distinct(k, "out", out, "shared", shared);
  }
  static void moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                       const TensorView& dout, const TensorView& shared,
                                       const TensorView& logit, int64_t R, int64_t C) {
    const char* k = "moe_shared_gate_backward";
    dim(k, "R", R);
    dim(k, "C", C);
    need_float(k, "dshared", dshared, R * C);
    need_float(k, "dlogit", dlogit, R);
    need_float(k, "dout", dout, R * C);
    need_float(k, "shared", shared, R * C);
    need_float(k, "logit", logit, R);
    distinct(k, "dshared", dshared, "dout", dout);
    distinct(k, "dshared", dshared, "shared", shared);
  }

  // optimizers (fp32 shards)
  static void decay_ranges(const char* k, const WeightDecay& wd, int64_t n) {
    if (wd.ranges == nullptr) return;
    int64_t at = 0;
    for (const ElementRange& r : *wd.ranges) {
      if (r.begin < at || r.end <= r.begin || r.end > n) {
        throw Error(std::string(k) + ": weight decay range [" + std::to_string(r.begin) + ", " +
                    std::to_string(r.end) + ") is empty, unsorted, overlapping or outside [0, " +
                    std::to_string(n) + ")");
      }
      at = r.end;
    }
  }
  // The optional param_dtype copy of an update: none (an empty view), or bf16 / fp16 with
  // n elements.
  static void compute_copy(const char* k, const TensorView& copy, int64_t n) {
    if (!copy) return;
    if (copy.dtype != DType::bf16 && copy.dtype != DType::f16) {
      error(k, "compute_copy", "is " + describe(copy) + " (expected bf16 or fp16)");
    }
    size(k, "compute_copy", copy, n);
  }
  static void adamw_update(const TensorView& param, const TensorView& grad,
                           const TensorView& exp_avg, const TensorView& exp_avg_sq,
                           const WeightDecay& wd, const TensorView& copy = {},
                           const TensorView& grad_scale = {}) {
    const char* k = "adamw_update";
    const int64_t n = param.numel();
    decay_ranges(k, wd, n);
    need_dtype(k, "param", param, DType::f32, n);
    need_dtype(k, "grad", grad, DType::f32, n);
    need_dtype(k, "exp_avg", exp_avg, DType::f32, n);
    need_dtype(k, "exp_avg_sq", exp_avg_sq, DType::f32, n);
    compute_copy(k, copy, n);
    if (grad_scale) need_dtype(k, "grad_scale", grad_scale, DType::f32, 1);
  }
  static void sgd_update(const TensorView& param, const TensorView& grad,
                         const TensorView& momentum_buf, float momentum, const WeightDecay& wd,
                         const TensorView& copy = {}, const TensorView& grad_scale = {}) {
    const char* k = "sgd_update";
    const int64_t n = param.numel();
    decay_ranges(k, wd, n);
    need_dtype(k, "param", param, DType::f32, n);
    need_dtype(k, "grad", grad, DType::f32, n);
    if (momentum != 0.0f) need_dtype(k, "momentum_buf", momentum_buf, DType::f32, n);
    compute_copy(k, copy, n);
    if (grad_scale) need_dtype(k, "grad_scale", grad_scale, DType::f32, 1);
  }
};

}  // namespace fsdp
