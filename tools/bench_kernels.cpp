// tools/bench_kernels.cpp: time the CUDA backend's memory-bound transformer kernels alone -
// LayerNorm and RMSNorm forward/backward, the residual add fused into the norm forward, and
// the GPT-2 MLP's fused bias + GELU (each fused op with the unfused kernels it replaces
// beside it) - at the shapes of the models we train, in bf16, through the Backend interface
// (so per-call scratch from the caching allocator is included, as in training). A second
// table times the GEMMs with cuBLASLt epilogues (gemm_bias, gemm_bias_gelu,
// gemm_dgelu_bias_grad, gemm_weight_bias_grad at GPT-2's shapes, gemm_relu at T5's), each
// beside the GEMM and the kernel it replaces, in microseconds per call and TFLOP/s (2 M N K).
//
//   build_cuda/bench_kernels [CALLS]      (default 50; CUDA build only)
//
// Shapes (R rows of C; the MLP ops run on [R, 4C]): GPT-2 124M (B 8 x 1024: R = 8192,
// C = 768), GPT-2 1.5B (B 4 x 1024: R = 4096, C = 1600), t5-small (B 32 x 462 encoder
// tokens: R = 14784, C = 512). Per op: microseconds per call (CUDA events around CALLS calls
// after 3 warm-up calls), the bytes the op must move at least (each [R, C] operand read or
// written once - norm forward 2, backward 4 (dx accumulates: read and written), residual add
// + norm forward 4 (h and residual read, h and out written), bias + GELU 3 - leaving out the
// weight, bias and statistic vectors and the partial-sum scratch; the unfused rows are
// charged the fused op's bytes, so their GB/s is the effective rate) and the bandwidth that
// gives (H100 SXM HBM3: about 3350 GB/s peak). tools/bench_kernels_torch.py times PyTorch's
// kernels at the same shapes with the same byte counts, so the two tables compare row by
// row (run both in one GPU session: gpu_check.sh's conditions; it has no rows for the fused
// residual adds yet).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fsdp/backend/backend.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/cuda_backend.hpp"

