// src/cuda/kernels_attention.cu: the causal softmax of attention, forward and backward (see
// kernels.hpp). The GEMMs around them (S = Q K^T, O = P V, dP = dO V^T, dQ, dK, dV) are
// cuBLAS strided-batched calls issued by cuda_backend.cpp.
//
// One block per row of T scores (query position i = row % T); only j <= i is read, j > i is
// written as 0. Max, sum and dot products are block reductions in a fixed order; all math in
// fp32.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 128;

// att[r, j] = exp(s[r, j] - max) / sum for j <= r % T, else 0. In place when att is scores.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_forward_kernel(Wr<T> att, const float* scores, int64_t rows, int64_t T_) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t len = r % T_ + 1;
    const float* x = scores + r * T_;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = block_max(mx);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) sum += expf(x[j] - mx);
    sum = block_sum(sum);  // also orders every read of the row before the writes below
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < T_; j += blockDim.x) {
      att.set(r * T_ + j, j < len ? expf(x[j] - mx) * inv : 0.0f);
    }
  }
}

// dS[r, j] = P[r, j] (dP[r, j] - sum_k dP[r, k] P[r, k]) for j <= r % T, else 0, written as
// T over the first bytes of the fp32 row of dP (row stride in T elements: T * 4 / sizeof T).
// The row of dP is first copied to shared memory, so the narrower writes cannot overwrite
// values still to be read.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(float* dp, const T* att, int64_t rows, int64_t T_) {
  extern __shared__ float row_buf[];  // [T_]
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t len = r % T_ + 1;
    float* drow = dp + r * T_;
    const T* prow = att + r * T_;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const float d = drow[j];
      row_buf[j] = d;
      dot += d * to_f(prow[j]);
    }
    dot = block_sum(dot);  // __syncthreads inside: the whole row is in row_buf
    T* srow = reinterpret_cast<T*>(drow);
    for (int64_t j = threadIdx.x; j < T_; j += blockDim.x) {
      srow[j] = from_f<T>(j < len ? to_f(prow[j]) * (row_buf[j] - dot) : 0.0f);
    }
    __syncthreads();  // row_buf is reused by the next row
  }
}

}  // namespace

void attention_softmax_forward(Out att, const float* scores, int64_t rows, int64_t T,
                               cudaStream_t s) {
  if (rows <= 0 || T <= 0) return;
  dispatch_float("attention_forward", att.t, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    softmax_forward_kernel<TT>
        <<<blocks_for(rows, 1), kThreads, 0, s>>>(wr<TT>(att), scores, rows, T);
    FSDP_CHECK_LAUNCH();
  });
}

void attention_softmax_backward(float* dp, In att, ST ds_type, int64_t rows, int64_t T,
                                cudaStream_t s) {
  if (rows <= 0 || T <= 0) return;
  if (ds_type != att.t) bad_type("attention_backward (dS must have att's type)", ds_type);
  const std::size_t smem = static_cast<std::size_t>(T) * sizeof(float);
  dispatch_float("attention_backward", att.t, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    if (smem > 48 * 1024) {  // opt in to more than the default dynamic shared memory
      int device = 0, max_smem = 0;
      FSDP_CHECK_CUDA(cudaGetDevice(&device));
      FSDP_CHECK_CUDA(
          cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      if (smem > static_cast<std::size_t>(max_smem)) {
        throw Error("cuda backend: attention_backward: T = " + std::to_string(T) + " needs " +
                    std::to_string(smem) + " bytes of shared memory per block (the " +
                    "device allows " + std::to_string(max_smem) + ")");
      }
      FSDP_CHECK_CUDA(cudaFuncSetAttribute(softmax_backward_kernel<TT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    }
    softmax_backward_kernel<TT>
        <<<blocks_for(rows, 1), kThreads, smem, s>>>(dp, static_cast<const TT*>(att.p), rows, T);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
