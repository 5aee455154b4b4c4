// tools/bench_attention.cpp: time the CPU backend's causal attention kernels alone, at the
// shapes of `tools/bench_cpu.sh --scaling` (head size 32, 4096 tokens: B = 4096 / T).
//
//   build/bench_attention [THREADS]     (default 2)
//
// Per shape: milliseconds per call of attention_forward and attention_backward (the mean of
// 5 calls after one warm-up), and the bytes of the probabilities P = [B, H, T, T] fp32 that
// forward stores for backward (docs/benchmarks.md: what a blocked attention would save).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"

namespace {
template <typename F>
double ms_per_call(F&& f, int calls) {
  f();  // warm-up: first touch of the buffers
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         calls;
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (threads < 1) {
    std::fprintf(stderr, "usage: %s [THREADS >= 1]\n", argv[0]);
    return 2;
  }
  auto be = fsdp::make_cpu_backend(threads);
  using fsdp::DType;
  using fsdp::TensorView;
  std::printf("| n_embd | seq | batch | heads | forward ms | backward ms | P MiB per layer |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t C : {128, 256, 512, 768}) {
    for (int64_t T : {128, 512, 1024}) {
      const int64_t B = 4096 / T, H = C / 32;
      std::vector<float> qkv(B * T * 3 * C), out(B * T * C), att(B * H * T * T),
          scratch(B * H * T * T), dqkv(B * T * 3 * C), dout(B * T * C);
      for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
      for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
      const TensorView vq(qkv.data(), DType::f32, {B, T, 3 * C}), vo(out.data(), DType::f32, {B, T, C}),
          va(att.data(), DType::f32, {B, H, T, T}), vs(scratch.data(), DType::f32, {B, H, T, T}),
          vdq(dqkv.data(), DType::f32, {B, T, 3 * C}), vdo(dout.data(), DType::f32, {B, T, C});
      const double f = ms_per_call([&] { be->attention_forward(vo, va, vq, B, T, C, H); }, 5);
      const double b = ms_per_call([&] { be->attention_backward(vdq, vs, vdo, vq, va, B, T, C, H); }, 5);
      std::printf("| %lld | %lld | %lld | %lld | %.2f | %.2f | %.0f |\n", static_cast<long long>(C),
                  static_cast<long long>(T), static_cast<long long>(B), static_cast<long long>(H), f, b,
                  static_cast<double>(B * H * T * T * 4) / 1048576.0);
    }
  }
  return 0;
}
