// src/cuda/kernels_t5.cu: T5's relative position bias, forward (a gather) and backward (see
// kernels.hpp).
//
// The bias is kept by relative position (fsdp::relative_positions): n = Tq + Tk - 1 entries
// per head. Backward is deterministic without atomics: block (nb, h) owns dtable[nb, h]; its
// threads walk the n relative positions in a fixed stride pattern, add dbias[h, o] where
// buckets[o] == nb (fp64), and a fixed-order block reduction gives the sum, added to dtable
// once.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;

// bias[h, o] = table[buckets[o], h] (0 for an out-of-range bucket).
template <class T>
__global__ void __launch_bounds__(kThreads)
    position_bias_forward_kernel(float* bias, Rd<T> table, const int32_t* buckets, int64_t NB,
                                 int64_t H, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < H * n;
       e += stride) {
    const int64_t h = e / n, o = e % n;
    const int32_t b = buckets[o];
    bias[e] = (b >= 0 && b < NB) ? table[static_cast<int64_t>(b) * H + h] : 0.0f;
  }
}

// Block (blockIdx.x, blockIdx.y) = (nb, h): dtable[nb, h] += sum of dbias[h, o] over the o
// with buckets[o] == nb.
template <class T>
__global__ void __launch_bounds__(kThreads)
    position_bias_backward_kernel(Wr<T> dtable, const float* dbias, const int32_t* buckets,
                                  int64_t H, int64_t n) {
  const int64_t nb = blockIdx.x, h = blockIdx.y;
  const float* d = dbias + h * n;
  double acc = 0.0;
  for (int64_t o = threadIdx.x; o < n; o += blockDim.x) {
    if (buckets[o] == nb) acc += d[o];
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    const int64_t e = nb * H + h;
    dtable.set(e, dtable.get(e) + static_cast<float>(acc));
  }
}

}  // namespace

void position_bias_forward(float* bias, In table, const int32_t* buckets, int64_t NB, int64_t H,
                           int64_t Tq, int64_t Tk, cudaStream_t s) {
  const int64_t n = Tq > 0 && Tk > 0 ? Tq + Tk - 1 : 0;  // relative positions
  if (H <= 0 || n <= 0) return;
  dispatch_float("position_bias_forward", table.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    position_bias_forward_kernel<T><<<blocks_for(H * n, kThreads), kThreads, 0, s>>>(
        bias, rd<T>(table), buckets, NB, H, n);
    FSDP_CHECK_LAUNCH();
  });
}

void position_bias_backward(Out dtable, const float* dbias, const int32_t* buckets, int64_t NB,
                            int64_t H, int64_t Tq, int64_t Tk, cudaStream_t s) {
  const int64_t n = Tq > 0 && Tk > 0 ? Tq + Tk - 1 : 0;  // relative positions
  if (H <= 0 || n <= 0 || NB <= 0) return;
  if (NB > 0x7fffffff || H > 65535) {
    throw Error("cuda backend: position_bias_backward: NB = " + std::to_string(NB) +
                ", H = " + std::to_string(H) + " exceed the launch grid (H <= 65535)");
  }
  dispatch_float("position_bias_backward", dtable.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(NB), static_cast<unsigned>(H));
    position_bias_backward_kernel<T><<<grid, kThreads, 0, s>>>(wr<T>(dtable), dbias, buckets, H, n);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
