// src/cuda/kernels_gemm.cpp: row-major GEMMs on cuBLASLt and cuBLAS (see kernels.hpp, Blas).
//
// Row-major through column-major libraries: a row-major [R, W] matrix is the column-major
// [W, R] matrix with the same leading dimension, i.e. its transpose. So the row-major
// C[M,N] = op(A) op(B) is computed as the column-major C^T[N,M] = op(B)^T op(A)^T: the
// libraries get (m, n, k) = (N, M, K), B as their first operand and A as their second, each
// with its own transpose flag and the stored row width as leading dimension. No data moves.
//
// Compute type CUBLAS_COMPUTE_32F with fp32 alpha/beta: fp32 accumulation for every storage
// type, and no TF32 (results match the CPU backend to fp32 rounding). A plan (operation and
// layout descriptors, the first algorithm of the heuristic) is cached per (transposes,
// shape, types, pointer alignments): a training step's GEMM shapes repeat. If cuBLASLt
// offers no algorithm or refuses one, the call falls back to cublasGemmEx with the same
// arguments. Epilogues (gemm_epilogue: bias, bias + GELU keeping GELU's input, GELU's
// backward with the bias gradient, a weight gradient with its bias gradient, ReLU) have
// plans of their own; refused, they report it and the caller runs the unfused kernels.
#include <climits>
#include <cstdint>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/check.hpp"
#include "kernels.hpp"

namespace fsdp::cuda::kernels {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLAS' recommendation for Hopper

cudaDataType_t data_type(ST t) {
  switch (t) {
    case ST::f32:
      return CUDA_R_32F;
    case ST::bf16:
      return CUDA_R_16BF;
    case ST::f16:
      return CUDA_R_16F;
    case ST::f64:
      return CUDA_R_64F;
  }
  return CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 1;
  while (al < 256 && (a & static_cast<uintptr_t>(al)) == 0) al <<= 1;
  return al;
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw Error("cuda backend: gemm: " + std::string(what) + " = " + std::to_string(v) +
                " is out of range for cuBLAS (expected 0 <= " + what + " <= INT_MAX)");
  }
  return static_cast<int>(v);
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

struct Blas::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // cuBLASLt has an algorithm for it
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (second) cublasLtMatrixLayoutDestroy(second);
    if (first) cublasLtMatrixLayoutDestroy(first);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  try {
    FSDP_CHECK_CUBLAS(cublasCreate(&blas_));
    FSDP_CHECK_CUBLAS(cublasLtCreate(&lt_));
    FSDP_CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
    workspace_bytes_ = kWorkspaceBytes;
    // cublasSetStream resets the workspace: set the stream first.
    FSDP_CHECK_CUBLAS(cublasSetStream(blas_, stream_));
    FSDP_CHECK_CUBLAS(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
    FSDP_CHECK_CUBLAS(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    if (workspace_) cudaFree(workspace_);
    if (lt_) cublasLtDestroy(lt_);
    if (blas_) cublasDestroy(blas_);
    throw;
  }
}

Blas::~Blas() {
  plans_.clear();
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  if (workspace_) cudaFree(workspace_);
}

bool Blas::direct(ST ab, ST c) {
  if (ab == ST::f64 || c == ST::f64) return false;
  return c == ab || c == ST::f32;
}

Blas::Plan& Blas::plan(const Key& key, const void* bias, const void* aux) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [ta, tb, M, N, K, ab_i, c_i, align_a, align_b, align_c, epi_i, align_bias,
              align_aux] = key;
  const auto ab = static_cast<ST>(ab_i), ct = static_cast<ST>(c_i);
  auto p = std::make_unique<Plan>();
  FSDP_CHECK_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = op(tb), op_second = op(ta);
  FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                   sizeof op_first));
  FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                   sizeof op_second));
  // Epilogue: in the column-major view D^T [N, M], so the bias is per row of D^T (our
  // columns, length N) and the aux matrix has D^T's shape with leading dimension N.
  static_cast<void>(align_bias);  // only in the key: a plan per alignment of bias and aux
  static_cast<void>(align_aux);
  const auto epi = static_cast<Epilogue>(epi_i);
  if (epi != Epilogue::none) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    switch (epi) {
      case Epilogue::none:
      case Epilogue::bias: break;
      case Epilogue::gelu_aux_bias: e = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
      case Epilogue::dgelu_bgrad: e = CUBLASLT_EPILOGUE_DGELU_BGRAD; break;
      case Epilogue::bgradb: e = CUBLASLT_EPILOGUE_BGRADB; break;
      case Epilogue::relu: e = CUBLASLT_EPILOGUE_RELU; break;
    }
    FSDP_CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (epi == Epilogue::gelu_aux_bias || epi == Epilogue::dgelu_bgrad) {
      const int64_t ld = N;
      FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                       &ld, sizeof ld));
      FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(
          p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    }
    if (epi != Epilogue::relu) {
      FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof bias));
    }
  }
  // First operand: row-major B ([K,N], or [N,K] if trans_b) = column-major [N,K] / [K,N].
  const auto rows_first = static_cast<uint64_t>(tb ? K : N),
             cols_first = static_cast<uint64_t>(tb ? N : K);
  // Second operand: row-major A ([M,K], or [K,M] if trans_a) = column-major [K,M] / [M,K].
  const auto rows_second = static_cast<uint64_t>(ta ? M : K),
             cols_second = static_cast<uint64_t>(ta ? K : M);
  FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->first, data_type(ab), rows_first, cols_first,
                                               static_cast<int64_t>(rows_first)));
  FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->second, data_type(ab), rows_second, cols_second,
                                               static_cast<int64_t>(rows_second)));
  // C: row-major [M,N] = column-major [N,M], leading dimension N.
  FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, data_type(ct), static_cast<uint64_t>(N),
                                               static_cast<uint64_t>(M), N));

  cublasLtMatmulPreference_t pref = nullptr;
  FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  try {
    const uint64_t ws = workspace_bytes_;
    const auto al_first = static_cast<uint32_t>(align_b),
               al_second = static_cast<uint32_t>(align_a), al_c = static_cast<uint32_t>(align_c);
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first, sizeof al_first));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second, sizeof al_second));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p->op, p->first, p->second, p->c,
                                                             p->c, pref, 1, &result, &count);
    // No algorithm (or a configuration the heuristic rejects, e.g. 2-byte aligned 16-bit
    // operands): the plan falls back to cublasGemmEx, which takes any alignment.
    if (st == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      p->algo = result.algo;
      p->usable = true;
    }
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  Plan& ref = *p;
  plans_.emplace(key, std::move(p));
  return ref;
}

