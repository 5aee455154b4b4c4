// src/cuda/kernels_layernorm.cu: LayerNorm and RMSNorm (T5LayerNorm) forward and backward
// (see kernels.hpp). RMSNorm follows the LayerNorm scheme below without mean and bias.
//
// Forward: one warp per row; mean and variance accumulated in fp64 as the CPU backend does
// (two passes over the row, which stays in L1), mean/rstd stored in fp32.
// Backward: (1) dweight/dbias partial column sums over fixed row chunks into fp32 scratch
// [2, G, C], (2) one warp per row accumulates dx, (3) the partials are added in chunk order
// (fp64) and each of dweight/dbias is rounded once. Pass (1) runs before (2), so even a dx
// that aliased dout would be read before it is overwritten.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kColTile = 32;
constexpr int kRowThreads = 8;
constexpr int64_t kMaxRowChunks = 1024;

int64_t rows_per_chunk(int64_t R) {
  int64_t rpc = (R + kMaxRowChunks - 1) / kMaxRowChunks;
  if (rpc < 64) rpc = 64;
  return (rpc + kRowThreads - 1) / kRowThreads * kRowThreads;
}
int64_t row_chunks(int64_t R) {
  const int64_t rpc = rows_per_chunk(R);
  return R > 0 ? (R + rpc - 1) / rpc : 0;
}

// x: [R,C]; weight, bias: [C]; out: [R,C]; mean, rstd: [R] fp32.
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    ln_forward_kernel(Wr<T> out, float* mean, float* rstd, Rd<T> x, Rd<T> weight, Rd<T> bias,
                      int64_t R, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;  // the whole warp: no block-level synchronisation below
  const int64_t base = r * C;
  double s = 0.0;
  for (int64_t c = lane; c < C; c += 32) s += x[base + c];
  const double mu = warp_sum(s) / static_cast<double>(C);
  double ss = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const double d = x[base + c] - mu;
    ss += d * d;
  }
  const double var = warp_sum(ss) / static_cast<double>(C);
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  for (int64_t c = lane; c < C; c += 32) {
    out.set(base + c, (x[base + c] - m) * rs * weight[c] + bias[c]);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx[r] += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dout * weight.
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    ln_backward_dx_kernel(Wr<T> dx, Rd<T> dout, Rd<T> x, Rd<T> weight, const float* mean,
                          const float* rstd, int64_t R, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;
  const int64_t base = r * C;
  const float m = mean[r], rs = rstd[r];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (x[base + c] - m) * rs;
    const float dxhat = dout[base + c] * weight[c];
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  const float m1 = warp_sum(s1) / static_cast<float>(C);
  const float m2 = warp_sum(s2) / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (x[base + c] - m) * rs;
    const float dxhat = dout[base + c] * weight[c];
    dx.set(base + c, dx.get(base + c) + rs * (dxhat - m1 - xhat * m2));
  }
}

// block (32, 8), grid (ceil(C/32), G): partial[0, g, c] = sum over chunk g of dout * xhat,
// partial[1, g, c] = sum of dout.
template <class T>
__global__ void __launch_bounds__(kColTile* kRowThreads)
    ln_backward_partials_kernel(Rd<T> dout, Rd<T> x, const float* mean, const float* rstd,
                                int64_t R, int64_t C, int64_t rpc, float* partial) {
  __shared__ float shw[kRowThreads][kColTile + 1];
  __shared__ float shb[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t g = blockIdx.y, G = gridDim.y;
  const int64_t r0 = g * rpc, r1 = min(R, r0 + rpc);
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      const float d = dout[r * C + c];
      aw += d * ((x[r * C + c] - mean[r]) * rstd[r]);
      ab += d;
    }
  }
  shw[threadIdx.y][threadIdx.x] = aw;
  shb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.0f, sb = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) {
      sw += shw[k][threadIdx.x];
      sb += shb[k][threadIdx.x];
    }
    partial[g * C + c] = sw;
    partial[(G + g) * C + c] = sb;
  }
}

// out[c] += sum over g of part[g, c], in g order (fp64), rounded once.
template <class T>
__global__ void __launch_bounds__(256)
    finish_kernel(Wr<T> out, const float* part, int64_t G, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double sum = 0.0;
  for (int64_t g = 0; g < G; ++g) sum += part[g * C + c];
  out.set(c, out.get(c) + static_cast<float>(sum));
}

// ---- RMSNorm (T5LayerNorm): the same structure without mean and bias ----

// rstd[r] = 1/sqrt(mean(x^2) + eps) (sum in fp64); out = weight * (x * rstd).
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    rms_forward_kernel(Wr<T> out, float* rstd, Rd<T> x, Rd<T> weight, int64_t R, int64_t C,
                       float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;
  const int64_t base = r * C;
  double ss = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const double v = x[base + c];
    ss += v * v;
  }
  const double var = C > 0 ? warp_sum(ss) / static_cast<double>(C) : 0.0;
  const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  for (int64_t c = lane; c < C; c += 32) out.set(base + c, weight[c] * (x[base + c] * rs));
  if (lane == 0) rstd[r] = rs;
}