namespace {

using fsdp::Backend;
using fsdp::DeviceBuffer;
using fsdp::DType;
using fsdp::MemCategory;

struct Model {
  const char* name;
  int64_t R, C;
};
constexpr Model kModels[] = {
    {"gpt2-124M", 8 * 1024, 768}, {"gpt2-1.5B", 4 * 1024, 1600}, {"t5-small", 32 * 462, 512}};

// A bf16 buffer of n values uniform in [lo, hi).
DeviceBuffer random_bf16(Backend& be, int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> h(static_cast<std::size_t>(n));
  for (auto& v : h) v = fsdp::f32_to_bf16(d(rng));
  DeviceBuffer b(be, DType::bf16, n, MemCategory::other);
  be.copy_from_host(b.view(), h.data());
  return b;
}

// Mean seconds per call of f over `calls` calls (CUDA events on the compute stream).
double seconds_per_call(Backend& be, const std::function<void()>& f, int calls) {
  for (int i = 0; i < 3; ++i) f();
  auto t0 = be.create_timed_event(), t1 = be.create_timed_event();
  t0->record(be.compute_stream());
  for (int i = 0; i < calls; ++i) f();
  t1->record(be.compute_stream());
  be.synchronize();
  return t1->seconds_since(*t0) / calls;
}

void row(const Model& m, const char* op, double bytes, double s) {
  std::printf("| %s | %s | %lld x %lld | %.1f | %.1f | %.0f |\n", m.name, op,
              static_cast<long long>(m.R), static_cast<long long>(m.C), s * 1e6, bytes / 1e6,
              bytes / s / 1e9);
}

void bench(Backend& be, const Model& m, int calls) {
  std::mt19937 rng(1);
  const int64_t R = m.R, C = m.C, n = R * C, F = 4 * C;
  const double e = 2.0;  // bytes per bf16 element
  DeviceBuffer x = random_bf16(be, n, rng, -2.0f, 3.0f), dout = random_bf16(be, n, rng, -1.0f, 1.0f);
  DeviceBuffer out = random_bf16(be, n, rng, -1.0f, 1.0f), dx = random_bf16(be, n, rng, -1.0f, 1.0f);
  DeviceBuffer w = random_bf16(be, C, rng, 0.5f, 1.5f), b = random_bf16(be, C, rng, -1.0f, 1.0f);
  DeviceBuffer dw = random_bf16(be, C, rng, -1.0f, 1.0f), db = random_bf16(be, C, rng, -1.0f, 1.0f);
  DeviceBuffer mean(be, DType::f32, R, MemCategory::other), rstd(be, DType::f32, R, MemCategory::other);
  const auto V = [](const DeviceBuffer& d) { return d.view(); };

  row(m, "layernorm_forward", 2 * n * e, seconds_per_call(be, [&] {
        be.layernorm_forward(V(out), V(mean), V(rstd), V(x), V(w), V(b), R, C, 1e-5f);
      }, calls));
  row(m, "layernorm_backward", 4 * n * e, seconds_per_call(be, [&] {
        be.layernorm_backward(V(dx), V(dw), V(db), V(dout), V(x), V(w), V(mean), V(rstd), R, C);
      }, calls));
  row(m, "rmsnorm_forward", 2 * n * e, seconds_per_call(be, [&] {
        be.rmsnorm_forward(V(out), V(rstd), V(x), V(w), R, C, 1e-6f);
      }, calls));
  row(m, "rmsnorm_backward", 4 * n * e, seconds_per_call(be, [&] {
        be.rmsnorm_backward(V(dx), V(dw), V(dout), V(x), V(w), V(rstd), R, C);
      }, calls));

  // The residual add fused into the next norm (gpt2.cpp's ln2 with the attention projection's
  // bias; llama.cpp's and t5.cpp's without): h += proj_bias + residual each call, so h drifts
  // by at most 1 + 2 (|bias| < 1, |residual| < 2) per call and stays finite.
  DeviceBuffer h = random_bf16(be, n, rng, -2.0f, 2.0f), res = random_bf16(be, n, rng, -2.0f, 2.0f);
  row(m, "add_layernorm_forward", 4 * n * e, seconds_per_call(be, [&] {
        be.add_layernorm_forward(V(h), V(out), V(mean), V(rstd), V(res), V(b), V(w), V(b), R, C,
                                 1e-5f);
      }, calls));
  row(m, "add_bias + add + layernorm_forward", 4 * n * e, seconds_per_call(be, [&] {
        be.add_bias(V(h), V(b), R, C);
        be.add(V(h), V(h), V(res));
        be.layernorm_forward(V(out), V(mean), V(rstd), V(h), V(w), V(b), R, C, 1e-5f);
      }, calls));
  row(m, "add_rmsnorm_forward", 4 * n * e, seconds_per_call(be, [&] {
        be.add_rmsnorm_forward(V(h), V(out), V(rstd), V(res), fsdp::TensorView{}, V(w), R, C,
                               1e-6f);
      }, calls));
  row(m, "add + rmsnorm_forward", 4 * n * e, seconds_per_call(be, [&] {
        be.add(V(h), V(h), V(res));
        be.rmsnorm_forward(V(out), V(rstd), V(h), V(w), R, C, 1e-6f);
      }, calls));

  // MLP: fc [R, 4C]. bias_gelu_forward adds the bias to fc in place each call; the values
  // drift but stay finite over the calls timed (|bias| < 1).
  DeviceBuffer fc = random_bf16(be, R * F, rng, -3.0f, 3.0f), g = random_bf16(be, R * F, rng, -1.0f, 1.0f);
  DeviceBuffer dfc = random_bf16(be, R * F, rng, -1.0f, 1.0f), fb = random_bf16(be, F, rng, -0.01f, 0.01f);
  DeviceBuffer dfb = random_bf16(be, F, rng, -1.0f, 1.0f);
  const Model mf{m.name, R, F};
  const double nf = static_cast<double>(R * F);
  row(mf, "bias_gelu_forward", 3 * nf * e, seconds_per_call(be, [&] {
        be.bias_gelu_forward(V(g), V(fc), V(fb), R, F);
      }, calls));
  row(mf, "add_bias + gelu_forward", 3 * nf * e, seconds_per_call(be, [&] {
        be.add_bias(V(fc), V(fb), R, F);
        be.gelu_forward(V(g), V(fc));
      }, calls));
  row(mf, "gelu_bias_backward", 3 * nf * e, seconds_per_call(be, [&] {
        be.gelu_bias_backward(V(dfc), V(dfb), V(fc), V(dfc), R, F);  // dfc aliases dout, as in gpt2.cpp
      }, calls));
  row(mf, "gelu_backward + bias_backward", 3 * nf * e, seconds_per_call(be, [&] {
        be.gelu_backward(V(dfc), V(fc), V(dfc));
        be.bias_backward(V(dfb), V(dfc), R, F);
      }, calls));
}

void gemm_row(const char* model, const char* op, int64_t M, int64_t N, int64_t K, double s) {
  std::printf("| %s | %s | %lld x %lld x %lld | %.1f | %.1f |\n", model, op,
              static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
              s * 1e6, 2.0 * M * N * K / s / 1e12);
}

// The epilogue GEMMs against the GEMM + kernel pairs they replace (kernels.hpp): GPT-2's
// c_attn (bias), c_fc (bias + GELU) and its backward (d GELU + bias gradient), a weight
// gradient with its bias gradient (mlp c_proj: [C, 4C] += dres^T gelu); T5's wi (ReLU).
void bench_epilogues(Backend& be, int calls) {
  std::mt19937 rng(2);
  const auto V = [](const DeviceBuffer& d) { return d.view(); };
  for (const Model& m : kModels) {
    const int64_t R = m.R, C = m.C, F = 4 * C;
    DeviceBuffer x = random_bf16(be, R * C, rng, -1.0f, 1.0f);
    DeviceBuffer w = random_bf16(be, F * C, rng, -0.05f, 0.05f);
    DeviceBuffer bias = random_bf16(be, F, rng, -0.1f, 0.1f);
    DeviceBuffer fc = random_bf16(be, R * F, rng, -2.0f, 2.0f);
    DeviceBuffer out = random_bf16(be, R * F, rng, -1.0f, 1.0f);
    DeviceBuffer db = random_bf16(be, F, rng, -1.0f, 1.0f);
    DeviceBuffer dres = random_bf16(be, R * C, rng, -1.0f, 1.0f);
    DeviceBuffer dw = random_bf16(be, C * F, rng, -1.0f, 1.0f);
    const char* n = m.name;
    if (m.C == 512) {  // t5-small: wi [d_ff = 2048, d_model = 512], ReLU
      gemm_row(n, "gemm_relu", R, F, C, seconds_per_call(be, [&] {
        be.gemm_relu(false, true, R, F, C, V(x), V(w), V(out));
      }, calls));
      gemm_row(n, "gemm + relu_forward", R, F, C, seconds_per_call(be, [&] {
        be.gemm(false, true, R, F, C, 1.f, V(x), V(w), 0.f, V(fc));
        be.relu_forward(V(out), V(fc));
      }, calls));
      continue;
    }
    gemm_row(n, "gemm_bias (c_fc shape)", R, F, C, seconds_per_call(be, [&] {
      be.gemm_bias(false, true, R, F, C, V(x), V(w), V(bias), V(out));
    }, calls));
    gemm_row(n, "gemm + add_bias", R, F, C, seconds_per_call(be, [&] {
      be.gemm(false, true, R, F, C, 1.f, V(x), V(w), 0.f, V(out));
      be.add_bias(V(out), V(bias), R, F);
    }, calls));
    gemm_row(n, "gemm_bias_gelu", R, F, C, seconds_per_call(be, [&] {
      be.gemm_bias_gelu(false, true, R, F, C, V(x), V(w), V(bias), V(fc), V(out));
    }, calls));
    gemm_row(n, "gemm + bias_gelu_forward", R, F, C, seconds_per_call(be, [&] {
      be.gemm(false, true, R, F, C, 1.f, V(x), V(w), 0.f, V(fc));
      be.bias_gelu_forward(V(out), V(fc), V(bias), R, F);
    }, calls));
    // d fc = (dres @ W_proj) * gelu'(fc), W_proj [C, 4C] (w read as it)
    gemm_row(n, "gemm_dgelu_bias_grad", R, F, C, seconds_per_call(be, [&] {
      be.gemm_dgelu_bias_grad(false, false, R, F, C, V(dres), V(w), V(fc), V(out), V(db));
    }, calls));
    gemm_row(n, "gemm + gelu_bias_backward", R, F, C, seconds_per_call(be, [&] {
      be.gemm(false, false, R, F, C, 1.f, V(dres), V(w), 0.f, V(out));
      be.gelu_bias_backward(V(out), V(db), V(fc), V(out), R, F);
    }, calls));
    // mlp c_proj's weight gradient [C, 4C] += dres^T [C, R] gelu [R, 4C], bias gradient [C]
    gemm_row(n, "gemm_weight_bias_grad", C, F, R, seconds_per_call(be, [&] {
      be.gemm_weight_bias_grad(false, C, F, R, V(dres), V(out), V(dw), V(db));
    }, calls));
    gemm_row(n, "gemm + bias_backward", C, F, R, seconds_per_call(be, [&] {
      be.gemm(true, false, C, F, R, 1.f, V(dres), V(out), 1.f, V(dw));
      be.bias_backward(V(db), V(dres), R, C);
    }, calls));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 50;
  if (calls < 1) {
    std::fprintf(stderr, "usage: %s [CALLS >= 1]\n", argv[0]);
    return 2;
  }
  try {
    auto be = fsdp::cuda::make_cuda_backend(0);
    std::printf("| model | op | R x C | us per call | MB moved | GB/s |\n");
    std::printf("|---|---|---:|---:|---:|---:|\n");
    for (const Model& m : kModels) bench(*be, m, calls);
    std::printf("\n| model | op | M x N x K | us per call | TFLOP/s |\n");
    std::printf("|---|---|---:|---:|---:|\n");
    bench_epilogues(*be, calls);
  } catch (const fsdp::Error& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
