// src/cuda/kernels_elementwise.cu: casts, add / axpy / scale, GELU, ReLU, mul, bias add, fused
// bias + GELU, strided copies (column blocks, broadcasts and group sums), loss-scale
// unscaling, gated attention's sigmoid output gate, and the device-side index check (see
// kernels.hpp).
//
// One grid-stride "map" kernel serves the elementwise ops: out[i] = op(a[i], b[i]) in fp32,
// stored rounded to nearest even. When no argument is run-time typed and all pointers are
// 16-byte aligned, each thread moves 8 elements per iteration with 16-byte accesses (the
// tail, < 8 elements, element by element). Each element is read and written by one thread,
// in that order, so `out` may alias an input.
//
// Launches per call and bytes moved (s = bytes per element): every op here is 1 launch
// (cast of equal types: one cudaMemcpyAsync, none in place). Map ops read their inputs and
// write out once (unary: 2 n s, binary: 3 n s); add_bias reads and writes out (2 R C s);
// bias_gelu_forward reads fc, writes fc and out (3 R C s; add_bias + gelu_forward: 4 R C s
// in 2 launches); add_bias_residual reads h and residual, writes h (3 R C s; add_bias + add:
// 5 R C s in 2 launches); strided_copy reads each src element it names once per output
// that uses it (R G W reads, summed or not) and writes dst once (R G W, or R W when summing
// groups; accumulate reads it too); sigmoid_gate_forward reads x, gate and writes out
// (3 n s), sigmoid_gate_backward reads dout, x, gate and writes dx, dgate (5 n s);
// check_indices reads n int32 in one block.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {

const char* st_name(ST t) {
  switch (t) {
    case ST::f32:
      return "fp32";
    case ST::bf16:
      return "bf16";
    case ST::f16:
      return "fp16";
    case ST::f64:
      return "fp64";
  }
  return "?";
}