// dx[r] += rstd (dxhat - xhat mean(dxhat xhat)), xhat = x rstd, dxhat = dout * weight.
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    rms_backward_dx_kernel(Wr<T> dx, Rd<T> dout, Rd<T> x, Rd<T> weight, const float* rstd,
                           int64_t R, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;
  const int64_t base = r * C;
  const float rs = rstd[r];
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += (dout[base + c] * weight[c]) * (x[base + c] * rs);
  const float m = warp_sum(s) / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = x[base + c] * rs;
    dx.set(base + c, dx.get(base + c) + rs * (dout[base + c] * weight[c] - xhat * m));
  }
}

// block (32, 8), grid (ceil(C/32), G): partial[g, c] = sum over chunk g of dout * x * rstd.
template <class T>
__global__ void __launch_bounds__(kColTile* kRowThreads)
    rms_backward_partials_kernel(Rd<T> dout, Rd<T> x, const float* rstd, int64_t R, int64_t C,
                                 int64_t rpc, float* partial) {
  __shared__ float shw[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rpc, r1 = min(R, r0 + rpc);
  float aw = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      aw += dout[r * C + c] * (x[r * C + c] * rstd[r]);
    }
  }
  shw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) sw += shw[k][threadIdx.x];
    partial[g * C + c] = sw;
  }
}

}  // namespace

void rmsnorm_forward(Out out, float* rstd, In x, In weight, int64_t R, int64_t C, float eps,
                     cudaStream_t s) {
  if (R <= 0) return;
  dispatch_uniform("rmsnorm_forward", {out.t, x.t, weight.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
    rms_forward_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(wr<T>(out), rstd, rd<T>(x),
                                                                rd<T>(weight), R, C, eps);
    FSDP_CHECK_LAUNCH();
  });
}

int64_t rmsnorm_backward_scratch_floats(int64_t R, int64_t C) { return row_chunks(R) * C; }

void rmsnorm_backward(Out dx, Out dweight, In dout, In x, In weight, const float* rstd, int64_t R,
                      int64_t C, float* scratch, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const int64_t rpc = rows_per_chunk(R), G = row_chunks(R);
  dispatch_uniform("rmsnorm_backward", {dout.t, x.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(G));
    rms_backward_partials_kernel<T><<<grid, dim3(kColTile, kRowThreads), 0, s>>>(
        rd<T>(dout), rd<T>(x), rstd, R, C, rpc, scratch);
    FSDP_CHECK_LAUNCH();
  });
  dispatch_uniform("rmsnorm_backward", {dx.t, dout.t, x.t, weight.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
    rms_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
        wr<T>(dx), rd<T>(dout), rd<T>(x), rd<T>(weight), rstd, R, C);
    FSDP_CHECK_LAUNCH();
  });
  dispatch_float("rmsnorm_backward", dweight.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    finish_kernel<T><<<static_cast<unsigned>((C + 255) / 256), 256, 0, s>>>(wr<T>(dweight),
                                                                             scratch, G, C);
    FSDP_CHECK_LAUNCH();
  });
}

void layernorm_forward(Out out, float* mean, float* rstd, In x, In weight, In bias, int64_t R,
                       int64_t C, float eps, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch_uniform("layernorm_forward", {out.t, x.t, weight.t, bias.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
    ln_forward_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
        wr<T>(out), mean, rstd, rd<T>(x), rd<T>(weight), rd<T>(bias), R, C, eps);
    FSDP_CHECK_LAUNCH();
  });
}

int64_t layernorm_backward_scratch_floats(int64_t R, int64_t C) { return 2 * row_chunks(R) * C; }

void layernorm_backward(Out dx, Out dweight, Out dbias, In dout, In x, In weight, const float* mean,
                        const float* rstd, int64_t R, int64_t C, float* scratch, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const int64_t rpc = rows_per_chunk(R), G = row_chunks(R);
  dispatch_uniform("layernorm_backward", {dout.t, x.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(G));
    ln_backward_partials_kernel<T><<<grid, dim3(kColTile, kRowThreads), 0, s>>>(
        rd<T>(dout), rd<T>(x), mean, rstd, R, C, rpc, scratch);
    FSDP_CHECK_LAUNCH();
  });
  dispatch_uniform("layernorm_backward", {dx.t, dout.t, x.t, weight.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
    ln_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(wr<T>(dx), rd<T>(dout), rd<T>(x),
                                                                   rd<T>(weight), mean, rstd, R, C);
    FSDP_CHECK_LAUNCH();
  });
  const auto cblocks = static_cast<unsigned>((C + 255) / 256);
  dispatch_float("layernorm_backward", dweight.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    finish_kernel<T><<<cblocks, 256, 0, s>>>(wr<T>(dweight), scratch, G, C);
    FSDP_CHECK_LAUNCH();
  });
  dispatch_float("layernorm_backward", dbias.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    finish_kernel<T><<<cblocks, 256, 0, s>>>(wr<T>(dbias), scratch + G * C, G, C);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
