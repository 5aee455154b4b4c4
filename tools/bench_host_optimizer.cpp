// tools/bench_host_optimizer.cpp: the host optimizer (CPU offload's AdamW / SGD step, the CPU
// backend's adamw_update / sgd_update) against the host's copy bandwidth, its physical limit
// (issue 31 item 3; docs/benchmarks.md "Host optimizer").
//
//   build/bench_host_optimizer [--elements N] [--threads T] [--reps R]
//
// First the copy bandwidth of the host on T threads: two arrays of 4N bytes, each thread
// copying its share, with glibc's memcpy (non-temporal stores at these sizes) and with a plain
// vectorised loop (its stores read each line first); GB/s count the bytes read plus the bytes
// written, and the better of the two is the limit. Then one shard of N fp32 elements:
//   adamw              p, g, m, v read, p, m, v written                  28 bytes / element
//   adamw+bf16 fused   ... and the bf16 copy of p written in the pass     30
//   adamw, then cast   the update, then a cast pass p -> bf16             34 (28 + 4 + 2)
//   adamw+fp16 fused                                                      30
//   sgd                p, g, buf read, p, buf written (momentum 0.9)      20
//   sgd+bf16 fused / sgd, then cast                                       22 / 26
// Then the whole host step of CPU offload per element (fsdp.offload_optimizer, one rank; the
// gradient norm, AdamW, the bf16 copy the upload reads), with the gradient's way in:
//   gradient landed           the device's copy wrote it (DMA): norm, adamw, cast        38
//   gradient zeroed + added   what the engine did before: zero 4, add an fp32 copy 12    54
//   16-bit gradient cast in   one micro-batch, bf16 staged: cast 6, then as landed       44
//   16-bit zeroed + added     before: zero 4, add the bf16 copy 10, then as landed       52
// and, where the clip scales the gradient (its norm above optim.grad_clip), the clip's way:
//   clipped, scale pass       before: scale_by 8 (read, write), then as landed           46
//   clipped, in the update    the coefficient is adamw's grad_scale, then as landed      38
//   clipped, in the update,   and the bf16 copy written by adamw's pass (what the        34
//     fused copy              engine does now: Optimizer::step_shard's compute_copy)
// Each row is the best of R timed calls after one warm-up (weight decay 0.1 on every element,
// steps >= 2); GB/s = bytes / time, and the % is of the copy bandwidth. The fused copies are
// checked to equal the separate cast bit for bit. Defaults: N = 64M (1.2 GiB of buffers),
// T = the CPUs this process may use, R = 5.
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/core/process.hpp"

namespace {

namespace po = boost::program_options;
using fsdp::DType;
using fsdp::TensorView;

// [lo, hi) of thread t of T over n elements, starting at multiples of 64 (whole lines).
void share(int64_t n, int t, int T, int64_t& lo, int64_t& hi) {
  const int64_t grains = (n + 63) / 64;
  lo = std::min(n, grains * t / T * 64);
  hi = std::min(n, grains * (t + 1) / T * 64);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{64} << 20;
  int threads = fsdp::usable_cpus(), reps = 5;
  float weight_decay = 0.1f;
  po::options_description opts("Options");
  opts.add_options()("help,h", "this help")(
      "elements", po::value<int64_t>(&n)->value_name("N"), "shard elements (default 64M = 67108864)")(
      "threads", po::value<int>(&threads)->value_name("T"),
      "threads (default: the CPUs this process may use)")(
      "reps", po::value<int>(&reps)->value_name("R"), "timed calls per row, after a warm-up (default 5)")(
      "weight-decay", po::value<float>(&weight_decay)->value_name("WD"),
      "weight decay rate, on every element (default 0.1)");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << "usage: bench_host_optimizer [options]\n" << opts;
      return 0;
    }
    if (n < 1 || threads < 1 || reps < 1) throw po::error("--elements, --threads and --reps must be >= 1");
  } catch (const po::error& e) {
    std::cerr << "bench_host_optimizer: " << e.what() << "\n";
    return 2;
  }

  auto be = fsdp::make_cpu_backend(threads);
  volatile float one_v = 1.0f;  // not a constant the compiler could fold away
  const float one = one_v;
  using fsdp::DeviceBuffer;
  using fsdp::MemCategory;
  const auto cat = MemCategory::other;
  DeviceBuffer p = DeviceBuffer::floats(*be, n, cat), g = DeviceBuffer::floats(*be, n, cat),
               m = DeviceBuffer::floats(*be, n, cat), v = DeviceBuffer::floats(*be, n, cat),
               copy(*be, DType::bf16, n, cat), ref(*be, DType::bf16, n, cat),
               staged = DeviceBuffer::floats(*be, n, cat), staged16(*be, DType::bf16, n, cat),
               norm = DeviceBuffer(*be, DType::f64, 1, cat);
  float *pp = p.view().f32(), *gp = g.view().f32(), *mp = m.view().f32(), *vp = v.view().f32();
  // First touch by the threads that use each share; values of a realistic scale.