void Blas::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const void* A, const void* B, ST ab, float beta, void* C, ST c) {
  const Key key{trans_a,      trans_b,      M,           N, K, static_cast<int>(ab),
                static_cast<int>(c), alignment(A), alignment(B), alignment(C),
                static_cast<int>(Epilogue::none), 0, 0};
  Plan& p = plan(key);
  if (p.usable) {
    // beta == 0: cuBLASLt does not read C (BLAS semantics), so NaN there is ignored.
    const cublasStatus_t st =
        cublasLtMatmul(lt_, p.op, &alpha, B, p.first, A, p.second, &beta, C, p.c, C, p.c, &p.algo,
                       workspace_, workspace_bytes_, stream_);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) {
      FSDP_CHECK_CUBLAS(st);
    }
    p.usable = false;  // refused before running: use cublasGemmEx from now on
  }
  gemm_fallback(trans_a, trans_b, M, N, K, alpha, A, B, ab, beta, C, c);
}

bool Blas::gemm_epilogue(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const void* A, const void* B, ST t, float beta, void* C,
                         Epilogue epilogue, const void* bias, const void* aux) {
  if (epilogue == Epilogue::none || t == ST::f64) return false;
  if (epilogue == Epilogue::bgradb && !trans_a) return false;
  const bool with_aux = epilogue == Epilogue::gelu_aux_bias || epilogue == Epilogue::dgelu_bgrad;
  const int align_bias = epilogue != Epilogue::relu ? alignment(bias) : 0;
  const int align_aux = with_aux ? alignment(aux) : 0;
  const Key key{trans_a,      trans_b,      M,           N, K, static_cast<int>(t),
                static_cast<int>(t), alignment(A), alignment(B), alignment(C),
                static_cast<int>(epilogue), align_bias, align_aux};
  Plan& p = plan(key, bias, aux);
  if (!p.usable) return false;
  // The pointers are this call's (the plan is shared by every call of its key).
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (epilogue != Epilogue::relu) {
    st = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                        sizeof bias);
  }
  if (st == CUBLAS_STATUS_SUCCESS && with_aux) {
    st = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                        sizeof aux);
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    const float alpha = 1.0f;
    st = cublasLtMatmul(lt_, p.op, &alpha, B, p.first, A, p.second, &beta, C, p.c, C, p.c, &p.algo,
                        workspace_, workspace_bytes_, stream_);
  }
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) {
    FSDP_CHECK_CUBLAS(st);
  }
  p.usable = false;  // refused before running: the unfused kernels from now on
  return false;
}

void Blas::gemm_fallback(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void* A, const void* B, ST ab, float beta, void* C, ST c) {
  const int m = to_int(M, "M"), n = to_int(N, "N"), k = to_int(K, "K");
  const int ld_first = trans_b ? k : n, ld_second = trans_a ? m : k;
  FSDP_CHECK_CUBLAS(cublasGemmEx(blas_, op(trans_b), op(trans_a), n, m, k, &alpha, B, data_type(ab),
                                 ld_first, A, data_type(ab), ld_second, &beta, C, data_type(c), n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Blas::gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                float alpha, const void* A, int64_t lda, int64_t stride_a,
                                const void* B, int64_t ldb, int64_t stride_b, ST ab, float beta,
                                void* C, int64_t ldc, int64_t stride_c, ST c, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  FSDP_CHECK_CUBLAS(cublasGemmStridedBatchedEx(
      blas_, op(trans_b), op(trans_a), to_int(N, "N"), to_int(M, "M"), to_int(K, "K"), &alpha, B,
      data_type(ab), to_int(ldb, "ldb"), stride_b, A, data_type(ab), to_int(lda, "lda"), stride_a,
      &beta, C, data_type(c), to_int(ldc, "ldc"), stride_c, to_int(batch, "batch"),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace fsdp::cuda::kernels
