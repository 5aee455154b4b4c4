// tools/bench_attention.cpp: time the CPU backend's causal attention kernels alone, at the
// shapes of `tools/bench_cpu.sh --scaling` (head size 32, 4096 tokens: B = 4096 / T).
//
//   build/bench_attention [THREADS [N_EMBD SEQ [DOC_LEN]]]   (default 2 threads, every shape)
//
// DOC_LEN > 0: document masking (data.attn_mask_type = "block_causal"): each row packs
// documents of DOC_LEN tokens (the last one shorter), passed as doc_start; the kernels skip
// the key tiles before a query tile's document, so short documents cost less than the causal
// mask (DOC_LEN >= SEQ: one document a row, the causal mask's work plus the mask's test).
//
// Per shape: milliseconds per call of attention_forward and attention_backward (the mean of
// 5 calls after one warm-up), wall clock and the calling thread's CPU time (with THREADS = 1
// that is all of the kernel's work, and it does not count time the thread was preempted by
// other processes: use it on a loaded machine), and the bytes forward saves for backward
// besides its output:
// the row logsumexp lse = [B, H, T] fp32 (FlashAttention-2; before issue 20 it was the
// probabilities P = [B, H, T, T] fp32 plus a backward scratch of the same size).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"

namespace {
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}
struct Ms {
  double wall, cpu;
};
template <typename F>
Ms ms_per_call(F&& f, int calls) {
  f();  // warm-up: first touch of the buffers
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_ms();
  for (int i = 0; i < calls; ++i) f();
  const double cpu = (thread_cpu_ms() - c0) / calls;
  return {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
              calls,
          cpu};
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t only_c = argc > 3 ? std::atoll(argv[2]) : 0, only_t = argc > 3 ? std::atoll(argv[3]) : 0;
  const int64_t doc_len = argc > 4 ? std::atoll(argv[4]) : 0;
  if (threads < 1 || argc == 3 || argc > 5 ||
      (argc > 3 && (only_c % 32 != 0 || only_c <= 0 || only_t <= 0)) || doc_len < 0) {
    std::fprintf(stderr,
                 "usage: %s [THREADS >= 1 [N_EMBD (a multiple of 32) SEQ [DOC_LEN >= 0]]]\n",
                 argv[0]);
    return 2;
  }
  auto be = fsdp::make_cpu_backend(threads);
  using fsdp::DType;
  using fsdp::TensorView;
  std::printf("| n_embd | seq | batch | heads | forward ms | backward ms | forward CPU ms | "
              "backward CPU ms | lse KiB per layer |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const std::vector<int64_t> widths = only_c ? std::vector<int64_t>{only_c} : std::vector<int64_t>{128, 256, 512, 768};
  const std::vector<int64_t> seqs = only_t ? std::vector<int64_t>{only_t} : std::vector<int64_t>{128, 512, 1024};
  for (int64_t C : widths) {
    for (int64_t T : seqs) {
      const int64_t B = std::max<int64_t>(1, 4096 / T), H = C / 32;
      std::vector<float> qkv(B * T * 3 * C), out(B * T * C), lse(B * H * T), dqkv(B * T * 3 * C),
          dout(B * T * C);
      for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
      for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
      const TensorView vq(qkv.data(), DType::f32, {B, T, 3 * C}), vo(out.data(), DType::f32, {B, T, C}),
          vl(lse.data(), DType::f32, {B, H, T}), vdq(dqkv.data(), DType::f32, {B, T, 3 * C}),
          vdo(dout.data(), DType::f32, {B, T, C});
      std::vector<int32_t> start(static_cast<std::size_t>(doc_len > 0 ? B * T : 0));
      for (std::size_t i = 0; i < start.size(); ++i) {
        const int64_t t = static_cast<int64_t>(i) % T;
        start[i] = static_cast<int32_t>(t / doc_len * doc_len);
      }
      const TensorView ds =
          doc_len > 0 ? TensorView(start.data(), DType::i32, {B * T}) : TensorView{};
      const Ms f = ms_per_call([&] { be->attention_forward(vo, vl, vq, B, T, C, H, ds); }, 5);
      const Ms b =
          ms_per_call([&] { be->attention_backward(vdq, vdo, vq, vo, vl, B, T, C, H, ds); }, 5);
      std::printf("| %lld | %lld | %lld | %lld | %.2f | %.2f | %.2f | %.2f | %.0f |\n",
                  static_cast<long long>(C), static_cast<long long>(T), static_cast<long long>(B),
                  static_cast<long long>(H), f.wall, b.wall, f.cpu, b.cpu,
                  static_cast<double>(B * H * T * 4) / 1024.0);
    }
  }
  return 0;
}