namespace {

constexpr int kThreads = 256;

template <class T>
constexpr bool kIsDyn = std::is_same_v<T, Dyn>;

// ---------------------------------------------------------------------------------------
// fp32 operations. bind() runs once per thread (scale_by reads its device scalar there).

struct AddOp {
  __device__ AddOp bind() const { return *this; }
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AxpyOp {  // a = y, b = x
  float alpha;
  __device__ AxpyOp bind() const { return *this; }
  __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
struct ScaleOp {
  float alpha;
  __device__ ScaleOp bind() const { return *this; }
  __device__ float operator()(float x, float) const { return x * alpha; }
};
struct ScaleByOp {
  const float* coef;
  __device__ ScaleOp bind() const { return ScaleOp{*coef}; }
};
struct GeluOp {
  __device__ GeluOp bind() const { return *this; }
  __device__ float operator()(float x, float) const { return gelu(x); }
};
struct GeluGradOp {  // a = x, b = dout
  __device__ GeluGradOp bind() const { return *this; }
  __device__ float operator()(float x, float dout) const { return gelu_grad(x, dout); }
};
struct ReluOp {
  __device__ ReluOp bind() const { return *this; }
  __device__ float operator()(float x, float) const { return x > 0.0f ? x : 0.0f; }
};
struct ReluGradOp {  // a = x, b = dout; relu'(0) = 0 as torch's threshold_backward
  __device__ ReluGradOp bind() const { return *this; }
  __device__ float operator()(float x, float dout) const { return x > 0.0f ? dout : 0.0f; }
};
struct MulOp {
  __device__ MulOp bind() const { return *this; }
  __device__ float operator()(float a, float b) const { return a * b; }
};

// out[i] = op(a[i], b[i]) for i < n (unary ops ignore b; pass b = a).
template <class TO, class TA, class TB, class Op>
__global__ void __launch_bounds__(kThreads)
    map_kernel(Wr<TO> out, Rd<TA> a, Rd<TB> b, int64_t n, bool vec, Op op) {
  const auto f = op.bind();
  // x * 1 is x: the clip coefficient of a step whose norm is below max_norm (the common
  // case) costs no pass over the gradient.
  if constexpr (std::is_same_v<Op, ScaleByOp>) {
    if (f.alpha == 1.0f) return;
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (!kIsDyn<TO> && !kIsDyn<TA> && !kIsDyn<TB>) {
    if (vec) {
      const int64_t packs = n / 8;
      for (int64_t v = first; v < packs; v += stride) {
        const Pack8<TA> pa = load8(a.p + 8 * v);
        const Pack8<TB> pb = load8(b.p + 8 * v);
        Pack8<TO> po;
#pragma unroll
        for (int k = 0; k < 8; ++k) po.v[k] = from_f<TO>(f(to_f(pa.v[k]), to_f(pb.v[k])));
        store8(out.p + 8 * v, po);
      }
      done = packs * 8;
    }
  }
  for (int64_t i = done + first; i < n; i += stride) out.set(i, f(a[i], b[i]));
}

template <class TO, class TA, class TB, class Op>
void launch_map(Out out, In a, In b, int64_t n, Op op, cudaStream_t s) {
  const bool vec = aligned16(out.p) && aligned16(a.p) && aligned16(b.p);
  const int blocks = blocks_for(vec ? (n + 7) / 8 : n, kThreads);
  map_kernel<TO, TA, TB, Op>
      <<<blocks, kThreads, 0, s>>>(wr<TO>(out), rd<TA>(a), rd<TB>(b), n, vec, op);
  FSDP_CHECK_LAUNCH();
}

// All arguments of one type: that instantiation; otherwise the run-time typed one.
template <class Op>
void map_uniform(const char* what, Out out, In a, In b, int64_t n, Op op, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform(what, {out.t, a.t, b.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map<T, T, T>(out, a, b, n, op, s);
  });
}

// ---------------------------------------------------------------------------------------
// casts: exact conversions, or one rounding to nearest even. fp64 -> 16-bit goes through
// fp32 rounded to odd (Boldo & Melquiond), which gives the correctly rounded result, as the
// CPU backend does.

__device__ __forceinline__ float f64_to_f32_odd(double d) {
  const float f = __double2float_rz(d);  // truncated toward zero (FLT_MAX on overflow)
  if (isnan(d)) return __double2float_rn(d);
  if (static_cast<double>(f) == d) return f;
  return __int_as_float(__float_as_int(f) | 1);
}

template <class D, class S>
__device__ __forceinline__ D convert(S s) {
  if constexpr (std::is_same_v<D, double>) {
    if constexpr (std::is_same_v<S, double>) {
      return s;
    } else {
      return static_cast<double>(to_f(s));
    }
  } else if constexpr (std::is_same_v<S, double>) {
    if constexpr (std::is_same_v<D, float>) {
      return __double2float_rn(s);
    } else {
      return from_f<D>(f64_to_f32_odd(s));
    }
  } else {
    return from_f<D>(to_f(s));
  }
}

template <class D, class S>
__global__ void __launch_bounds__(kThreads) cast_kernel(D* dst, const S* src, int64_t n, bool vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t packs = n / 8;
    for (int64_t v = first; v < packs; v += stride) {
      const Pack8<S> ps = load8(src + 8 * v);
      Pack8<D> pd;
#pragma unroll
      for (int k = 0; k < 8; ++k) pd.v[k] = convert<D>(ps.v[k]);
      store8(dst + 8 * v, pd);
    }
    done = packs * 8;
  }
  for (int64_t i = done + first; i < n; i += stride) dst[i] = convert<D>(src[i]);
}

template <class F>
void dispatch_any(ST t, F&& f) {
  if (t == ST::f64) {
    f(Tag<double>{});
  } else {
    dispatch_float("cast", t, f);
  }
}

// ---------------------------------------------------------------------------------------
// bias add: rows over blocks, columns over threads (8 per thread when C % 8 == 0 and the
// pointers are aligned).

template <class T>
__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(Wr<T> out, Rd<T> bias, int64_t R, int64_t C, bool vec) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t base = r * C;
    if constexpr (!kIsDyn<T>) {
      if (vec) {
        for (int64_t c = 8 * static_cast<int64_t>(threadIdx.x); c < C; c += 8 * blockDim.x) {
          Pack8<T> po = load8(out.p + base + c);
          const Pack8<T> pb = load8(bias.p + c);
#pragma unroll
          for (int k = 0; k < 8; ++k) po.v[k] = from_f<T>(to_f(po.v[k]) + to_f(pb.v[k]));
          store8(out.p + base + c, po);
        }
        continue;
      }
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      out.set(base + c, out.get(base + c) + bias[c]);
  }
}

// h[i] = (h[i] + bias[i % C], rounded to T) + residual[i], rounded to T (no bias: h[i] +
// residual[i]): exactly add_bias then add. A grid-stride loop over all n = R C elements, 8 per
// thread and step with 16-byte accesses when vec (C % 8 == 0: a pack never crosses a row), so
// every thread has work whatever C is (rows over threads would leave 160 of 256 idle at
// C = 768); each thread carries its column along (two divisions per thread, none per step).
template <class T>
__global__ void __launch_bounds__(kThreads)
    bias_residual_kernel(T* h, const T* bias, const T* residual, int64_t n, int64_t C, bool vec) {
  const int64_t w = vec ? 8 : 1;  // elements per step
  const int64_t step = w * static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = w * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  const int64_t cstep = step % C;
  int64_t c = first % C;  // = i % C
  if (vec) {
    for (int64_t i = first; i < n; i += step) {
      Pack8<T> ph = load8(h + i);
      const Pack8<T> px = load8(residual + i);
      if (bias) {
        const Pack8<T> pb = load8(bias + c);
#pragma unroll
        for (int k = 0; k < 8; ++k) ph.v[k] = from_f<T>(to_f(ph.v[k]) + to_f(pb.v[k]));
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) ph.v[k] = from_f<T>(to_f(ph.v[k]) + to_f(px.v[k]));
      store8(h + i, ph);
      c += cstep;
      if (c >= C) c -= C;
    }
  } else {
    for (int64_t i = first; i < n; i += step) {
      T v = h[i];
      if (bias) v = from_f<T>(to_f(v) + to_f(bias[c]));
      h[i] = from_f<T>(to_f(v) + to_f(residual[i]));
      c += cstep;
      if (c >= C) c -= C;
    }
  }
}

// GeGLU (T5 v1.1 gated-GELU) for glu_fwd/bwd_kernel: out = round_gate(gelu(gate)) * up (the
// values of gelu_forward into a gate-typed buffer, then mul); dup = dout * round_gate(gelu(
// gate)), dgate = gelu_grad(gate, round_dgate(dout * up)) (mul, mul, gelu_backward).
struct GegluOp {
  ST gate_t, dgate_t;
  template <class T>
  __device__ float fwd(float g, float u) const {
    return round_as<T>(gelu(g), gate_t) * u;
  }
  template <class T>
  __device__ void bwd(float g, float u, float d, float& dg, float& du) const {
    du = d * round_as<T>(gelu(g), gate_t);
    dg = gelu_grad(g, round_as<T>(d * u, dgate_t));
  }
};

// Gated attention's output gate (HF Qwen3NextAttention: attn_output * sigmoid(gate)) for
// glu_fwd/bwd_kernel with (gate, up) = (x, gate): out = x s; dx = dout s, dgate = dout x s
// (1 - s), s = sigmoid(gate), in fp32 as the CPU backend (expf here, std::exp there). The
// kernels read an element's inputs before writing its outputs: out = x, dx = dout and dgate =
// gate are safe.
struct SigmoidGateOp {
  __device__ static float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
  template <class T>
  __device__ float fwd(float x, float g) const {
    return x * sigmoid(g);
  }
  template <class T>
  __device__ void bwd(float x, float g, float d, float& dx, float& dg) const {
    const float s = sigmoid(g);
    dx = d * s;
    dg = d * x * (s * (1.0f - s));
  }
};

// bias + GELU (GPT-2 MLP): fc[r, c] += bias[c], rounded to T, then out = gelu of that stored
// value (exactly add_bias then gelu_forward). Rows over blocks, columns over threads (8 per
// thread with 16-byte accesses when vec). fc is stored before out, so out may alias fc.
constexpr int kBiasGeluThreads = 128;  // 8 x 128 = 1024 columns per pass: 3 for GPT-2's 4C = 3072

template <class T>
__global__ void __launch_bounds__(kBiasGeluThreads)
    bias_gelu_kernel(T* out, T* fc, const T* bias, int64_t R, int64_t C, bool vec) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t base = r * C;
    if (vec) {
      for (int64_t c = 8 * static_cast<int64_t>(threadIdx.x); c < C; c += 8 * kBiasGeluThreads) {
        Pack8<T> pf = load8(fc + base + c);
        const Pack8<T> pb = load8(bias + c);
        Pack8<T> po;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          pf.v[k] = from_f<T>(to_f(pf.v[k]) + to_f(pb.v[k]));
          po.v[k] = from_f<T>(gelu(to_f(pf.v[k])));
        }
        store8(fc + base + c, pf);
        store8(out + base + c, po);
      }
    } else {
      for (int64_t c = threadIdx.x; c < C; c += kBiasGeluThreads) {
        const T v = from_f<T>(to_f(fc[base + c]) + to_f(bias[c]));
        fc[base + c] = v;
        out[base + c] = from_f<T>(gelu(to_f(v)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// strided copies: element (r, g, c) of a view at r * row + offset + g * group + c * col.

// The (r, g, c) of linear index i = (r G + g) W + c along a grid-stride loop: decomposed once
// at the start, then the stride's own (dr, dg, dc) added with carries (no division per step;
// c + dc < 2 W and g + dg + carry < 2 G, so one subtraction each suffices).
struct GridWalk {
  int64_t r, g, c, dr, dg, dc, G, W;
  __device__ GridWalk(int64_t first, int64_t stride, int64_t groups, int64_t width)
      : G(groups), W(width) {
    c = first % W;
    g = first / W % G;
    r = first / W / G;
    dc = stride % W;
    dg = stride / W % G;
    dr = stride / W / G;
  }
  __device__ void next() {
    c += dc;
    int64_t carry = 0;
    if (c >= W) {
      c -= W;
      carry = 1;
    }
    g += dg + carry;
    if (g >= G) {
      g -= G;
      ++r;
    }
    r += dr;
  }
};

// kReduce false: one thread per output (r, g, c), n = R G Wn of them: dst(r, g, c) = (or +=)
// src(r, g, c). kReduce true (d.group == 0): one thread per output (r, c), n = R Wn: the fp32
// sum over g = 0..G-1 in turn, from 0, as the CPU. With `vec` (T a storage type, both col
// strides 1, W, offsets and row / group strides multiples of 8, 16-byte aligned pointers) a
// "column" is a pack of 8 consecutive elements (Wn = W / 8) moved with 16-byte accesses.
template <class T, bool kReduce>
__global__ void __launch_bounds__(kThreads)
    strided_copy_kernel(Wr<T> dst, Strided d, Rd<T> src, Strided s, int64_t n, int64_t G,
                        int64_t Wn, bool vec, bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  GridWalk w(first, stride, kReduce ? 1 : G, Wn);
  for (int64_t i = first; i < n; i += stride, w.next()) {
    const int64_t c = vec ? 8 * w.c : w.c;
    const int64_t so = w.r * s.row + s.offset + w.g * s.group + c * s.col;
    const int64_t dof = w.r * d.row + d.offset + w.g * d.group + c * d.col;
    if constexpr (!kIsDyn<T>) {
      if (vec) {
        float v[8];
        if constexpr (kReduce) {
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = 0.0f;
          for (int64_t g = 0; g < G; ++g) {
            const Pack8<T> ps = load8(src.p + so + g * s.group);
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] += to_f(ps.v[k]);
          }
        } else {
          const Pack8<T> ps = load8(src.p + so);
          if (!accumulate) {  // a copy in one storage type: the bits as they are
            store8(dst.p + dof, ps);
            continue;
          }
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = to_f(ps.v[k]);
        }
        Pack8<T> po;
        if (accumulate) {
          po = load8(dst.p + dof);
#pragma unroll
          for (int k = 0; k < 8; ++k) po.v[k] = from_f<T>(to_f(po.v[k]) + v[k]);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) po.v[k] = from_f<T>(v[k]);
        }
        store8(dst.p + dof, po);
        continue;
      }
    }
    float v;
    if constexpr (kReduce) {
      v = 0.0f;
      for (int64_t g = 0; g < G; ++g) v += src[so + g * s.group];
    } else {
      v = src[so];
    }
    dst.set(dof, accumulate ? dst.get(dof) + v : v);
  }
}

// ---------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    unscale_kernel(float* x, float inv_scale, int64_t n, double* found_inf) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int bad = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    bad |= !isfinite(v);
    x[i] = v * inv_scale;
  }
  // Every thread that saw a non-finite value writes the same 1.0: the result is the same
  // whichever write lands.
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0;
}

// One block: each thread finds the first out-of-range index of its stride class, the block
// takes the smallest position, and thread 0 records it (unless an earlier kernel already
// recorded an error: the first error in stream order is the one reported). Deterministic:
// the reported position is the first bad one, as on the CPU.
constexpr int kCheckThreads = 1024;
__global__ void __launch_bounds__(kCheckThreads)
    check_indices_kernel(const int32_t* idx, int64_t n, int64_t bound, int code, DeviceError* err,
                         bool allow_ignore) {
  __shared__ long long first_bad[32];
  long long pos = LLONG_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t v = idx[i];
    if ((v < 0 || v >= bound) && !(allow_ignore && v == kIgnoreTarget)) {
      pos = i;
      break;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) pos = min(pos, __shfl_xor_sync(kFullMask, pos, o));
  if ((threadIdx.x & 31) == 0) first_bad[threadIdx.x >> 5] = pos;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) pos = min(pos, first_bad[w]);
    if (pos != LLONG_MAX && err->code == kErrNone) {
      err->code = code;
      err->position = pos;
      err->value = idx[pos];
      err->bound = bound;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// launchers

void cast(Out dst, In src, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (dst.t == src.t) {
    if (dst.p != src.p) {
      FSDP_CHECK_CUDA(cudaMemcpyAsync(dst.p, src.p, static_cast<std::size_t>(n) * st_size(dst.t),
                                      cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  dispatch_any(dst.t, [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_any(src.t, [&](auto stag) {
      using S = typename decltype(stag)::type;
      if constexpr (!std::is_same_v<D, S>) {
        const bool vec = aligned16(dst.p) && aligned16(src.p);
        const int blocks = blocks_for(vec ? (n + 7) / 8 : n, kThreads);
        cast_kernel<D, S><<<blocks, kThreads, 0, s>>>(static_cast<D*>(dst.p),
                                                      static_cast<const S*>(src.p), n, vec);
        FSDP_CHECK_LAUNCH();
      }
    });
  });
}

void add(Out out, In a, In b, int64_t n, cudaStream_t s) {
  map_uniform("add", out, a, b, n, AddOp{}, s);
}

void axpy(Out y, float alpha, In x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  // Every (y, x) pair has its own instantiation: fp32 shards += 16-bit reduced gradients is
  // a per-step path.
  const In yin{y.p, y.t};
  dispatch_float("axpy", y.t, [&](auto ytag) {
    using TY = typename decltype(ytag)::type;
    dispatch_float("axpy", x.t, [&](auto xtag) {
      using TX = typename decltype(xtag)::type;
      launch_map<TY, TY, TX>(y, yin, x, n, AxpyOp{alpha}, s);
    });
  });
}

void scale(Out x, float alpha, int64_t n, cudaStream_t s) {
  const In xin{x.p, x.t};
  map_uniform("scale", x, xin, xin, n, ScaleOp{alpha}, s);
}

void scale_by(Out x, const float* coef, int64_t n, cudaStream_t s) {
  const In xin{x.p, x.t};
  map_uniform("scale_by", x, xin, xin, n, ScaleByOp{coef}, s);
}

void gelu_forward(Out out, In x, int64_t n, cudaStream_t s) {
  map_uniform("gelu_forward", out, x, x, n, GeluOp{}, s);
}

void gelu_backward(Out dx, In x, In dout, int64_t n, cudaStream_t s) {
  map_uniform("gelu_backward", dx, x, dout, n, GeluGradOp{}, s);
}

void relu_forward(Out out, In x, int64_t n, cudaStream_t s) {
  map_uniform("relu_forward", out, x, x, n, ReluOp{}, s);
}

void relu_backward(Out dx, In x, In dout, int64_t n, cudaStream_t s) {
  map_uniform("relu_backward", dx, x, dout, n, ReluGradOp{}, s);
}

void mul(Out out, In a, In b, int64_t n, cudaStream_t s) { map_uniform("mul", out, a, b, n, MulOp{}, s); }

void add_bias(Out out, In bias, int64_t R, int64_t C, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch_uniform("add_bias", {out.t, bias.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = C % 8 == 0 && aligned16(out.p) && aligned16(bias.p);
    const int blocks = static_cast<int>(R < kMaxBlocks ? R : kMaxBlocks);
    add_bias_kernel<T><<<blocks, kThreads, 0, s>>>(wr<T>(out), rd<T>(bias), R, C, vec);
    FSDP_CHECK_LAUNCH();
  });
}

void geglu_forward(Out out, In gate, In up, int64_t n, cudaStream_t s) {
  glu_forward("geglu_forward", out, gate, up, n, GegluOp{gate.t, gate.t}, s);
}

void geglu_backward(Out dgate, Out dup, In dout, In gate, In up, int64_t n, cudaStream_t s) {
  glu_backward("geglu_backward", dgate, dup, dout, gate, up, n, GegluOp{gate.t, dgate.t}, s);
}

void sigmoid_gate_forward(Out out, In x, In gate, int64_t n, cudaStream_t s) {
  glu_forward("sigmoid_gate_forward", out, x, gate, n, SigmoidGateOp{}, s);
}

void sigmoid_gate_backward(Out dx, Out dgate, In dout, In x, In gate, int64_t n, cudaStream_t s) {
  glu_backward("sigmoid_gate_backward", dx, dgate, dout, x, gate, n, SigmoidGateOp{}, s);
}

void add_bias_residual(Out h, In bias, In residual, int64_t R, int64_t C, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  if (residual.t != h.t || (bias.p && bias.t != h.t)) {  // mixed storage: the kernels it fuses
    if (bias.p) add_bias(h, bias, R, C, s);
    add(h, In{h.p, h.t}, residual, R * C, s);
    return;
  }
  dispatch_float("add_bias_residual", h.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = C % 8 == 0 && aligned16(h.p) && aligned16(residual.p) &&
                     (!bias.p || aligned16(bias.p));
    const int64_t n = R * C;
    const int blocks = blocks_for(vec ? n / 8 : n, kThreads);
    bias_residual_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<T*>(h.p),
                                                        static_cast<const T*>(bias.p),
                                                        static_cast<const T*>(residual.p), n, C,
                                                        vec);
    FSDP_CHECK_LAUNCH();
  });
}

void bias_gelu_forward(Out out, Out fc, In bias, int64_t R, int64_t C, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  if (out.t != fc.t || bias.t != fc.t) {  // mixed storage types: the two kernels it fuses
    add_bias(fc, bias, R, C, s);
    gelu_forward(out, In{fc.p, fc.t}, R * C, s);
    return;
  }
  dispatch_float("bias_gelu_forward", fc.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = C % 8 == 0 && aligned16(out.p) && aligned16(fc.p) && aligned16(bias.p);
    const int blocks = static_cast<int>(R < kMaxBlocks ? R : kMaxBlocks);
    bias_gelu_kernel<T><<<blocks, kBiasGeluThreads, 0, s>>>(
        static_cast<T*>(out.p), static_cast<T*>(fc.p), static_cast<const T*>(bias.p), R, C, vec);
    FSDP_CHECK_LAUNCH();
  });
}

void strided_copy(Out dst, const Strided& d, In src, const Strided& s, int64_t R, int64_t G,
                  int64_t W, bool accumulate, cudaStream_t st) {
  if (R <= 0 || G <= 0 || W <= 0) return;
  const bool reduce = d.group == 0;
  dispatch_uniform("strided_copy", {dst.t, src.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto mult8 = [](const Strided& a) {
      return a.row % 8 == 0 && a.offset % 8 == 0 && a.group % 8 == 0;
    };
    const bool vec = !kIsDyn<T> && d.col == 1 && s.col == 1 && W % 8 == 0 && mult8(d) &&
                     mult8(s) && aligned16(dst.p) && aligned16(src.p);
    const int64_t Wn = vec ? W / 8 : W;
    const int64_t n = R * (reduce ? 1 : G) * Wn;
    const int blocks = blocks_for(n, kThreads);
    if (reduce) {
      strided_copy_kernel<T, true><<<blocks, kThreads, 0, st>>>(wr<T>(dst), d, rd<T>(src), s, n, G,
                                                                Wn, vec, accumulate);
    } else {
      strided_copy_kernel<T, false><<<blocks, kThreads, 0, st>>>(wr<T>(dst), d, rd<T>(src), s, n,
                                                                 G, Wn, vec, accumulate);
    }
    FSDP_CHECK_LAUNCH();
  });
}

void unscale_and_check(float* x, float inv_scale, int64_t n, double* found_inf, cudaStream_t s) {
  if (n <= 0) return;
  unscale_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(x, inv_scale, n, found_inf);
  FSDP_CHECK_LAUNCH();
}

__global__ void read_to_mapped_kernel(void* dst, const void* src, int64_t bytes, bool words,
                                      DeviceError* err_dst, const DeviceError* err) {
  if (words) {
    auto* d = static_cast<uint32_t*>(dst);
    const auto* x = static_cast<const uint32_t*>(src);
    for (int64_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) d[i] = x[i];
  } else {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* x = static_cast<const unsigned char*>(src);
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) d[i] = x[i];
  }
  if (err_dst != nullptr && threadIdx.x == 0) *err_dst = *err;
}

void read_to_mapped(void* dst, const void* src, int64_t bytes, DeviceError* err_dst,
                    const DeviceError* err, cudaStream_t s) {
  const bool words = bytes % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(src) % 4 == 0;
  read_to_mapped_kernel<<<1, 256, 0, s>>>(dst, src, bytes, words, err_dst, err);
  FSDP_CHECK_LAUNCH();
}

void check_indices(const int32_t* idx, int64_t n, int64_t bound, int code, DeviceError* err,
                   cudaStream_t s, bool allow_ignore) {
  if (n <= 0) return;
  check_indices_kernel<<<1, kCheckThreads, 0, s>>>(idx, n, bound, code, err, allow_ignore);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
