// src/cuda/kernels_embedding.cu: token + position embedding, forward and backward, and T5's
// token lookup (the same without positions; its backward is the dwte part) (see kernels.hpp).
//
// Backward is deterministic without atomics, and sums in the CPU backend's order (rows
// i = 0..B*T-1 in turn, fp32 accumulation, one rounding for 16-bit storage):
//  - dwpe: one thread per (t, c) adds dout[b, t, c] for b = 0..B-1.
//  - dwte: the vocabulary is split into P interleaved classes (v % P); block (column tile,
//    class p) walks all tokens in order, a tile at a time: it lists the tile's rows whose
//    token is in its class (in order, in shared memory) and adds each listed row of dout
//    into the accumulator row of the token. Each (v, c) is owned by exactly one thread, which sees the rows in order, so
//    the result does not depend on P or on scheduling.
//  - the accumulator is dwte itself when it is fp32. For 16-bit dwte it is fp32 scratch
//    with one row per distinct token (rows numbered by an exclusive scan of "token seen"
//    flags): loaded from dwte, accumulated, rounded back once.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kTokenTile = 2048;  // tokens staged in shared memory per step
constexpr int kMaxClasses = 128;  // vocabulary classes (P) of the dwte kernel

// out[i, :] = wte[tokens[i], :] + wpe[i % T, :] (zeros for an out-of-range token).
template <class T>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(Wr<T> out, const int32_t* tokens, Rd<T> wte, Rd<T> wpe, int64_t N,
                             int64_t T_, int64_t C, int64_t V) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t tok = tokens[i];
    const bool ok = tok >= 0 && tok < V;
    const int64_t e = ok ? static_cast<int64_t>(tok) * C : 0, p = (i % T_) * C, o = i * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      out.set(o + c, ok ? wte[e + c] + wpe[p + c] : 0.0f);
    }
  }
}

// out[i, :] = table[tokens[i], :] (zeros for an out-of-range token).
template <class T>
__global__ void __launch_bounds__(kThreads)
    lookup_forward_kernel(Wr<T> out, const int32_t* tokens, Rd<T> table, int64_t N, int64_t C,
                          int64_t V) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t tok = tokens[i];
    const bool ok = tok >= 0 && tok < V;
    const int64_t e = ok ? static_cast<int64_t>(tok) * C : 0, o = i * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out.set(o + c, ok ? table[e + c] : 0.0f);
  }
}

// dwpe[t, c] += sum over b (in order) of dout[b, t, c].
template <class T>
__global__ void __launch_bounds__(kThreads)
    wpe_backward_kernel(Wr<T> dwpe, Rd<T> dout, int64_t B, int64_t T_, int64_t C) {
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dwpe.get(t * C + c);
      for (int64_t b = 0; b < B; ++b) acc += dout[(b * T_ + t) * C + c];
      dwpe.set(t * C + c, acc);
    }
  }
}