#pragma omp parallel num_threads(threads)
  {
    int64_t lo, hi;
    share(n, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
    for (int64_t i = lo; i < hi; ++i) {
      const auto h = static_cast<float>((static_cast<uint64_t>(i) * 2654435761u) % 2001) / 1000.0f - 1.0f;
      pp[i] = 0.02f * h;
      gp[i] = 1e-3f * h;
      mp[i] = 1e-4f * h;
      vp[i] = 1e-6f * (h + 1.0f);
    }
    std::memset(static_cast<uint16_t*>(copy.view().data) + lo, 0, static_cast<std::size_t>(hi - lo) * 2);
    std::memset(static_cast<uint16_t*>(ref.view().data) + lo, 0, static_cast<std::size_t>(hi - lo) * 2);
    std::memcpy(staged.view().f32() + lo, gp + lo, static_cast<std::size_t>(hi - lo) * 4);
    std::memset(static_cast<uint16_t*>(staged16.view().data) + lo, 0, static_cast<std::size_t>(hi - lo) * 2);
  }
  be->cast(staged16.view(), staged.view());

  // Every row runs once per round, rounds interleaved (one warm-up round, then `reps`), and
  // each row keeps its best time: load from other processes hits the rows alike.
  struct Bench {
    std::string op;
    double bytes_per_elem;  // counted: read + written
    std::function<void(int)> run;
    double ms = 1e300;
  };
  std::vector<Bench> copies, rows;
  const TensorView P = p.view(), G = g.view(), M = m.view(), V = v.view(), C = copy.view(),
                   R = ref.view();
  const TensorView C16(C.data, DType::f16, {n}), R16(R.data, DType::f16, {n});

  // ---- the host's copy bandwidth: arrays of n fp32 (v's values are restored afterwards)
  copies.push_back({"memcpy", 8, [&](int) {
#pragma omp parallel num_threads(threads)
    {
      int64_t lo, hi;
      share(n, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
      if (hi > lo) std::memcpy(vp + lo, mp + lo, static_cast<std::size_t>(hi - lo) * sizeof(float));
    }
  }});
  copies.push_back({"copy loop", 8, [&](int) {
#pragma omp parallel num_threads(threads)
    {
      int64_t lo, hi;
      share(n, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) vp[i] = mp[i];
    }
  }});
  // In place (x = x * s: each line read, then written back; no line read only to be
  // overwritten), as the optimizer's in-place updates. s = 1 keeps the values.
  copies.push_back({"in place", 8, [&](int) {
#pragma omp parallel num_threads(threads)
    {
      int64_t lo, hi;
      share(n, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
      const float s = one;
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) vp[i] = vp[i] * s;
    }
  }});

  // ---- the optimizer rows
  const fsdp::WeightDecay wd(weight_decay);  // every element (the common case)
  auto adamw = [&](int r, const TensorView& c, const TensorView& grad_scale = {}) {
    be->adamw_update(P, G, M, V, 1e-4f, 0.9f, 0.95f, 1e-8f, wd, r + 2, c, grad_scale);
  };
  auto sgd = [&](int r, const TensorView& c) { be->sgd_update(P, G, M, 1e-4f, 0.9f, wd, r + 2, c); };
  rows.push_back({"adamw", 28, [&](int r) { adamw(r, {}); }});
  rows.push_back({"adamw + bf16 copy, fused", 30, [&](int r) { adamw(r, C); }});
  rows.push_back({"adamw, then cast to bf16", 34, [&](int r) {
                    adamw(r, {});
                    be->cast(R, P);
                  }});
  rows.push_back({"adamw + fp16 copy, fused", 30, [&](int r) { adamw(r, C16); }});
  rows.push_back({"adamw, then cast to fp16", 34, [&](int r) {
                    adamw(r, {});
                    be->cast(R16, P);
                  }});
  rows.push_back({"sgd (momentum)", 20, [&](int r) { sgd(r, {}); }});
  rows.push_back({"sgd + bf16 copy, fused", 22, [&](int r) { sgd(r, C); }});
  rows.push_back({"sgd, then cast to bf16", 26, [&](int r) {
                    sgd(r, {});
                    be->cast(R, P);
                  }});
  // The host step: the gradient's way in, then the norm, AdamW and the bf16 copy.
  const TensorView S = staged.view(), S16 = staged16.view(), N = norm.view();
  auto step = [&](int r, const TensorView& grad_scale = {}, bool fused = false) {
    be->fill_zero(N);
    be->squared_norm(N, G);
    adamw(r, fused ? R : TensorView{}, grad_scale);
    if (!fused) be->cast(R, P);
  };
  rows.push_back({"host step, gradient landed", 38, [&](int r) { step(r); }});
  rows.push_back({"host step, gradient zeroed + added", 54, [&](int r) {
                    be->fill_zero(G);
                    be->axpy(G, 1.f, S);
                    step(r);
                  }});
  rows.push_back({"host step, 16-bit gradient cast in", 44, [&](int r) {
                    be->cast(G, S16);
                    step(r);
                  }});
  rows.push_back({"host step, 16-bit zeroed + added", 52, [&](int r) {
                    be->fill_zero(G);
                    be->axpy(G, 1.f, S16);
                    step(r);
                  }});
  // Clipped: coefficients 0.5 and 2 in turn (exact, so the gradient's scale is kept).
  float coef_value = 0.5f;
  const TensorView K(&coef_value, DType::f32, {1});
  rows.push_back({"host step, clipped: scale pass, then the update", 46, [&](int r) {
                    coef_value = r % 2 == 0 ? 0.5f : 2.0f;
                    be->scale_by(G, K);  // (before the norm here: the same bytes)
                    step(r);
                  }});
  rows.push_back({"host step, clipped in the update (grad_scale)", 38, [&](int r) {
                    coef_value = r % 2 == 0 ? 0.5f : 2.0f;
                    step(r, K);
                  }});
  rows.push_back({"host step, clipped in the update, fused copy", 34, [&](int r) {
                    coef_value = r % 2 == 0 ? 0.5f : 2.0f;
                    step(r, K, true);
                  }});
  for (int round = 0; round <= reps; ++round) {
    for (Bench& b : copies) {
      const auto t0 = std::chrono::steady_clock::now();
      b.run(round);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) b.ms = std::min(b.ms, ms);
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) vp[i] = 1e-6f * (mp[i] * 1e4f + 1.0f);
    for (Bench& b : rows) {
      const auto t0 = std::chrono::steady_clock::now();
      b.run(round);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) b.ms = std::min(b.ms, ms);
    }
  }
  // The fused copies equal the cast of the same update, bit for bit.
  adamw(reps + 1, C);
  be->cast(R, P);
  const bool adamw_same = std::memcmp(C.data, R.data, C.bytes()) == 0;
  adamw(reps + 2, C16);
  be->cast(R16, P);
  const bool adamw16_same = std::memcmp(C.data, R.data, C.bytes()) == 0;
  sgd(reps + 1, C);
  be->cast(R, P);
  const bool sgd_same = std::memcmp(C.data, R.data, C.bytes()) == 0;
  auto gbs = [&](const Bench& b) { return b.bytes_per_elem * static_cast<double>(n) / b.ms / 1e6; };
  double copy_gbs = 0;
  for (const Bench& b : copies) copy_gbs = std::max(copy_gbs, gbs(b));

  std::printf("host copy bandwidth, %d threads, %.0f MiB arrays, best of %d (GB/s of the bytes read "
              "+ written): memcpy %.1f, copy loop %.1f, in place %.1f; the limit: %.1f GB/s\n",
              threads, 4.0 * static_cast<double>(n) / (1 << 20), reps, gbs(copies[0]), gbs(copies[1]),
              gbs(copies[2]), copy_gbs);
  std::printf("\n| op | elements | threads | ms | bytes / element | GB/s | %% of copy |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Bench& r : rows) {
    std::printf("| %s | %lld | %d | %.1f | %.0f | %.1f | %.0f %% |\n", r.op.c_str(),
                static_cast<long long>(n), threads, r.ms, r.bytes_per_elem, gbs(r), 100.0 * gbs(r) / copy_gbs);
  }
  std::printf("\nfused copy == separate cast, bit for bit: adamw bf16 %s, adamw fp16 %s, sgd bf16 %s\n",
              adamw_same ? "yes" : "NO", adamw16_same ? "yes" : "NO", sgd_same ? "yes" : "NO");
  return adamw_same && adamw16_same && sgd_same ? 0 : 1;
}
