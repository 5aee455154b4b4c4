// src/cuda/kernels_attention.cu: the causal softmax of attention, forward and backward, and
// the masked, biased softmax of T5's general attention (mha) with its bias gradient (see
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
// Without `causal` every j < T is read (mha: the zeros of P give zeros of dS).
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(float* dp, const T* att, int64_t rows, int64_t T_, bool causal) {
  extern __shared__ float row_buf[];  // [T_]
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t len = causal ? r % T_ + 1 : T_;
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

// mha: row r = (bl * H + h) * Tq + i of batch b0 + bl; see kernels.hpp.
template <class T>
__global__ void __launch_bounds__(kThreads)
    mha_softmax_forward_kernel(Wr<T> att, const float* scores, const float* bias,
                               const int32_t* key_mask, int64_t rows, int64_t b0, int64_t H,
                               int64_t Tq, int64_t Tk, bool causal) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % Tq, h = (r / Tq) % H, b = b0 + r / (Tq * H);
    const int64_t len = causal ? min(Tk, i + 1) : Tk;  // keys j >= len are masked
    const float* x = scores + r * Tk;
    const float* br = bias ? bias + (h * Tq + i) * Tk : nullptr;
    const int32_t* km = key_mask ? key_mask + b * Tk : nullptr;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      if (km && km[j] == 0) continue;
      mx = fmaxf(mx, x[j] + (br ? br[j] : 0.0f));
    }
    mx = block_max(mx);
    if (mx == -INFINITY) {  // every key masked (the same for the whole block)
      for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) att.set(r * Tk + j, 0.0f);
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      if (km && km[j] == 0) continue;
      sum += expf(x[j] + (br ? br[j] : 0.0f) - mx);
    }
    sum = block_sum(sum);  // also orders every read of the row before the writes below
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
      const bool on = j < len && !(km && km[j] == 0);
      att.set(r * Tk + j, on ? expf(x[j] + (br ? br[j] : 0.0f) - mx) * inv : 0.0f);
    }
  }
}

// dbias[e] += sum over b of ds[b, e], e = (h * Tq + i) * Tk + j, one thread per e.
template <class T>
__global__ void __launch_bounds__(kThreads)
    mha_dbias_kernel(float* dbias, const T* ds, int64_t lds, int64_t B, int64_t H, int64_t Tq,
                     int64_t Tk) {
  const int64_t n = H * Tq * Tk;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t row = e / Tk, j = e % Tk;  // row = h * Tq + i
    double acc = 0.0;
    for (int64_t b = 0; b < B; ++b) acc += to_f(ds[(b * H * Tq + row) * lds + j]);
    dbias[e] += static_cast<float>(acc);
  }
}

// Launches softmax_backward_kernel<T> with a row of T_ floats of dynamic shared memory.
template <class TT>
void launch_softmax_backward(const char* what, float* dp, const TT* att, int64_t rows, int64_t T,
                             bool causal, cudaStream_t s) {
  const std::size_t smem = static_cast<std::size_t>(T) * sizeof(float);
  if (smem > 48 * 1024) {  // opt in to more than the default dynamic shared memory
    int device = 0, max_smem = 0;
    FSDP_CHECK_CUDA(cudaGetDevice(&device));
    FSDP_CHECK_CUDA(
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (smem > static_cast<std::size_t>(max_smem)) {
      throw Error(std::string("cuda backend: ") + what + ": rows of " + std::to_string(T) +
                  " need " + std::to_string(smem) + " bytes of shared memory per block (the " +
                  "device allows " + std::to_string(max_smem) + ")");
    }
    FSDP_CHECK_CUDA(cudaFuncSetAttribute(softmax_backward_kernel<TT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  softmax_backward_kernel<TT><<<blocks_for(rows, 1), kThreads, smem, s>>>(dp, att, rows, T, causal);
  FSDP_CHECK_LAUNCH();
}

}  // namespace

void mha_softmax_forward(Out att, const float* scores, const float* bias, const int32_t* key_mask,
                         int64_t rows, int64_t b0, int64_t H, int64_t Tq, int64_t Tk, bool causal,
                         cudaStream_t s) {
  if (rows <= 0 || Tk <= 0) return;
  dispatch_float("mha_forward", att.t, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    mha_softmax_forward_kernel<TT><<<blocks_for(rows, 1), kThreads, 0, s>>>(
        wr<TT>(att), scores, bias, key_mask, rows, b0, H, Tq, Tk, causal);
    FSDP_CHECK_LAUNCH();
  });
}

void mha_softmax_backward(float* dp, In att, ST ds_type, int64_t rows, int64_t Tk,
                          cudaStream_t s) {
  if (rows <= 0 || Tk <= 0) return;
  if (ds_type != att.t) bad_type("mha_backward (dS must have att's type)", ds_type);
  dispatch_float("mha_backward", att.t, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    launch_softmax_backward<TT>("mha_backward", dp, static_cast<const TT*>(att.p), rows, Tk, false,
                                s);
  });
}

void mha_dbias(float* dbias, const void* ds, ST ds_type, int64_t lds, int64_t B, int64_t H,
               int64_t Tq, int64_t Tk, cudaStream_t s) {
  const int64_t n = H * Tq * Tk;
  if (n <= 0 || B <= 0) return;
  dispatch_float("mha_backward", ds_type, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    mha_dbias_kernel<TT><<<blocks_for(n, kThreads), kThreads, 0, s>>>(
        dbias, static_cast<const TT*>(ds), lds, B, H, Tq, Tk);
    FSDP_CHECK_LAUNCH();
  });
}

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
  dispatch_float("attention_backward", att.t, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    launch_softmax_backward<TT>("attention_backward", dp, static_cast<const TT*>(att.p), rows, T,
                                true, s);
  });
}

}  // namespace fsdp::cuda::kernels