// acc[row(v), c] += dout[i, c] for every i (in order) with v = tokens[i] in class blockIdx.y;
// row(v) = slot[v], or v when slot is null. Per tile of kTokenTile tokens the block first
// lists the tile's positions whose token is in its class, in order (each thread tests
// kPerThread consecutive tokens; a block-wide exclusive scan of the per-thread counts gives
// each its place), then adds only those rows: a block's work is N / blockDim tests plus its
// own rows, not N tests per thread.
template <class TD>
__global__ void __launch_bounds__(kThreads)
    wte_backward_kernel(float* acc, const int32_t* slot, Rd<TD> dout, const int32_t* tokens,
                        int64_t N, int64_t C, int64_t V, int P) {
  constexpr int kPerThread = kTokenTile / kThreads;
  static_assert(kPerThread * kThreads == kTokenTile && kPerThread <= 32, "tile per thread");
  constexpr int kWarps = kThreads / 32;
  __shared__ int32_t pos[kTokenTile];  // the class's positions in the tile, in order
  __shared__ int32_t row[kTokenTile];  // their accumulator rows
  __shared__ int32_t warp_base[kWarps];
  __shared__ int32_t count;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int p = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t t0 = 0; t0 < N; t0 += kTokenTile) {
    const int cnt = static_cast<int>(min(static_cast<int64_t>(kTokenTile), N - t0));
    const int k0 = threadIdx.x * kPerThread;
    uint32_t mask = 0;  // bit j: token t0 + k0 + j is in this block's class
    for (int j = 0; j < kPerThread; ++j) {
      if (k0 + j >= cnt) break;
      const int32_t v = tokens[t0 + k0 + j];
      if (v >= 0 && v < V && v % P == p) mask |= 1u << j;
    }
    const int n = __popc(mask);
    int incl = n;  // inclusive scan of n over the warp
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    __syncthreads();  // the previous tile's lists are no longer read
    if (lane == 31) warp_base[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
      int run = 0;
      for (int w = 0; w < kWarps; ++w) {
        const int t = warp_base[w];
        warp_base[w] = run;
        run += t;
      }
      count = run;
    }
    __syncthreads();
    int out = warp_base[warp] + incl - n;
    for (uint32_t m = mask; m; m &= m - 1) {
      const int k = k0 + __ffs(m) - 1;
      const int32_t v = tokens[t0 + k];
      pos[out] = k;
      row[out] = slot ? slot[v] : v;
      ++out;
    }
    __syncthreads();
    if (c >= C) continue;
    const int total = count;
    for (int m = 0; m < total; ++m) {
      acc[static_cast<int64_t>(row[m]) * C + c] += dout[(t0 + pos[m]) * C + c];
    }
  }
}

// flags[tokens[i]] = 1 for every in-range token.
__global__ void __launch_bounds__(kThreads)
    mark_tokens_kernel(int32_t* flags, const int32_t* tokens, int64_t N, int64_t V) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N;
       i += stride) {
    const int32_t v = tokens[i];
    if (v >= 0 && v < V) flags[v] = 1;  // racing writes all store 1
  }
}

// slot[v] = sum of flags[0..v) (one block of 1024 threads; each scans a contiguous range).
__global__ void __launch_bounds__(1024)
    exclusive_scan_kernel(int32_t* slot, const int32_t* flags, int64_t V) {
  __shared__ int32_t sums[1024];
  const int64_t per = (V + blockDim.x - 1) / blockDim.x;
  const int64_t v0 = threadIdx.x * per, v1 = min(V, v0 + per);
  int32_t local = 0;
  for (int64_t v = v0; v < v1; ++v) local += flags[v];
  sums[threadIdx.x] = local;
  __syncthreads();
  // Hillis-Steele inclusive scan of the per-thread sums.
  for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {
    const int32_t add = threadIdx.x >= static_cast<unsigned>(off) ? sums[threadIdx.x - off] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int32_t run = sums[threadIdx.x] - local;  // exclusive prefix of this thread's range
  for (int64_t v = v0; v < v1; ++v) {
    slot[v] = run;
    run += flags[v];
  }
}

// For each flagged token v: acc[slot[v], :] = dwte[v, :] (load) or dwte[v, :] = acc (store).
template <class T, bool kLoad>
__global__ void __launch_bounds__(kThreads)
    wte_rows_kernel(Wr<T> dwte, float* acc, const int32_t* flags, const int32_t* slot, int64_t V,
                    int64_t C) {
  for (int64_t v = blockIdx.x; v < V; v += gridDim.x) {
    if (!flags[v]) continue;
    const int64_t row = slot[v];
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      if constexpr (kLoad) {
        acc[row * C + c] = dwte.get(v * C + c);
      } else {
        dwte.set(v * C + c, acc[row * C + c]);
      }
    }
  }
}

}  // namespace

void embedding_forward(Out out, const int32_t* tokens, In wte, In wpe, int64_t B, int64_t T,
                       int64_t C, int64_t V, cudaStream_t s) {
  const int64_t N = B * T;
  if (N <= 0 || C <= 0) return;
  dispatch_uniform("embedding_forward", {out.t, wte.t, wpe.t}, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>(N < kMaxBlocks ? N : kMaxBlocks);
    embedding_forward_kernel<TT>
        <<<blocks, kThreads, 0, s>>>(wr<TT>(out), tokens, rd<TT>(wte), rd<TT>(wpe), N, T, C, V);
    FSDP_CHECK_LAUNCH();
  });
}

EmbeddingScratch embedding_backward_scratch(ST dwte_type, int64_t B, int64_t T, int64_t C,
                                            int64_t V) {
  EmbeddingScratch sc;
  if (dwte_type == ST::f32 || B * T <= 0 || C <= 0 || V <= 0) return sc;
  const int64_t rows = V < B * T ? V : B * T;  // distinct tokens, at most
  sc.floats = rows * C;
  sc.ints = 2 * V;
  return sc;
}

void embedding_backward(Out dwte, Out dwpe, In dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, int64_t V, float* fscratch, int32_t* iscratch, cudaStream_t s) {
  const int64_t N = B * T;
  if (N <= 0 || C <= 0) return;
  // dwpe
  dispatch_uniform("embedding_backward", {dwpe.t, dout.t}, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>(T < kMaxBlocks ? T : kMaxBlocks);
    wpe_backward_kernel<TT><<<blocks, kThreads, 0, s>>>(wr<TT>(dwpe), rd<TT>(dout), B, T, C);
    FSDP_CHECK_LAUNCH();
  });
  embedding_lookup_backward(dwte, dout, tokens, N, C, V, fscratch, iscratch, s);
}

void embedding_lookup_forward(Out out, const int32_t* tokens, In table, int64_t N, int64_t C,
                              int64_t V, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  dispatch_uniform("embedding_lookup_forward", {out.t, table.t}, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>(N < kMaxBlocks ? N : kMaxBlocks);
    lookup_forward_kernel<TT>
        <<<blocks, kThreads, 0, s>>>(wr<TT>(out), tokens, rd<TT>(table), N, C, V);
    FSDP_CHECK_LAUNCH();
  });
}

// The dwte part of embedding_backward: dtable [V, C] += dout [N, C] scattered by tokens.
void embedding_lookup_backward(Out dwte, In dout, const int32_t* tokens, int64_t N, int64_t C,
                               int64_t V, float* fscratch, int32_t* iscratch, cudaStream_t s) {
  if (N <= 0 || C <= 0 || V <= 0) return;
  const int64_t col_blocks = (C + kThreads - 1) / kThreads;
  int64_t P = 1024 / col_blocks;
  P = P < 1 ? 1 : (P > kMaxClasses ? kMaxClasses : P);
  if (P > V) P = V;
  const bool direct = dwte.t == ST::f32;
  float* acc = direct ? static_cast<float*>(dwte.p) : fscratch;
  int32_t* flags = iscratch;
  int32_t* slot = direct ? nullptr : iscratch + V;
  if (!direct) {
    FSDP_CHECK_CUDA(cudaMemsetAsync(flags, 0, static_cast<std::size_t>(V) * sizeof(int32_t), s));
    mark_tokens_kernel<<<blocks_for(N, kThreads), kThreads, 0, s>>>(flags, tokens, N, V);
    FSDP_CHECK_LAUNCH();
    exclusive_scan_kernel<<<1, 1024, 0, s>>>(slot, flags, V);
    FSDP_CHECK_LAUNCH();
    dispatch_float("embedding_backward", dwte.t, [&](auto tag) {
      using TT = typename decltype(tag)::type;
      wte_rows_kernel<TT, true>
          <<<blocks_for(V, 1), kThreads, 0, s>>>(wr<TT>(dwte), acc, flags, slot, V, C);
      FSDP_CHECK_LAUNCH();
    });
  }
  dispatch_float("embedding_backward", dout.t, [&](auto tag) {
    using TD = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(P));
    wte_backward_kernel<TD>
        <<<grid, kThreads, 0, s>>>(acc, slot, rd<TD>(dout), tokens, N, C, V, static_cast<int>(P));
    FSDP_CHECK_LAUNCH();
  });
  if (!direct) {
    dispatch_float("embedding_backward", dwte.t, [&](auto tag) {
      using TT = typename decltype(tag)::type;
      wte_rows_kernel<TT, false>
          <<<blocks_for(V, 1), kThreads, 0, s>>>(wr<TT>(dwte), acc, flags, slot, V, C);
      FSDP_CHECK_LAUNCH();
    });
  }
}

}  // namespace fsdp::cuda::kernels
