// tests/test_cuda_kernels.cpp: every model kernel of the CUDA backend (fsdp/backend/
// kernels.hpp) against its CPU twin (make_cpu_backend(1), the numerical reference), plus what
// only the CUDA backend has: kernel scratch from the caching allocator, captured graphs,
// device-side index errors, bitwise repeatability of the reductions. Method and tolerances:
// tests/cuda_backend_pair.hpp. The DeviceRuntime half (memory, copies, casts, streams, the
// optimizers' and the engine's arithmetic) is tests/test_cuda_device_runtime.cpp's. Runs only
// where a CUDA device is visible (gpu_main.cpp exits 77, "not run", elsewhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_backend_pair.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

using namespace cuda_test;

// ---------------------------------------------------------------------------------------
// kernel scratch

TEST(CudaBackend, KernelScratchComesFromTheCache) {
  // Kernels with scratch (attention backward's D_i, reduction partials, 16-bit embedding
  // gradient, row losses): after a first call, repeating them allocates nothing new.
  std::mt19937 rng(7);
  const int64_t B = 2, T = 17, C = 24, H = 3, V = 29, R = B * T;
  Pair qkv = make(DType::bf16, uniform(B * T * 3 * C, rng));
  Pair out = make(DType::bf16, Vec(B * T * C)), dqkv = make(DType::bf16, Vec(B * T * 3 * C));
  Pair lse = make(DType::f32, Vec(B * H * T));
  Pair x = make(DType::bf16, uniform(R * C, rng)), w = make(DType::bf16, uniform(C, rng));
  Pair mean = make(DType::f32, Vec(R)), rstd = make(DType::f32, Vec(R));
  Pair dx = make(DType::bf16, Vec(R * C)), dw = make(DType::bf16, Vec(C)),
       db = make(DType::bf16, Vec(C));
  Pair wte = make(DType::bf16, Vec(V * C)), wpe = make(DType::bf16, Vec(T * C));
  std::vector<int32_t> tok(B * T);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % V);
  Pair tokens = make_i32(tok);
  Pair logits = make(DType::bf16, uniform(R * V, rng));
  Pair loss = make_f64({0.0});
  Backend& g = gpu();
  auto step = [&] {
    g.attention_forward(out.v(kGpu), lse.v(kGpu), qkv.v(kGpu), B, T, C, H, TensorView{});
    g.attention_backward(dqkv.v(kGpu), out.v(kGpu), qkv.v(kGpu), out.v(kGpu), lse.v(kGpu), B, T, C,
                         H, TensorView{});
    g.layernorm_forward(x.v(kGpu), mean.v(kGpu), rstd.v(kGpu), x.v(kGpu), w.v(kGpu), w.v(kGpu), R,
                        C, 1e-5f);
    g.layernorm_backward(dx.v(kGpu), dw.v(kGpu), db.v(kGpu), x.v(kGpu), x.v(kGpu), w.v(kGpu),
                         mean.v(kGpu), rstd.v(kGpu), R, C);
    g.bias_backward(db.v(kGpu), x.v(kGpu), R, C);
    g.gelu_bias_backward(dx.v(kGpu), db.v(kGpu), x.v(kGpu), dx.v(kGpu), R, C);
    g.rmsnorm_backward(dx.v(kGpu), dw.v(kGpu), x.v(kGpu), x.v(kGpu), w.v(kGpu), rstd.v(kGpu), R, C);
    g.embedding_backward(wte.v(kGpu), wpe.v(kGpu), x.v(kGpu), tokens.v(kGpu), B, T, C);
    g.cross_entropy_forward_backward(loss.v(kGpu), logits.v(kGpu), tokens.v(kGpu), R, V, V, 1.0f,
                                     0.f);
    g.squared_norm(loss.v(kGpu), x.v(kGpu));
    g.synchronize();
  };
  step();
  const int64_t raw = g.allocator_stats().raw_allocs;
  const std::size_t act = g.memory().current(MemCategory::activations);
  step();
  step();
  EXPECT_EQ(g.allocator_stats().raw_allocs, raw);
  EXPECT_EQ(g.memory().current(MemCategory::activations), act);  // scratch returned
}

// ---------------------------------------------------------------------------------------
// graphs (train.cuda_graphs)

TEST(CudaBackend, CapturedGraphReplaysTheEagerCallsBitForBit) {
  // Kernels with scratch (attention backward's D_i, norm and bias-gradient partials, the
  // DGELU_BGRAD sums, T5's dbias rows) and with cuBLASLt epilogues, captured once: the capture
  // runs nothing; each launch equals the eager calls on the inputs present at launch, bit for
  // bit, even after the caching allocator's blocks (where eager scratch lived) were handed
  // out and overwritten, since a graph's scratch is the graph arena's.
  const int64_t B = 2, T = 17, C = 24, H = 3, R = B * T, F = 4 * C, Dk = C / H;
  const DType t = DType::bf16;
  Backend& g = gpu();
  std::vector<Pair> bufs;
  auto add = [&](DType d, int64_t n) -> Pair& {
    bufs.push_back(make(d, Vec(static_cast<std::size_t>(n))));
    return bufs.back();
  };
  bufs.reserve(32);
  Pair& qkv = add(t, R * 3 * C);
  Pair& out = add(t, R * C);
  Pair& lse = add(DType::f32, B * H * T);
  Pair& dqkv = add(t, R * 3 * C);
  Pair& x = add(t, R * C);
  Pair& w = add(t, C);
  Pair& mean = add(DType::f32, R);
  Pair& rstd = add(DType::f32, R);
  Pair& dx = add(t, R * C);
  Pair& dw = add(t, C);
  Pair& db = add(t, C);
  Pair& W1 = add(t, F * C);
  Pair& fc = add(t, R * F);
  Pair& dfc = add(t, R * F);
  Pair& dfb = add(t, F);
  Pair& bias = add(DType::f32, H * relative_positions(T, T));
  Pair& dbias = add(DType::f32, H * relative_positions(T, T));
  Pair& mo = add(t, R * C);
  Pair& mlse = add(DType::f32, B * H * T);
  Pair& mdq = add(t, R * C);
  Pair& mdk = add(t, R * C);
  Pair& mdv = add(t, R * C);
  auto fill = [&](unsigned seed) {
    std::mt19937 rng(seed);
    for (Pair& p : bufs) {
      gpu().copy_from_host(p.v(kGpu), encode(p.t, uniform(static_cast<std::size_t>(p.n), rng,
                                                          -0.5f, 0.5f)).data());
    }
  };
  auto step = [&] {
    g.attention_forward(out.v(kGpu), lse.v(kGpu), qkv.v(kGpu), B, T, C, H, TensorView{});
    g.attention_backward(dqkv.v(kGpu), out.v(kGpu), qkv.v(kGpu), out.v(kGpu), lse.v(kGpu), B, T,
                         C, H, TensorView{});
    g.layernorm_forward(x.v(kGpu), mean.v(kGpu), rstd.v(kGpu), out.v(kGpu), w.v(kGpu), w.v(kGpu),
                        R, C, 1e-5f);
    g.layernorm_backward(dx.v(kGpu), dw.v(kGpu), db.v(kGpu), x.v(kGpu), out.v(kGpu), w.v(kGpu),
                         mean.v(kGpu), rstd.v(kGpu), R, C);
    g.bias_backward(db.v(kGpu), dx.v(kGpu), R, C);
    g.gemm_dgelu_bias_grad(false, true, R, F, C, dx.v(kGpu), W1.v(kGpu), fc.v(kGpu), dfc.v(kGpu),
                           dfb.v(kGpu));
    const TensorView q = x.v(kGpu), k = dx.v(kGpu), v = out.v(kGpu);
    g.mha_forward(mo.v(kGpu), mlse.v(kGpu), q, k, v, bias.v(kGpu), {}, B, T, T, H, Dk, 1.0f,
                  true);
    g.mha_backward(mdq.v(kGpu), mdk.v(kGpu), mdv.v(kGpu), dbias.v(kGpu), mo.v(kGpu), q, k, v,
                   mo.v(kGpu), mlse.v(kGpu), bias.v(kGpu), {}, B, T, T, H, Dk, 1.0f, true);
  };
  auto snapshot = [&] {
    g.synchronize();
    std::vector<Bytes> all;
    for (const Pair& p : bufs) all.push_back(read_bytes(g, p.v(kGpu)));
    return all;
  };
  fill(1);
  step();
  const std::vector<Bytes> eager1 = snapshot();
  fill(2);
  step();
  const std::vector<Bytes> eager2 = snapshot();

  fill(1);
  const std::vector<Bytes> before = snapshot();
  std::unique_ptr<KernelGraph> graph = g.capture_graph(step);
  EXPECT_TRUE(snapshot() == before) << "the capture ran kernels";
  // The blocks eager scratch came from, handed out and overwritten.
  std::vector<DeviceBuffer> held;
  for (int64_t n = 256; n <= (int64_t{1} << 20); n *= 2) {
    held.emplace_back(g, DType::f32, n / 4, MemCategory::other);
    g.copy_from_host(held.back().view(), Vec(static_cast<std::size_t>(n / 4), 7.f).data());
  }
  graph->launch();
  EXPECT_TRUE(snapshot() == eager1) << "launch after capture";
  fill(2);
  graph->launch();
  EXPECT_TRUE(snapshot() == eager2) << "launch on new inputs at the same addresses";
  fill(1);
  graph->launch();
  graph->launch();  // accumulating outputs accumulate twice: not eager1 any more
  EXPECT_FALSE(snapshot() == eager1);
  EXPECT_THROW(g.capture_graph([&] { g.capture_graph([] {}); }), Error);
  graph.reset();
  fill(1);
  step();
  EXPECT_TRUE(snapshot() == eager1) << "eager after a failed capture and a destroyed graph";
}

// ---------------------------------------------------------------------------------------
// GEMM

struct GemmCase {
  DType a, b, c;
};

void run_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
              GemmCase types, std::mt19937& rng, Tol tol, int64_t offset = 0) {
  SCOPED_TRACE("gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
               " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
               " beta=" + std::to_string(beta) + " types " + name(types.a) + "," + name(types.b) +
               "," + name(types.c) + " offset " + std::to_string(offset));
  Pair A = make(types.a, uniform(M * K + offset, rng)),
       B = make(types.b, uniform(K * N + offset, rng));
  Pair C = make(types.c, uniform(M * N + offset, rng));
  if (beta == 0.0f) {  // C's contents must be ignored: NaN on the GPU, zeros on the CPU
    gpu().copy_from_host(C.v(kGpu), encode(types.c, Vec(M * N + offset, std::nanf(""))).data());
    cpu().fill_zero(C.v(kCpu));
  }
  both([&](Backend& be, Side s) {
    be.gemm(ta, tb, M, N, K, alpha, A.v(s, offset, M * K), B.v(s, offset, K * N), beta,
            C.v(s, offset, M * N));
  });
  expect_close(read(cpu(), C.v(kCpu, offset, M * N)), read(gpu(), C.v(kGpu, offset, M * N)), tol,
               "C");
}

TEST(CudaBackend, GemmEveryTransposeAndType) {
  std::mt19937 rng(3);
  const GemmCase cases[] = {
      {DType::f32, DType::f32, DType::f32},   {DType::bf16, DType::bf16, DType::bf16},
      {DType::f16, DType::f16, DType::f16},   {DType::bf16, DType::bf16, DType::f32},
      {DType::f16, DType::f16, DType::f32},   {DType::f32, DType::f32, DType::bf16},
      {DType::bf16, DType::f16, DType::f32},  {DType::f32, DType::bf16, DType::bf16},
      {DType::bf16, DType::bf16, DType::f16},
  };
  for (const GemmCase& tc : cases) {
    // 16-bit C: one ulp of the output type; fp32 C with 16-bit inputs: fp32 accumulation
    // of the same products.
    const Tol tol = tc.c == DType::f32 ? kReduceF32 : tol_for(tc.c, kReduceF32);
    for (int t = 0; t < 4; ++t) {
      for (float beta : {0.0f, 0.5f, 1.0f}) {
        run_gemm(t & 1, t & 2, 37, 53, 29, 0.75f, beta, tc, rng, tol);
      }
    }
  }
}

TEST(CudaBackend, GemmShapesAndAlignment) {
  std::mt19937 rng(4);
  const int64_t shapes[][3] = {{1, 7, 5}, {64, 64, 64}, {128, 96, 257}, {256, 384, 768}, {3, 1, 1}};
  for (DType t : kFloatTypes) {
    const GemmCase tc{t, t, t};
    for (const auto& s : shapes) {
      for (int tr = 0; tr < 4; ++tr) {
        run_gemm(tr & 1, tr & 2, s[0], s[1], s[2], 1.0f, 1.0f, tc, rng, tol_for(t, kReduceF32));
      }
    }
    // Views that start one element into their buffers (2- or 4-byte aligned pointers).
    run_gemm(false, true, 45, 67, 33, 1.0f, 0.0f, tc, rng, tol_for(t, kReduceF32), 1);
    run_gemm(true, false, 45, 67, 33, 0.5f, 1.0f, tc, rng, tol_for(t, kReduceF32), 1);
  }
}

// gemm_relu, gemm_bias, gemm_bias_gelu, gemm_dgelu_bias_grad and gemm_weight_bias_grad
// (cuBLASLt's RELU, BIAS, GELU_AUX_BIAS, DGELU_BGRAD and BGRADB epilogues where cuBLASLt
// takes them) against the CPU twin (the unfused calls): every output within one rounding of
// the storage dtype; GELU's tolerance for fp32 is tight enough to tell the tanh
// approximation from erf's GELU (up to 4.7e-4 apart) and from the GELU epilogues' fast tanh
// (so fp32 takes the unfused kernels there). GPT-2's shapes (ln @ W^T)
// and a plain one; bias offsets 0 (16-byte aligned: the epilogue) and 1 (the fallback).
TEST(CudaBackend, GemmEpilogues) {
  std::mt19937 rng(41);
  const int64_t shapes[][3] = {{37, 64, 40}, {512, 3072, 64}, {256, 2304, 96}};
  for (DType t : kFloatTypes) {
    for (const auto& sh : shapes) {
      for (const bool tb : {true, false}) {
        for (const int64_t off : {int64_t{0}, int64_t{1}}) {
          const int64_t M = sh[0], N = sh[1], K = sh[2];
          SCOPED_TRACE(name(t) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                       " K=" + std::to_string(K) + " tb=" + std::to_string(tb) +
                       " bias offset " + std::to_string(off));
          // |fc| stays under ~2.2 (as in training): the epilogues' fast tanh (~2^-11
          // relative) grows up to ~10x in GELU's derivative at |fc| ~ 4, beyond a 16-bit
          // rounding.
          Pair A = make(t, uniform(M * K, rng, -0.25f, 0.25f)),
               B = make(t, uniform(K * N, rng, -0.25f, 0.25f)),
               bias = make(t, uniform(N + off, rng));
          Pair C = make(t, uniform(M * N, rng)), fc = make(t, uniform(M * N, rng)),
               out = make(t, uniform(M * N, rng));
          both([&](Backend& be, Side s) {
            be.gemm_bias(false, tb, M, N, K, A.v(s), B.v(s), bias.v(s, off, N), C.v(s));
            be.gemm_bias_gelu(false, tb, M, N, K, A.v(s), B.v(s), bias.v(s, off, N), fc.v(s),
                              out.v(s));
          });
          Pair relu = make(t, uniform(M * N, rng));
          both([&](Backend& be, Side s) {
            be.gemm_relu(false, tb, M, N, K, A.v(s), B.v(s), relu.v(s));
          });
          check(relu, tol_for(t, kReduceF32), "gemm_relu");
          check(C, tol_for(t, kReduceF32), "gemm_bias C");
          check(fc, tol_for(t, kReduceF32), "gemm_bias_gelu fc");
          check(out, tol_for(t, Tol{2e-4, 5e-5}), "gemm_bias_gelu out = GELU(fc)");
          // Backward: d fc = (dY W) gelu'(fc) with the c_fc bias gradient (DGELU_BGRAD),
          // then the weight gradient W += d fc^T X with its bias gradient (BGRADB); both
          // bias gradients accumulate into pre-filled values. fc as the CPU wrote it.
          fc.cpu_to_gpu();
          Pair dfc = make(t, uniform(M * N, rng)), db = make(t, uniform(N + off, rng));
          both([&](Backend& be, Side s) {
            be.gemm_dgelu_bias_grad(false, tb, M, N, K, A.v(s), B.v(s), fc.v(s), dfc.v(s),
                                    db.v(s, off, N));
          });
          check(dfc, tol_for(t, Tol{2e-4, 5e-5}), "gemm_dgelu_bias_grad dfc");
          check(db, tol_for(t, kReduceF32), "gemm_dgelu_bias_grad dbias (accumulates)");
          dfc.cpu_to_gpu();
          Pair dW = make(t, uniform(N * K, rng)), dbw = make(t, uniform(N + off, rng));
          both([&](Backend& be, Side s) {  // dW [N,K] += dfc^T [N,M] A [M,K]
            be.gemm_weight_bias_grad(false, N, K, M, dfc.v(s), A.v(s), dW.v(s),
                                     dbw.v(s, off, N));
          });
          check(dW, tol_for(t, kReduceF32), "gemm_weight_bias_grad C (accumulates)");
          check(dbw, tol_for(t, kReduceF32), "gemm_weight_bias_grad dbias (accumulates)");
        }
      }
    }
  }
}

TEST(CudaBackend, GemmDegenerateShapes) {
  std::mt19937 rng(5);
  Pair A = make(DType::f32, uniform(16, rng)), B = make(DType::f32, uniform(16, rng));
  Pair C = make(DType::f32, uniform(12, rng));
  // K = 0: C = beta C.
  both([&](Backend& be, Side s) {
    be.gemm(false, false, 3, 4, 0, 1.0f, A.v(s), B.v(s), 2.0f, C.v(s));
  });
  check(C, kExact, "K=0, beta=2");
  gpu().copy_from_host(C.v(kGpu), encode(DType::f32, Vec(12, std::nanf(""))).data());
  both([&](Backend& be, Side s) {
    be.gemm(false, false, 3, 4, 0, 1.0f, A.v(s), B.v(s), 0.0f, C.v(s));
  });
  check(C, kExact, "K=0, beta=0 over NaN");
  // M = 0: nothing happens.
  both([&](Backend& be, Side s) {
    be.gemm(false, false, 0, 4, 3, 1.0f, A.v(s), B.v(s), 0.0f, C.v(s));
  });
  check(C, kExact, "M=0");
}

// ---------------------------------------------------------------------------------------
// elementwise

TEST(CudaBackend, AddAndScale) {
  std::mt19937 rng(6);
  const int64_t n = 100003;  // odd: vector body + scalar tail
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name(t));
    const Tol tol = tol_for(t, kElemF32);
    Pair a = make(t, uniform(n, rng)), b = make(t, uniform(n, rng)), o = make(t, Vec(n));
    both([&](Backend& be, Side s) { be.add(o.v(s), a.v(s), b.v(s)); });
    check_sync(o, tol, "add");
    both([&](Backend& be, Side s) { be.add(a.v(s), a.v(s), b.v(s)); });  // out aliases a
    check_sync(a, tol, "add in place (a)");
    both([&](Backend& be, Side s) { be.add(b.v(s), a.v(s), b.v(s)); });  // out aliases b
    check_sync(b, tol, "add in place (b)");
    both(
        [&](Backend& be, Side s) { be.add(o.v(s, 1, n - 1), a.v(s, 0, n - 1), b.v(s, 1, n - 1)); });
    check_sync(o, tol, "add, unaligned");
    both([&](Backend& be, Side s) { be.scale(o.v(s), 1.7f); });
    check_sync(o, tol, "scale");
  }
  // Mixed storage types in add (run-time typed kernel).
  Pair a = make(DType::bf16, uniform(n, rng)), b = make(DType::f32, uniform(n, rng));
  Pair o = make(DType::f16, Vec(n));
  both([&](Backend& be, Side s) { be.add(o.v(s), a.v(s), b.v(s)); });
  check_sync(o, kF16, "add bf16 + fp32 -> fp16");
}

TEST(CudaBackend, Gelu) {
  std::mt19937 rng(8);
  Vec xv = uniform(4099, rng, -6.0f, 6.0f);
  xv[0] = -20.0f;
  xv[1] = 20.0f;
  xv[2] = 0.0f;
  xv[3] = -100.0f;
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name(t));
    const Tol tol = tol_for(t, kElemF32);
    Pair x = make(t, xv), y = make(t, Vec(xv.size())), d = make(t, uniform(xv.size(), rng));
    both([&](Backend& be, Side s) { be.gelu_forward(y.v(s), x.v(s)); });
    check(y, tol, "gelu_forward");
    both([&](Backend& be, Side s) { be.gelu_backward(y.v(s), x.v(s), d.v(s)); });
    check(y, tol, "gelu_backward");
    both([&](Backend& be, Side s) { be.gelu_backward(d.v(s), x.v(s), d.v(s)); });  // dx = dout
    check(d, tol, "gelu_backward in place");
  }
  Pair x = make(DType::f32, xv), y = make(DType::bf16, Vec(xv.size()));
  both([&](Backend& be, Side s) { be.gelu_forward(y.v(s), x.v(s)); });
  check(y, kBf16, "gelu_forward fp32 -> bf16");
}

TEST(CudaBackend, BiasAddAndBackward) {
  std::mt19937 rng(9);
  const int64_t shapes[][2] = {{1, 1}, {13, 77}, {1000, 96}, {4099, 40}, {64, 3072}};
  for (DType t : kFloatTypes) {
    for (const auto& sh : shapes) {
      const int64_t R = sh[0], C = sh[1];
      SCOPED_TRACE(name(t) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
      Pair out = make(t, uniform(R * C, rng)), bias = make(t, uniform(C, rng));
      both([&](Backend& be, Side s) { be.add_bias(out.v(s), bias.v(s), R, C); });
      check_sync(out, tol_for(t, kElemF32), "add_bias");
      both([&](Backend& be, Side s) { be.bias_backward(bias.v(s), out.v(s), R, C); });
      check(bias, tol_for(t, kReduceF32), "bias_backward (accumulates)");
    }
  }
  Pair out = make(DType::bf16, uniform(37 * 40, rng)), bias = make(DType::f32, uniform(40, rng));
  both([&](Backend& be, Side s) { be.add_bias(out.v(s), bias.v(s), 37, 40); });
  check_sync(out, kBf16, "add_bias bf16 += fp32");
  both([&](Backend& be, Side s) { be.bias_backward(bias.v(s), out.v(s), 37, 40); });
  check(bias, kReduceF32, "bias_backward fp32 += colsum(bf16)");
}

// ---------------------------------------------------------------------------------------
// embeddings

void run_embedding(DType t, int64_t B, int64_t T, int64_t C, int64_t V, int64_t Tmax,
                   std::mt19937& rng) {
  SCOPED_TRACE(name(t) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
               " C=" + std::to_string(C) + " V=" + std::to_string(V));
  std::vector<int32_t> tok(static_cast<std::size_t>(B * T));
  for (auto& x : tok) x = static_cast<int32_t>(rng() % 4 == 0 ? 1 : rng() % V);  // repeats
  Pair tokens = make_i32(tok);
  Pair wte = make(t, uniform(V * C, rng)), wpe = make(t, uniform(Tmax * C, rng));
  Pair out = make(t, Vec(B * T * C));
  both([&](Backend& be, Side s) {
    be.embedding_forward(out.v(s), tokens.v(s), wte.v(s), wpe.v(s), B, T, C);
  });
  check(out, tol_for(t, kExact), "embedding_forward");
  Pair dout = make(t, uniform(B * T * C, rng));
  both([&](Backend& be, Side s) {
    be.embedding_backward(wte.v(s), wpe.v(s), dout.v(s), tokens.v(s), B, T, C);
  });
  // fp32: the same additions in the same order (rows in turn) as the CPU backend.
  check(wte, tol_for(t, {1e-6, 1e-7}), "dwte (accumulates)");
  check(wpe, tol_for(t, {1e-6, 1e-7}), "dwpe (accumulates)");
}

TEST(CudaBackend, Embedding) {
  std::mt19937 rng(11);
  for (DType t : kFloatTypes) {
    run_embedding(t, 3, 7, 37, 11, 9, rng);
    run_embedding(t, 4, 64, 768, 300, 64, rng);
    run_embedding(t, 2, 50, 40, 5000, 64, rng);  // V > B*T: most rows untouched
    // B*T = 4400 tokens: dwte's lists span two full tiles of 2048 and a partial one, and
    // each of the 128 classes' rows repeat (V = 300, token 1 in a quarter of the rows; C = 72
    // leaves most of a block's threads without a column).
    run_embedding(t, 4, 1100, 72, 300, 1100, rng);
  }
  // Mixed: bf16 activations, fp32 tables.
  std::vector<int32_t> tok = {0, 3, 3, 1, 2, 3};
  Pair tokens = make_i32(tok);
  Pair wte = make(DType::f32, uniform(4 * 8, rng)), wpe = make(DType::f32, uniform(3 * 8, rng));
  Pair out = make(DType::bf16, Vec(6 * 8));
  both([&](Backend& be, Side s) {
    be.embedding_forward(out.v(s), tokens.v(s), wte.v(s), wpe.v(s), 2, 3, 8);
  });
  check_sync(out, kBf16, "embedding_forward mixed");
  both([&](Backend& be, Side s) {
    be.embedding_backward(wte.v(s), wpe.v(s), out.v(s), tokens.v(s), 2, 3, 8);
  });
  check(wte, {1e-6, 1e-7}, "dwte mixed");
}

TEST(CudaBackend, OutOfRangeIndicesThrowAtTheNextSynchronisation) {
  std::mt19937 rng(12);
  Pair tokens = make_i32({0, 1, 11, 2, -3});  // V = 11: the first bad one is reported
  Pair wte = make(DType::f32, uniform(11 * 8, rng)), wpe = make(DType::f32, uniform(5 * 8, rng));
  Pair out = make(DType::f32, Vec(5 * 8));
  Backend& g = gpu();
  try {
    g.embedding_forward(out.v(kGpu), tokens.v(kGpu), wte.v(kGpu), wpe.v(kGpu), 1, 5, 8);
    g.synchronize();
    ADD_FAILURE() << "no error for token 11 of 11";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding_forward: tokens holds 11 at position 2"),
              std::string::npos)
        << e.what();
  }
  g.synchronize();  // reported once, then cleared
  Pair logits = make(DType::f32, uniform(3 * 5, rng)), targets = make_i32({0, -1, 4});
  Pair loss = make_f64({0.0});
  EXPECT_THROW(
      {
        g.cross_entropy_forward(loss.v(kGpu), logits.v(kGpu), targets.v(kGpu), 3, 5, 5, 0.f);
        Bytes b(8);
        g.copy_to_host(b.data(), loss.v(kGpu));
      },
      Error);
  g.synchronize();
}

// ---------------------------------------------------------------------------------------
// LayerNorm

// Norm shapes: every row-kernel layout of kernels_layernorm.cu (threads per row x packs per
// thread, 16-byte or element accesses) and the generic kernels (C > 8192), with R not a
// multiple of the rows a block takes at a time or in all:
//   C = 1, 33, 77 (32 x 1, elements), 40 (32 x 1, packs), 500 (32 x 2, elements), 512 (32 x 2),
//   768 (32 x 3), 769 (64 x 2, elements), 1536 (64 x 3), 1600 (128 x 2), 2056 (128 x 3),
//   4096 (256 x 2), 4100 (256 x 3, elements), 8000 (256 x 4), 9000 (generic).
const int64_t kNormShapes[][2] = {{1, 1},    {37, 33},   {13, 77},   {300, 40},  {100, 500},
                                  {100, 512}, {64, 768},  {70, 769},  {40, 1536}, {9, 1600},
                                  {20, 2056}, {6, 4096},  {5, 4100},  {4, 8000},  {3, 9000}};

TEST(CudaBackend, LayerNorm) {
  std::mt19937 rng(13);
  const auto& shapes = kNormShapes;
  for (DType t : kFloatTypes) {
    for (const auto& sh : shapes) {
      const int64_t R = sh[0], C = sh[1];
      SCOPED_TRACE(name(t) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
      Vec xv = uniform(R * C, rng, -2.0f, 3.0f);
      Pair x = make(t, xv), w = make(t, uniform(C, rng, 0.5f, 1.5f)), b = make(t, uniform(C, rng));
      Pair out = make(t, Vec(R * C)), mean = make(DType::f32, Vec(R)),
           rstd = make(DType::f32, Vec(R));
      both([&](Backend& be, Side s) {
        be.layernorm_forward(out.v(s), mean.v(s), rstd.v(s), x.v(s), w.v(s), b.v(s), R, C, 1e-5f);
      });
      check(out, tol_for(t, {1e-5, 1e-5}), "out");
      check(mean, {1e-5, 1e-6}, "mean");
      check(rstd, {1e-5, 0.0}, "rstd");
      mean.cpu_to_gpu();  // backward on identical statistics
      rstd.cpu_to_gpu();
      Pair dout = make(t, uniform(R * C, rng)), dx = make(t, uniform(R * C, rng));
      Pair dw = make(t, uniform(C, rng)), db = make(t, uniform(C, rng));
      both([&](Backend& be, Side s) {
        be.layernorm_backward(dx.v(s), dw.v(s), db.v(s), dout.v(s), x.v(s), w.v(s), mean.v(s),
                              rstd.v(s), R, C);
      });
      check(dx, tol_for(t, kReduceF32), "dx (accumulates)");
      check(dw, tol_for(t, kReduceF32), "dweight (accumulates)");
      check(db, tol_for(t, kReduceF32), "dbias (accumulates)");
    }
  }
}

// ---------------------------------------------------------------------------------------
// attention

// Forward on both backends (out, and lse in fp32), then backward on both from the CPU's out and
// lse. Head size hs = C / H: 64 and 128 with 16-bit storage run the tensor-core kernels, the
// rest the SIMT ones. doc: a document mask's doc_start [B,T], or empty for none.
void run_attention(DType t, int64_t B, int64_t T, int64_t C, int64_t H, std::mt19937& rng,
                   DType out_t, const std::vector<int32_t>& doc = {}) {
  SCOPED_TRACE("qkv " + name(t) + " out " + name(out_t) + " B=" + std::to_string(B) + " T=" +
               std::to_string(T) + " C=" + std::to_string(C) + " H=" + std::to_string(H) +
               (doc.empty() ? "" : " doc_start"));
  const Tol tol = attn_tol(t == DType::f32 ? out_t : t);
  Pair qkv = make(t, uniform(B * T * 3 * C, rng, -2.0f, 2.0f));
  Pair out = make(out_t, uniform(B * T * C, rng));  // garbage: written
  Pair lse = make(DType::f32, uniform(B * H * T, rng));
  const Pair starts = make_i32(doc.empty() ? std::vector<int32_t>{0} : doc);
  const auto ds = [&](Side s) { return doc.empty() ? TensorView{} : starts.v(s); };
  both([&](Backend& be, Side s) {
    be.attention_forward(out.v(s), lse.v(s), qkv.v(s), B, T, C, H, ds(s));
  });
  check(out, tol, "out");
  check(lse, tol, "lse");
  // Backward from identical saved out and lse.
  out.cpu_to_gpu();
  lse.cpu_to_gpu();
  Pair dout = make(out_t, uniform(B * T * C, rng));
  Pair dqkv = make(t, uniform(B * T * 3 * C, rng));  // garbage: written
  both([&](Backend& be, Side s) {
    be.attention_backward(dqkv.v(s), dout.v(s), qkv.v(s), out.v(s), lse.v(s), B, T, C, H,
                          ds(s));
  });
  check(dqkv, tol, "dqkv");
}

TEST(CudaBackend, Attention) {
  std::mt19937 rng(14);
  for (DType t : kFloatTypes) {
    run_attention(t, 2, 13, 24, 3, rng, t);     // hs 8
    run_attention(t, 3, 33, 96, 2, rng, t);     // hs 48
    run_attention(t, 1, 1, 64, 1, rng, t);      // hs 64 (GPT-2 124M and 1.5B)
    run_attention(t, 2, 63, 128, 2, rng, t);
    run_attention(t, 1, 64, 256, 4, rng, t);
    run_attention(t, 2, 65, 128, 2, rng, t);
    run_attention(t, 2, 130, 256, 2, rng, t);   // hs 128
    run_attention(t, 1, 1024, 64, 1, rng, t);   // 16 key tiles
  }
  // Mixed storage types (fp32 fallback on the GPU).
  run_attention(DType::bf16, 2, 9, 16, 2, rng, DType::f32);
  // Rows not 16-byte aligned (views one element in): the SIMT kernels, also for head dims 64
  // and 128 with 16-bit storage (the tensor-core kernels need 16-byte-aligned rows).
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE("unaligned " + name(t));
    const int64_t B = 2, T = 70, C = 128, H = 2, n = B * T * 3 * C, no = B * T * C;
    Pair qkv = make(t, uniform(n + 1, rng, -2.0f, 2.0f)), out = make(t, Vec(no + 1));
    Pair lse = make(DType::f32, Vec(B * H * T));
    both([&](Backend& be, Side s) {
      be.attention_forward(out.v(s, 1, no), lse.v(s), qkv.v(s, 1, n), B, T, C, H, TensorView{});
    });
    check(out, attn_tol(t), "out");
    check(lse, attn_tol(t), "lse");
    out.cpu_to_gpu();
    lse.cpu_to_gpu();
    Pair dout = make(t, uniform(no + 1, rng)), dqkv = make(t, Vec(n + 1));
    both([&](Backend& be, Side s) {
      be.attention_backward(dqkv.v(s, 1, n), dout.v(s, 1, no), qkv.v(s, 1, n), out.v(s, 1, no),
                            lse.v(s), B, T, C, H, TensorView{});
    });
    check(dqkv, attn_tol(t), "dqkv");
  }
}

// ---------------------------------------------------------------------------------------
// cross-entropy

TEST(CudaBackend, CrossEntropy) {
  std::mt19937 rng(15);
  // {R, V, ld}: ld > V is a padded vocabulary (row stride ld, padding columns outside the
  // softmax, zero in dlogits), with large padding values that would dominate a softmax over
  // all ld columns.
  const int64_t shapes[][3] = {{1, 1, 1},        {5, 1001, 1001}, {64, 50257, 50257}, {300, 7, 7},
                               {5, 1001, 1024},  {64, 50257, 50304}, {3, 37, 128}};
  for (DType t : kFloatTypes) {
    for (const auto& sh : shapes) {
      const int64_t R = sh[0], V = sh[1], ld = sh[2];
      SCOPED_TRACE(name(t) + " R=" + std::to_string(R) + " V=" + std::to_string(V) +
                   " ld=" + std::to_string(ld));
      Vec lv = uniform(R * ld, rng, -4.0f, 4.0f);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = V; j < ld; ++j) lv[static_cast<std::size_t>(r * ld + j)] = 50.0f;
      lv[0] = 30.0f;  // a dominant logit
      std::vector<int32_t> tg(static_cast<std::size_t>(R));
      for (auto& x : tg) x = static_cast<int32_t>(rng() % V);
      Pair targets = make_i32(tg);
      Pair logits = make(t, lv), loss = make_f64({1.25});
      const Bytes before = read_bytes(gpu(), logits.v(kGpu));
      // Gemma 2's final_logit_softcapping on every other shape (the vector and scalar kernels).
      const float cap = (&sh - shapes) % 2 == 1 ? 3.0f : 0.f;
      both([&](Backend& be, Side s) {
        be.cross_entropy_forward(loss.v(s), logits.v(s), targets.v(s), R, V, ld, cap);
      });
      check_sync(loss, {1e-5, 0.0}, "loss (forward, accumulates)");
      expect_bytes(logits, before, "logits untouched by the forward");
      const float gs = 1.0f / static_cast<float>(R);
      both([&](Backend& be, Side s) {
        be.cross_entropy_forward_backward(loss.v(s), logits.v(s), targets.v(s), R, V, ld, gs, cap);
      });
      check(loss, {1e-5, 0.0}, "loss (forward_backward, accumulates)");
      check(logits, tol_for(t, {1e-5, 1e-7}), "dlogits");
      if (ld > V) {  // the padding columns are exactly 0 on the device
        const Bytes after = read_bytes(gpu(), logits.v(kGpu));
        const std::size_t es = dtype_size(t);
        for (int64_t r = 0; r < R; ++r)
          for (std::size_t b = static_cast<std::size_t>((r * ld + V)) * es;
               b < static_cast<std::size_t>((r + 1) * ld) * es; ++b)
            ASSERT_EQ(after[b], 0) << "padding byte " << b;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// determinism: reductions give the same bits on every run

TEST(CudaBackend, ReductionsAreBitwiseRepeatable) {
  std::mt19937 rng(17);
  const int64_t R = 1031, C = 200, B = 8, T = 128, V = 97;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(name(t));
    const Vec x0 = uniform(R * C, rng), w0 = uniform(C, rng);
    Pair x = make(t, x0), w = make(t, w0), mean = make(DType::f32, Vec(R)),
         rstd = make(DType::f32, Vec(R)), out = make(t, Vec(R * C));
    both([&](Backend& be, Side s) {
      be.layernorm_forward(out.v(s), mean.v(s), rstd.v(s), x.v(s), w.v(s), w.v(s), R, C, 1e-5f);
    });
    std::vector<int32_t> tg(static_cast<std::size_t>(B * T));
    for (auto& v : tg) v = static_cast<int32_t>(rng() % V);
    Pair tokens = make_i32(tg);
    const Vec d0 = uniform(B * T * C, rng);
    Bytes first[5];
    for (int run = 0; run < 2; ++run) {
      Pair dx = make(t, Vec(R * C)), dw = make(t, Vec(C)), db = make(t, Vec(C)),
           bb = make(t, Vec(C));
      Pair dwte = make(t, Vec(V * C)), dwpe = make(t, Vec(T * C)), d = make(t, d0);
      Backend& g = gpu();
      g.layernorm_backward(dx.v(kGpu), dw.v(kGpu), db.v(kGpu), x.v(kGpu), x.v(kGpu), w.v(kGpu),
                           mean.v(kGpu), rstd.v(kGpu), R, C);
      g.bias_backward(bb.v(kGpu), x.v(kGpu), R, C);
      g.embedding_backward(dwte.v(kGpu), dwpe.v(kGpu), d.v(kGpu), tokens.v(kGpu), B, T, C);
      const Pair* outs[5] = {&dx, &dw, &db, &bb, &dwte};
      for (int k = 0; k < 5; ++k) {
        if (run == 0) {
          first[k] = read_bytes(g, outs[k]->v(kGpu));
        } else {
          expect_bytes(*outs[k], first[k], "output " + std::to_string(k));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// argument checks: the CPU backend's rules, "cuda backend: KERNEL: ARG ..."

TEST(CudaBackend, WrongDtypesAndSizesThrow) {
  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 64, MemCategory::other),
      bf(g, DType::bf16, 64, MemCategory::other), i32(g, DType::i32, 64, MemCategory::other),
      f64(g, DType::f64, 4, MemCategory::other);
  const TensorView F = f32.view(), Hb = bf.view(), I = i32.view(), D = f64.view();
  expect_error([&] { g.gemm(false, false, 4, 4, 4, 1.0f, I, F, 0.0f, F); },
               "cuda backend: gemm: A is int32");
  expect_error([&] { g.gemm(false, false, 8, 9, 8, 1.0f, F, F, 0.0f, F); },
               "cuda backend: gemm: B is fp32 [64] but needs at least 72 elements");
  expect_error([&] { g.gemm(false, false, -1, 4, 4, 1.0f, F, F, 0.0f, F); },
               "cuda backend: gemm: M = -1");
  expect_error([&] { g.add(F, F, D); }, "cuda backend: add: b is fp64");
  expect_error([&] { g.layernorm_forward(F, Hb, F, F, F, F, 4, 4, 1e-5f); },
               "cuda backend: layernorm_forward: mean is bf16");
  expect_error([&] { g.embedding_forward(F, F, F, F, 2, 4, 8); },
               "cuda backend: embedding_forward: tokens is fp32");
  expect_error([&] { g.cross_entropy_forward(F, F, I, 4, 4, 4, 0.f); },
               "cuda backend: cross_entropy_forward: loss is fp32");
  expect_error([&] { g.attention_forward(F, F, F, 1, 2, 6, 4, TensorView{}); },
               "cuda backend: attention_forward: bad shape");
  expect_error([&] { g.attention_backward(F, F, F, F, Hb, 1, 2, 4, 2, TensorView{}); },
               "cuda backend: attention_backward: lse is bf16");
  expect_error([&] { g.bias_gelu_forward(F, I, F, 2, 4); },
               "cuda backend: bias_gelu_forward: fc is int32");
  expect_error([&] { g.gelu_bias_backward(F, F.slice(0, 7), F, F, 8, 8); },
               "cuda backend: gelu_bias_backward: dbias is fp32 [7]");
  g.synchronize();  // nothing was enqueued by the failed calls
}

// ---------------------------------------------------------------------------------------
// T5 pieces. Tolerances as above: lookups, ReLU and mul are exact (the same fp32 operation
// and rounding on both sides); RMSNorm and the bias gradients are reductions (kReduceF32;
// 16-bit storage as tol_for); mha as attention (attn_tol), its fp32 dbias with kReduceF32 for
// fp32 inputs and the 16-bit attention tolerance otherwise (the GPU sums dS rounded to the
// storage type, the CPU the fp32 dS).

TEST(CudaBackend, EmbeddingLookup) {
  std::mt19937 rng(21);
  for (DType t : kFloatTypes) {
    for (const auto& sh : {std::array<int64_t, 3>{7, 37, 11}, std::array<int64_t, 3>{300, 512, 97},
                           std::array<int64_t, 3>{50, 40, 5000}}) {
      const int64_t N = sh[0], C = sh[1], V = sh[2];
      SCOPED_TRACE(name(t) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                   " V=" + std::to_string(V));
      std::vector<int32_t> tok(static_cast<std::size_t>(N));
      for (auto& x : tok) x = static_cast<int32_t>(rng() % 3 == 0 ? 2 : rng() % V);  // repeats
      Pair tokens = make_i32(tok), table = make(t, uniform(V * C, rng)), out = make(t, Vec(N * C));
      both([&](Backend& be, Side s) {
        be.embedding_lookup_forward(out.v(s), tokens.v(s), table.v(s), N, C);
      });
      check(out, kExact, "embedding_lookup_forward");
      Pair dout = make(t, uniform(N * C, rng));
      both([&](Backend& be, Side s) {
        be.embedding_lookup_backward(table.v(s), dout.v(s), tokens.v(s), N, C);
      });
      check(table, tol_for(t, {1e-6, 1e-7}), "dtable (accumulates)");
    }
  }
}

TEST(CudaBackend, RmsNorm) {
  std::mt19937 rng(22);
  const auto& shapes = kNormShapes;
  for (DType t : kFloatTypes) {
    for (const auto& sh : shapes) {
      const int64_t R = sh[0], C = sh[1];
      SCOPED_TRACE(name(t) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
      Pair x = make(t, uniform(R * C, rng, -2.0f, 3.0f)), w = make(t, uniform(C, rng, 0.5f, 1.5f));
      Pair out = make(t, Vec(R * C)), rstd = make(DType::f32, Vec(R));
      both([&](Backend& be, Side s) {
        be.rmsnorm_forward(out.v(s), rstd.v(s), x.v(s), w.v(s), R, C, 1e-6f);
      });
      check(out, tol_for(t, {1e-5, 1e-5}), "out");
      check(rstd, {1e-5, 0.0}, "rstd");
      rstd.cpu_to_gpu();
      Pair dout = make(t, uniform(R * C, rng)), dx = make(t, uniform(R * C, rng)),
           dw = make(t, uniform(C, rng));
      both([&](Backend& be, Side s) {
        be.rmsnorm_backward(dx.v(s), dw.v(s), dout.v(s), x.v(s), w.v(s), rstd.v(s), R, C);
      });
      check(dx, tol_for(t, kReduceF32), "dx (accumulates)");
      check(dw, tol_for(t, kReduceF32), "dweight (accumulates)");
    }
  }
}

// Norms on views that are not 16-byte aligned (the element-wise path of the row kernels),
// with fp32 weight gradients beside 16-bit activations (row kernel + fp32 finish), and with
// mixed activation types (the generic kernels).
TEST(CudaBackend, NormsUnalignedAndMixedTypes) {
  std::mt19937 rng(28);
  const int64_t R = 45, C = 64;
  struct Case {
    DType act, x, grad;  // dx/dout/out/weight, x, dweight/dbias
    int64_t off;         // element offset of every [R, C] view
  };
  for (const Case& k : {Case{DType::bf16, DType::bf16, DType::bf16, 1},
                        Case{DType::f32, DType::f32, DType::f32, 3},
                        Case{DType::bf16, DType::bf16, DType::f32, 0},
                        Case{DType::f16, DType::f32, DType::f16, 0}}) {
    SCOPED_TRACE(name(k.act) + " x " + name(k.x) + " grads " + name(k.grad) + " offset " +
                 std::to_string(k.off));
    const Tol tol = tol_for(k.act, kReduceF32);
    const int64_t n = R * C + k.off;
    Pair x = make(k.x, uniform(n, rng, -2.0f, 3.0f)), w = make(k.act, uniform(C, rng, 0.5f, 1.5f));
    Pair b = make(k.act, uniform(C, rng)), out = make(k.act, Vec(n));
    Pair mean = make(DType::f32, Vec(R)), rstd = make(DType::f32, Vec(R));
    auto rc = [&](const Pair& p, Side s) { return p.v(s, k.off, R * C); };
    both([&](Backend& be, Side s) {
      be.layernorm_forward(rc(out, s), mean.v(s), rstd.v(s), rc(x, s), w.v(s), b.v(s), R, C, 1e-5f);
    });
    check(out, tol_for(k.act, {1e-5, 1e-5}), "layernorm out");
    check(rstd, {1e-5, 0.0}, "layernorm rstd");
    mean.cpu_to_gpu();
    rstd.cpu_to_gpu();
    Pair dout = make(k.act, uniform(n, rng)), dx = make(k.act, uniform(n, rng));
    Pair dw = make(k.grad, uniform(C, rng)), db = make(k.grad, uniform(C, rng));
    both([&](Backend& be, Side s) {
      be.layernorm_backward(rc(dx, s), dw.v(s), db.v(s), rc(dout, s), rc(x, s), w.v(s), mean.v(s),
                            rstd.v(s), R, C);
    });
    check_sync(dx, tol_for(k.act, kReduceF32), "layernorm dx");  // rmsnorm adds to it below
    check_sync(dw, tol, "layernorm dweight");
    check(db, tol, "layernorm dbias");
    both([&](Backend& be, Side s) {
      be.rmsnorm_forward(rc(out, s), rstd.v(s), rc(x, s), w.v(s), R, C, 1e-6f);
    });
    check(out, tol_for(k.act, {1e-5, 1e-5}), "rmsnorm out");
    rstd.cpu_to_gpu();
    both([&](Backend& be, Side s) {
      be.rmsnorm_backward(rc(dx, s), dw.v(s), rc(dout, s), rc(x, s), w.v(s), rstd.v(s), R, C);
    });
    check(dx, tol_for(k.act, kReduceF32), "rmsnorm dx");
    check(dw, tol, "rmsnorm dweight");
  }
}

// The residual add fused into the norm (add_bias_residual, add_layernorm_forward,
// add_rmsnorm_forward): one case, h0 (+ proj_bias) + residual, against the CPU backend and
// against the CUDA kernels they fuse (add_bias, add, then the norm) bit for bit.
struct ResidualCase {
  DType t;               // h, out, proj_bias, weight, bias
  DType res_t;           // residual
  int64_t R, C;
  bool with_bias;        // proj_bias given (else an empty view: no bias)
  int64_t off, res_off;  // element offsets of the [R, C] views of h and out, of residual
};

void check_residual_norms(const ResidualCase& k, std::mt19937& rng) {
  const int64_t R = k.R, C = k.C, n = R * C;
  SCOPED_TRACE(name(k.t) + " residual " + name(k.res_t) + " R=" + std::to_string(R) +
               " C=" + std::to_string(C) + (k.with_bias ? " proj_bias" : " no proj_bias") +
               " offsets " + std::to_string(k.off) + ", " + std::to_string(k.res_off));
  const Vec h0 = uniform(n + k.off, rng, -2.0f, 3.0f);
  Pair x = make(k.res_t, uniform(n + k.res_off, rng, -2.0f, 2.0f));
  Pair pb = make(k.t, uniform(C, rng)), w = make(k.t, uniform(C, rng, 0.5f, 1.5f));
  Pair b = make(k.t, uniform(C, rng));
  auto rc = [&](const Pair& p, Side s) { return p.v(s, k.off, n); };
  auto res = [&](Side s) { return x.v(s, k.res_off, n); };
  auto bias = [&](Side s) { return k.with_bias ? pb.v(s) : TensorView{}; };
  // The unfused calls on the GPU: h = h0 (+ proj_bias) + residual.
  auto unfused = [&](const Pair& h) {
    if (k.with_bias) gpu().add_bias(rc(h, kGpu), pb.v(kGpu), R, C);
    gpu().add(rc(h, kGpu), rc(h, kGpu), res(kGpu));
  };
  const Tol th = tol_for(k.t, kElemF32), tout = tol_for(k.t, {1e-5, 1e-5});
  auto same_bits = [](const Pair& fused, const Pair& ref, const std::string& what) {
    expect_bytes(fused, read_bytes(gpu(), ref.v(kGpu)), what + " vs the unfused calls");
  };

  Pair h = make(k.t, h0), hu = make(k.t, h0);
  both([&](Backend& be, Side s) { be.add_bias_residual(rc(h, s), bias(s), res(s), R, C); });
  check(h, th, "add_bias_residual");
  unfused(hu);
  same_bits(h, hu, "add_bias_residual");

  Pair hl = make(k.t, h0), out = make(k.t, Vec(n + k.off));
  Pair mean = make(DType::f32, Vec(R)), rstd = make(DType::f32, Vec(R));
  both([&](Backend& be, Side s) {
    be.add_layernorm_forward(rc(hl, s), rc(out, s), mean.v(s), rstd.v(s), res(s), bias(s),
                             w.v(s), b.v(s), R, C, 1e-5f);
  });
  check(hl, th, "add_layernorm_forward h");
  check(out, tout, "add_layernorm_forward out");
  check(mean, {1e-5, 1e-6}, "add_layernorm_forward mean");
  check(rstd, {1e-5, 0.0}, "add_layernorm_forward rstd");
  Pair hl2 = make(k.t, h0), out2 = make(k.t, Vec(n + k.off));
  Pair mean2 = make(DType::f32, Vec(R)), rstd2 = make(DType::f32, Vec(R));
  unfused(hl2);
  gpu().layernorm_forward(rc(out2, kGpu), mean2.v(kGpu), rstd2.v(kGpu), rc(hl2, kGpu), w.v(kGpu),
                          b.v(kGpu), R, C, 1e-5f);
  same_bits(hl, hl2, "add_layernorm_forward h");
  same_bits(out, out2, "add_layernorm_forward out");
  same_bits(mean, mean2, "add_layernorm_forward mean");
  same_bits(rstd, rstd2, "add_layernorm_forward rstd");

  Pair hr = make(k.t, h0), outr = make(k.t, Vec(n + k.off)), rstdr = make(DType::f32, Vec(R));
  both([&](Backend& be, Side s) {
    be.add_rmsnorm_forward(rc(hr, s), rc(outr, s), rstdr.v(s), res(s), bias(s), w.v(s), R, C,
                           1e-6f);
  });
  check(hr, th, "add_rmsnorm_forward h");
  check(outr, tout, "add_rmsnorm_forward out");
  check(rstdr, {1e-5, 0.0}, "add_rmsnorm_forward rstd");
  Pair hr2 = make(k.t, h0), outr2 = make(k.t, Vec(n + k.off)), rstdr2 = make(DType::f32, Vec(R));
  unfused(hr2);
  gpu().rmsnorm_forward(rc(outr2, kGpu), rstdr2.v(kGpu), rc(hr2, kGpu), w.v(kGpu), R, C, 1e-6f);
  same_bits(hr, hr2, "add_rmsnorm_forward h");
  same_bits(outr, outr2, "add_rmsnorm_forward out");
  same_bits(rstdr, rstdr2, "add_rmsnorm_forward rstd");
}

// Every norm shape (row kernels of every layout, element and pack accesses, the generic
// kernels past 8192) in every float type, with and without the projection bias; then C = 100
// (elements) and 8200 (generic), a mixed residual type (the unfused fallback), every [R, C]
// view off 16-byte alignment (the row kernel's element path), and the residual alone off it
// (the fallback that keeps the norm's packed column layout).
TEST(CudaBackend, ResidualNorms) {
  std::mt19937 rng(31);
  for (DType t : kFloatTypes) {
    for (const auto& sh : kNormShapes) {
      for (const bool with_bias : {true, false}) {
        check_residual_norms({t, t, sh[0], sh[1], with_bias, 0, 0}, rng);
      }
    }
  }
  for (const ResidualCase& k : {ResidualCase{DType::bf16, DType::bf16, 64, 100, true, 0, 0},
                                ResidualCase{DType::f16, DType::f16, 5, 8200, true, 0, 0},
                                ResidualCase{DType::bf16, DType::f32, 45, 64, true, 0, 0},
                                ResidualCase{DType::f32, DType::bf16, 45, 64, false, 0, 0},
                                ResidualCase{DType::bf16, DType::bf16, 45, 64, true, 1, 1},
                                ResidualCase{DType::f32, DType::f32, 45, 64, false, 3, 3},
                                ResidualCase{DType::bf16, DType::bf16, 45, 64, true, 0, 1},
                                ResidualCase{DType::f16, DType::f16, 64, 768, false, 0, 3}}) {
    check_residual_norms(k, rng);
  }
}

// GeGLU (T5 v1.1's gated-GELU) against the CPU backend, and against the CUDA chain it fuses
// bit for bit (forward: gelu_forward, mul; backward: mul, mul, gelu_backward), aligned and
// not, with dgate aliasing dout; then mixed storage types (the run-time-typed kernels).
TEST(CudaBackend, Geglu) {
  std::mt19937 rng(32);
  for (DType t : kFloatTypes) {
    for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{4096}, int64_t{100003}}) {
      for (const int64_t off : {int64_t{0}, int64_t{1}}) {
        SCOPED_TRACE(name(t) + " n=" + std::to_string(n) + " offset " + std::to_string(off));
        const int64_t m = n + off;
        const Vec d0 = uniform(m, rng, -2.0f, 2.0f);
        Pair gate = make(t, uniform(m, rng, -5.0f, 5.0f)), up = make(t, uniform(m, rng, -2.0f, 2.0f));
        auto v = [&](const Pair& p, Side s) { return p.v(s, off, n); };
        Pair out = make(t, Vec(m));
        both([&](Backend& be, Side s) { be.geglu_forward(v(out, s), v(gate, s), v(up, s)); });
        check(out, tol_for(t, kElemF32), "geglu_forward");
        Pair gl = make(t, Vec(m)), ref = make(t, Vec(m));
        gpu().gelu_forward(v(gl, kGpu), v(gate, kGpu));
        gpu().mul(v(ref, kGpu), v(gl, kGpu), v(up, kGpu));
        expect_bytes(out, read_bytes(gpu(), ref.v(kGpu)), "geglu_forward vs gelu_forward + mul");

        Pair dg = make(t, d0), du = make(t, Vec(m));  // dgate aliases dout
        both([&](Backend& be, Side s) {
          be.geglu_backward(v(dg, s), v(du, s), v(dg, s), v(gate, s), v(up, s));
        });
        check(dg, tol_for(t, kElemF32), "geglu_backward dgate");
        check(du, tol_for(t, kElemF32), "geglu_backward dup");
        Pair tt = make(t, d0), rdu = make(t, Vec(m));
        gpu().mul(v(rdu, kGpu), v(tt, kGpu), v(gl, kGpu));
        gpu().mul(v(tt, kGpu), v(tt, kGpu), v(up, kGpu));
        gpu().gelu_backward(v(tt, kGpu), v(gate, kGpu), v(tt, kGpu));
        expect_bytes(dg, read_bytes(gpu(), tt.v(kGpu)), "geglu_backward dgate vs the chain");
        expect_bytes(du, read_bytes(gpu(), rdu.v(kGpu)), "geglu_backward dup vs the chain");
      }
    }
  }
  const int64_t n = 777;
  Pair gate = make(DType::f32, uniform(n, rng, -4.0f, 4.0f)), up = make(DType::bf16, uniform(n, rng));
  Pair out = make(DType::bf16, Vec(n)), dout = make(DType::bf16, uniform(n, rng));
  Pair dg = make(DType::f32, Vec(n)), du = make(DType::bf16, Vec(n));
  both([&](Backend& be, Side s) { be.geglu_forward(out.v(s), gate.v(s), up.v(s)); });
  check(out, kBf16, "geglu_forward fp32 gate, bf16 up and out");
  both([&](Backend& be, Side s) {
    be.geglu_backward(dg.v(s), du.v(s), dout.v(s), gate.v(s), up.v(s));
  });
  check(dg, kBf16, "geglu_backward fp32 dgate from bf16 dout and up");
  check(du, kBf16, "geglu_backward bf16 dup");
}

// The fused bias + GELU of the GPT-2 MLP against the CPU backend, and against the CUDA
// kernels it fuses (the same bits: same fp32 operations, same roundings).
TEST(CudaBackend, BiasGelu) {
  std::mt19937 rng(29);
  const int64_t shapes[][2] = {{1, 1}, {13, 77}, {300, 40}, {64, 3072}, {37, 1600}, {5, 4100}};
  for (DType t : kFloatTypes) {
    for (const auto& sh : shapes) {
      const int64_t R = sh[0], C = sh[1];
      SCOPED_TRACE(name(t) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
      const Vec fc0 = uniform(R * C, rng, -6.0f, 6.0f);
      Pair fc = make(t, fc0), bias = make(t, uniform(C, rng)), out = make(t, Vec(R * C));
      both([&](Backend& be, Side s) { be.bias_gelu_forward(out.v(s), fc.v(s), bias.v(s), R, C); });
      check(fc, tol_for(t, kElemF32), "fc += bias");
      check(out, tol_for(t, kElemF32), "gelu");
      fc.cpu_to_gpu();
      Pair fc2 = make(t, fc0), out2 = make(t, Vec(R * C));  // the unfused CUDA kernels
      gpu().add_bias(fc2.v(kGpu), bias.v(kGpu), R, C);
      gpu().gelu_forward(out2.v(kGpu), fc2.v(kGpu));
      Pair fc3 = make(t, fc0);
      gpu().bias_gelu_forward(fc3.v(kGpu), fc3.v(kGpu), bias.v(kGpu), R, C);  // out aliases fc
      expect_bytes(out, read_bytes(gpu(), out2.v(kGpu)), "bias_gelu_forward vs add_bias + gelu");
      expect_bytes(fc3, read_bytes(gpu(), out2.v(kGpu)), "bias_gelu_forward in place");

      const Vec d0 = uniform(R * C, rng);
      Pair dout = make(t, d0), dfc = make(t, Vec(R * C)), db = make(t, uniform(C, rng));
      both([&](Backend& be, Side s) {
        be.gelu_bias_backward(dfc.v(s), db.v(s), fc.v(s), dout.v(s), R, C);
      });
      check(dfc, tol_for(t, kElemF32), "dfc");
      check(db, tol_for(t, kReduceF32), "dbias (accumulates)");
      Pair dd = make(t, d0), db2 = make(t, Vec(C));  // dfc aliasing dout, dbias from 0
      both([&](Backend& be, Side s) {
        be.gelu_bias_backward(dd.v(s), db2.v(s), fc.v(s), dd.v(s), R, C);
      });
      check(dd, tol_for(t, kElemF32), "dfc aliasing dout");
      check(db2, tol_for(t, kReduceF32), "dbias, dfc aliasing dout");
      Pair dfc4 = make(t, Vec(R * C));
      gpu().gelu_backward(dfc4.v(kGpu), fc.v(kGpu), dout.v(kGpu));
      expect_bytes(dfc, read_bytes(gpu(), dfc4.v(kGpu)), "gelu_bias_backward vs gelu_backward");
    }
  }
  // Mixed storage types (the unfused kernels) and unaligned views (element-wise paths).
  const int64_t R = 33, C = 48;
  Pair fc = make(DType::f32, uniform(R * C, rng, -4.0f, 4.0f)), bias = make(DType::f32, uniform(C, rng));
  Pair out = make(DType::bf16, Vec(R * C));
  both([&](Backend& be, Side s) { be.bias_gelu_forward(out.v(s), fc.v(s), bias.v(s), R, C); });
  check(out, kBf16, "gelu fp32 -> bf16");
  check_sync(fc, kElemF32, "fc fp32");
  Pair dout = make(DType::bf16, uniform(R * C, rng)), dfc = make(DType::f32, Vec(R * C));
  Pair db = make(DType::f32, uniform(C, rng));
  both([&](Backend& be, Side s) {
    be.gelu_bias_backward(dfc.v(s), db.v(s), fc.v(s), dout.v(s), R, C);
  });
  check(dfc, kElemF32, "dfc fp32 from bf16 dout");
  check(db, kReduceF32, "dbias fp32 from bf16 dout");
  Pair fb = make(DType::bf16, uniform(R * C + 1, rng, -4.0f, 4.0f)), bb = make(DType::bf16, uniform(C, rng));
  Pair ob = make(DType::bf16, Vec(R * C + 1)), gb = make(DType::bf16, uniform(R * C + 1, rng));
  Pair dbb = make(DType::f32, uniform(C, rng));  // fp32 bias gradient of bf16 activations
  both([&](Backend& be, Side s) {
    be.bias_gelu_forward(ob.v(s, 1, R * C), fb.v(s, 1, R * C), bb.v(s), R, C);
  });
  check(ob, kBf16, "gelu, unaligned");
  check_sync(fb, kBf16, "fc, unaligned");
  both([&](Backend& be, Side s) {
    be.gelu_bias_backward(gb.v(s, 1, R * C), dbb.v(s), fb.v(s, 1, R * C), gb.v(s, 1, R * C), R, C);
  });
  check(gb, kBf16, "dfc, unaligned");
  check(dbb, kReduceF32, "dbias fp32, unaligned bf16 dfc");
}

// Norm backward, bias backward and the fused GELU + bias backward give the same bits on
// every run, in each layout (warp rows, 128-thread rows, generic).
TEST(CudaBackend, NormAndBiasGeluReductionsAreBitwiseRepeatable) {
  std::mt19937 rng(30);
  for (const auto& sh : {std::array<int64_t, 2>{1031, 200}, std::array<int64_t, 2>{517, 1600},
                         std::array<int64_t, 2>{70, 9000}}) {
    const int64_t R = sh[0], C = sh[1];
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(name(t) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
      const Vec x0 = uniform(R * C, rng), w0 = uniform(C, rng), d0 = uniform(R * C, rng);
      Pair x = make(t, x0), w = make(t, w0), mean = make(DType::f32, Vec(R)),
           rstd = make(DType::f32, Vec(R)), rrms = make(DType::f32, Vec(R)), out = make(t, Vec(R * C));
      Backend& g = gpu();
      g.layernorm_forward(out.v(kGpu), mean.v(kGpu), rstd.v(kGpu), x.v(kGpu), w.v(kGpu), w.v(kGpu),
                          R, C, 1e-5f);
      g.rmsnorm_forward(out.v(kGpu), rrms.v(kGpu), x.v(kGpu), w.v(kGpu), R, C, 1e-6f);
      Bytes first[7];
      for (int run = 0; run < 2; ++run) {
        Pair dx = make(t, Vec(R * C)), dw = make(t, Vec(C)), db = make(t, Vec(C)),
             rdx = make(t, Vec(R * C)), rdw = make(t, Vec(C)), gdfc = make(t, d0),
             gdb = make(t, Vec(C));
        const Pair d = make(t, d0);
        g.layernorm_backward(dx.v(kGpu), dw.v(kGpu), db.v(kGpu), d.v(kGpu), x.v(kGpu), w.v(kGpu),
                             mean.v(kGpu), rstd.v(kGpu), R, C);
        g.rmsnorm_backward(rdx.v(kGpu), rdw.v(kGpu), d.v(kGpu), x.v(kGpu), w.v(kGpu), rrms.v(kGpu),
                           R, C);
        g.gelu_bias_backward(gdfc.v(kGpu), gdb.v(kGpu), x.v(kGpu), gdfc.v(kGpu), R, C);
        const Pair* outs[7] = {&dx, &dw, &db, &rdx, &rdw, &gdfc, &gdb};
        for (int k = 0; k < 7; ++k) {
          if (run == 0) {
            first[k] = read_bytes(g, outs[k]->v(kGpu));
          } else {
            expect_bytes(*outs[k], first[k], "output " + std::to_string(k));
          }
        }
      }
    }
  }
}

TEST(CudaBackend, ReluAndMul) {
  std::mt19937 rng(23);
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}, int64_t{100003}}) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      Vec xv = uniform(n, rng, -2.0f, 2.0f);
      xv[0] = 0.0f;
      Pair x = make(t, xv), y = make(t, uniform(n, rng)), o = make(t, Vec(n)), d = make(t, Vec(n));
      both([&](Backend& be, Side s) {
        be.relu_forward(o.v(s), x.v(s));
        be.relu_backward(d.v(s), x.v(s), y.v(s));
      });
      check(o, kExact, "relu_forward");
      check(d, kExact, "relu_backward");
      both([&](Backend& be, Side s) { be.relu_backward(y.v(s), x.v(s), y.v(s)); });  // in place
      check(y, kExact, "relu_backward in place");
      both([&](Backend& be, Side s) {
        be.mul(o.v(s), x.v(s), d.v(s));
        be.mul(x.v(s), x.v(s), x.v(s));  // out aliases a and b
      });
      check(o, kExact, "mul");
      check(x, kExact, "mul in place");
    }
  }
  Pair a = make(DType::bf16, uniform(77, rng)), b = make(DType::f32, uniform(77, rng)),
       o = make(DType::f16, Vec(77));
  both([&](Backend& be, Side s) { be.mul(o.v(s), a.v(s), b.v(s)); });
  check(o, kExact, "mul mixed bf16 * fp32 -> fp16");
}

TEST(CudaBackend, PositionBias) {
  std::mt19937 rng(24);
  for (DType t : kFloatTypes) {
    for (const auto& sh : {std::array<int64_t, 4>{32, 8, 13, 17}, std::array<int64_t, 4>{32, 6, 128, 128},
                           std::array<int64_t, 4>{5, 1, 1, 3}}) {
      const int64_t NB = sh[0], H = sh[1], Tq = sh[2], Tk = sh[3];
      SCOPED_TRACE(name(t) + " NB=" + std::to_string(NB) + " H=" + std::to_string(H) +
                   " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk));
      const int64_t P = relative_positions(Tq, Tk);  // bias by relative position j - i
      std::vector<int32_t> bk(static_cast<std::size_t>(P));
      for (int64_t o = 0; o < P; ++o) bk[o] = static_cast<int32_t>((o * 7 + 3) % NB);
      Pair buckets = make_i32(bk), table = make(t, uniform(NB * H, rng)),
           bias = make(DType::f32, Vec(H * P));
      both([&](Backend& be, Side s) {
        be.position_bias_forward(bias.v(s), table.v(s), buckets.v(s), H, Tq, Tk);
      });
      check(bias, kExact, "position_bias_forward");
      Pair dbias = make(DType::f32, uniform(H * P, rng));
      both([&](Backend& be, Side s) {
        be.position_bias_backward(table.v(s), dbias.v(s), buckets.v(s), H, Tq, Tk);
      });
      check(table, tol_for(t, kReduceF32), "dtable (accumulates)");
    }
  }
}

// As run_attention for mha: forward on both (out, lse), backward on both from the CPU's out
// and lse, with dbias pre-filled (it accumulates). mask_kind: 0 none, 1 batch b pads its
// last b keys, 2 also the last batch row pads every key.
void run_mha(DType t, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, bool causal,
             bool with_bias, int mask_kind, float scale, std::mt19937& rng, DType out_t) {
  SCOPED_TRACE("q " + name(t) + " out " + name(out_t) + " B=" + std::to_string(B) +
               " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) + " H=" +
               std::to_string(H) + " D=" + std::to_string(D) + " causal=" + std::to_string(causal) +
               " bias=" + std::to_string(with_bias) + " mask=" + std::to_string(mask_kind));
  const Tol tol = attn_tol(t == DType::f32 ? out_t : t);
  const int64_t HD = H * D, nq = B * Tq * HD, nk = B * Tk * HD, nl = B * H * Tq;
  Pair q = make(t, uniform(nq, rng, -1.5f, 1.5f)), k = make(t, uniform(nk, rng, -1.5f, 1.5f)),
       v = make(t, uniform(nk, rng));
  const int64_t P = relative_positions(Tq, Tk);  // bias and dbias by relative position
  Pair bias = make(DType::f32, uniform(with_bias ? H * P : 0, rng, -2.0f, 2.0f));
  std::vector<int32_t> mk;
  if (mask_kind > 0) {
    mk.assign(static_cast<std::size_t>(B * Tk), 1);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pad = (mask_kind == 2 && b == B - 1) ? Tk : std::min(b, Tk);
      for (int64_t j = Tk - pad; j < Tk; ++j) mk[b * Tk + j] = 0;
    }
  }
  Pair mask = make_i32(mk);
  const auto bias_v = [&](Side s) { return with_bias ? bias.v(s) : TensorView{}; };
  const auto mask_v = [&](Side s) { return mask_kind ? mask.v(s) : TensorView{}; };
  Pair out = make(out_t, uniform(nq, rng)), lse = make(DType::f32, uniform(nl, rng));  // written
  both([&](Backend& be, Side s) {
    be.mha_forward(out.v(s), lse.v(s), q.v(s), k.v(s), v.v(s), bias_v(s), mask_v(s), B, Tq, Tk, H,
                   D, scale, causal);
  });
  check(out, tol, "out");
  check(lse, tol, "lse");  // +inf for rows without keys: equal infinities pass, others fail
  out.cpu_to_gpu();  // backward from identical out and lse
  lse.cpu_to_gpu();
  Pair dout = make(out_t, uniform(nq, rng));
  Pair dq = make(t, uniform(nq, rng)), dk = make(t, uniform(nk, rng)), dv = make(t, uniform(nk, rng));
  Pair dbias = make(DType::f32, uniform(with_bias ? H * P : 0, rng));
  both([&](Backend& be, Side s) {
    be.mha_backward(dq.v(s), dk.v(s), dv.v(s), with_bias ? dbias.v(s) : TensorView{}, dout.v(s),
                    q.v(s), k.v(s), v.v(s), out.v(s), lse.v(s), bias_v(s), mask_v(s), B, Tq, Tk, H,
                    D, scale, causal);
  });
  check(dq, tol, "dq");
  check(dk, tol, "dk");
  check(dv, tol, "dv");
  if (with_bias) check(dbias, t == DType::f32 && out_t == DType::f32 ? kReduceF32 : tol, "dbias");
  // padded keys get exactly zero dk, dv on the GPU
  const std::vector<double> gk = read(gpu(), dk.v(kGpu)), gv = read(gpu(), dv.v(kGpu));
  int64_t nonzero = 0;
  for (int64_t b = 0; b < (mask_kind ? B : 0); ++b) {
    for (int64_t j = 0; j < Tk; ++j) {
      if (mk[b * Tk + j] != 0) continue;
      for (int64_t e = 0; e < HD; ++e) nonzero += gk[(b * Tk + j) * HD + e] != 0.0 || gv[(b * Tk + j) * HD + e] != 0.0;
    }
  }
  EXPECT_EQ(nonzero, 0) << "gradients of padded keys";
}

TEST(CudaBackend, Mha) {
  std::mt19937 rng(25);
  for (DType t : kFloatTypes) {
    run_mha(t, 2, 13, 17, 3, 8, false, true, 1, 1.0f, rng, t);   // cross-attention shape
    run_mha(t, 2, 64, 64, 4, 32, true, true, 0, 1.0f, rng, t);   // T5 decoder self-attention
    run_mha(t, 3, 33, 33, 2, 5, false, true, 2, 1.0f, rng, t);   // a fully padded batch
    run_mha(t, 2, 9, 4, 2, 16, true, false, 1, 0.25f, rng, t);   // causal, Tq > Tk, scaled
    run_mha(t, 1, 1, 1, 1, 4, false, false, 0, 1.0f, rng, t);
    // d_kv 64 (t5-small) and 128: the tensor-core kernels for 16-bit storage
    for (int64_t T : {1, 63, 64, 65}) {
      run_mha(t, 2, T, T, 2, 64, true, true, 0, 1.0f, rng, t);   // decoder self-attention
      run_mha(t, 3, T, T, 2, 64, false, true, 2, 1.0f, rng, t);  // encoder, padded
    }
    run_mha(t, 3, 65, 130, 2, 64, false, false, 1, 1.0f, rng, t);  // cross-attention Tq != Tk
    run_mha(t, 2, 100, 63, 2, 128, false, true, 1, 0.5f, rng, t);
    run_mha(t, 2, 70, 65, 2, 64, true, true, 1, 0.7f, rng, t);     // causal Tq != Tk
    run_mha(t, 1, 1024, 1024, 1, 64, true, true, 0, 1.0f, rng, t);
    // T5's encoder / decoder at a small batch: several query tiles and a partial last key
    // tile, every (b, h, query tile) summing its dbias share (issue 32 item 3)
    run_mha(t, 4, 200, 200, 3, 64, false, true, 1, 1.0f, rng, t);
    run_mha(t, 4, 104, 104, 3, 64, true, true, 0, 1.0f, rng, t);
    run_mha(t, 2, 1024, 1024, 1, 64, false, true, 2, 1.0f, rng, t);
    // no queries (every dk, dv 0), no keys (out 0, dq 0), causal keys past the last query
    // (their dk, dv 0): the loops over tiles run zero times
    for (int64_t D : {16, 64}) {
      run_mha(t, 2, 0, 70, 2, D, false, false, 0, 1.0f, rng, t);
      run_mha(t, 2, 40, 0, 2, D, false, false, 0, 1.0f, rng, t);
      run_mha(t, 2, 9, 140, 2, D, true, false, 0, 1.0f, rng, t);
    }
  }
  run_mha(DType::f32, 2, 130, 129, 2, 64, false, true, 1, 1.0f, rng, DType::f32);
  // Mixed storage types (fp32 fallback on the GPU).
  run_mha(DType::bf16, 2, 9, 11, 2, 8, true, true, 1, 1.0f, rng, DType::f32);
}

TEST(CudaBackend, CrossEntropyIgnoreIndex) {
  std::mt19937 rng(26);
  // ld 1001: the scalar kernel; ld 1008 (padded, 16-byte rows): the vectorised one.
  for (const int64_t ld : {int64_t{1001}, int64_t{1008}}) {
    for (DType t : kFloatTypes) {
      const int64_t R = 37, V = 1001;
      SCOPED_TRACE(name(t) + " ld " + std::to_string(ld));
      std::vector<int32_t> tg(static_cast<std::size_t>(R));
      for (int64_t r = 0; r < R; ++r) tg[r] = r % 3 == 1 ? kIgnoreIndex : static_cast<int32_t>(rng() % V);
      Pair targets = make_i32(tg), logits = make(t, uniform(R * ld, rng, -4.0f, 4.0f)),
           loss = make_f64({0.5});
      both([&](Backend& be, Side s) {
        be.cross_entropy_forward(loss.v(s), logits.v(s), targets.v(s), R, V, ld, 0.f);
      });
      check_sync(loss, {1e-5, 0.0}, "loss (forward)");
      both([&](Backend& be, Side s) {
        be.cross_entropy_forward_backward(loss.v(s), logits.v(s), targets.v(s), R, V, ld, 0.1f,
                                          0.f);
      });
      check(loss, {1e-5, 0.0}, "loss (forward_backward)");
      check(logits, tol_for(t, {1e-5, 1e-7}), "dlogits");
      const std::vector<double> g = read(gpu(), logits.v(kGpu));
      int64_t nonzero = 0;
      for (int64_t r = 1; r < R; r += 3) {
        for (int64_t j = 0; j < ld; ++j) nonzero += g[r * ld + j] != 0.0;
      }
      EXPECT_EQ(nonzero, 0) << "ignored rows of the gradient";
    }
  }
  // a negative target other than kIgnoreIndex is still an error
  Pair logits = make(DType::f32, uniform(2 * 5, rng)), targets = make_i32({kIgnoreIndex, -1}),
       loss = make_f64({0.0});
  Backend& g = gpu();
  EXPECT_THROW(
      {
        g.cross_entropy_forward(loss.v(kGpu), logits.v(kGpu), targets.v(kGpu), 2, 5, 5, 0.f);
        g.synchronize();
      },
      Error);
  g.synchronize();
}

TEST(CudaBackend, T5ReductionsAreBitwiseRepeatable) {
  std::mt19937 rng(27);
  const int64_t N = 1000, C = 96, V = 61, NB = 32, H = 4, Tq = 50, Tk = 70, B = 3;
  const int64_t P = relative_positions(Tq, Tk);
  std::vector<int32_t> tok(N), bk(P);
  for (auto& x : tok) x = static_cast<int32_t>(rng() % V);
  for (auto& x : bk) x = static_cast<int32_t>(rng() % NB);
  Pair tokens = make_i32(tok), buckets = make_i32(bk);
  for (DType t : {DType::f32, DType::bf16}) {
    for (int64_t D : {16, 64}) {  // SIMT and (bf16) tensor-core kernels
      SCOPED_TRACE(name(t) + " D=" + std::to_string(D));
      const Vec dout0 = uniform(N * C, rng), dbias0 = uniform(H * P, rng);
      const Vec q0 = uniform(B * Tq * H * D, rng), k0 = uniform(B * Tk * H * D, rng);
      Pair q = make(t, q0), k = make(t, k0), v = make(t, k0), lse = make(DType::f32, Vec(B * H * Tq)),
           o = make(t, Vec(B * Tq * H * D)), bias = make(DType::f32, uniform(H * P, rng));
      Backend& g = gpu();
      g.mha_forward(o.v(kGpu), lse.v(kGpu), q.v(kGpu), k.v(kGpu), v.v(kGpu), bias.v(kGpu),
                    TensorView{}, B, Tq, Tk, H, D, 1.0f, false);
      Bytes first[6];
      for (int run = 0; run < 2; ++run) {
        Pair dtable = make(t, Vec(V * C)), ptable = make(t, Vec(NB * H)), d = make(t, dout0),
             db = make(DType::f32, dbias0), mb = make(DType::f32, Vec(H * P));
        Pair dq = make(t, Vec(B * Tq * H * D)), dk = make(t, Vec(B * Tk * H * D)),
             dv = make(t, Vec(B * Tk * H * D));
        g.embedding_lookup_backward(dtable.v(kGpu), d.v(kGpu), tokens.v(kGpu), N, C);
        g.position_bias_backward(ptable.v(kGpu), db.v(kGpu), buckets.v(kGpu), H, Tq, Tk);
        g.mha_backward(dq.v(kGpu), dk.v(kGpu), dv.v(kGpu), mb.v(kGpu), o.v(kGpu), q.v(kGpu),
                       k.v(kGpu), v.v(kGpu), o.v(kGpu), lse.v(kGpu), bias.v(kGpu), TensorView{}, B,
                       Tq, Tk, H, D, 1.0f, false);
        const Pair* outs[6] = {&dtable, &ptable, &mb, &dq, &dk, &dv};
        for (int i = 0; i < 6; ++i) {
          if (run == 0) {
            first[i] = read_bytes(g, outs[i]->v(kGpu));
          } else {
            expect_bytes(*outs[i], first[i], "output " + std::to_string(i));
          }
        }
      }
    }
  }
}

TEST(CudaBackend, T5WrongArgumentsThrow) {
  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 64, MemCategory::other), bf(g, DType::bf16, 64, MemCategory::other),
      i32(g, DType::i32, 64, MemCategory::other);
  const TensorView F = f32.view(), Hb = bf.view(), I = i32.view();
  expect_error([&] { g.embedding_lookup_forward(F, F, F, 8, 8); },
               "cuda backend: embedding_lookup_forward: tokens is fp32");
  expect_error([&] { g.rmsnorm_forward(F, Hb, F, F, 4, 4, 1e-6f); },
               "cuda backend: rmsnorm_forward: rstd is bf16");
  expect_error([&] { g.mul(F, F, F.slice(0, 3)); }, "cuda backend: mul: b is fp32 [3]");
  expect_error([&] { g.position_bias_forward(Hb, F, I, 2, 2, 4); },
               "cuda backend: position_bias_forward: bias is bf16");
  expect_error([&] { g.position_bias_backward(F, F, F, 2, 2, 4); },
               "cuda backend: position_bias_backward: buckets is fp32");
  expect_error(
      [&] { g.mha_forward(F, F, F.slice(0, 40), F, F, TensorView{}, TensorView{}, 2, 3, 3, 2, 4, 1.0f, false); },
      "cuda backend: mha_forward: q is fp32 [40]");
  expect_error([&] { g.mha_forward(F, F, F, F, F, Hb, TensorView{}, 2, 3, 3, 2, 4, 1.0f, false); },
               "cuda backend: mha_forward: bias is bf16");
  expect_error([&] { g.mha_forward(F, Hb, F, F, F, TensorView{}, TensorView{}, 2, 3, 3, 2, 4, 1.0f, false); },
               "cuda backend: mha_forward: lse is bf16");
  expect_error(
      [&] {
        g.mha_backward(F, F, F, TensorView{}, F, F, F, F, F, Hb, TensorView{}, TensorView{}, 2, 3, 3,
                       2, 4, 1.0f, false);
      },
      "cuda backend: mha_backward: lse is bf16");
  g.synchronize();
}

// ---------------------------------------------------------------------------------------
// Llama pieces: rotary embedding, SwiGLU, grouped-query attention

// Llama's rotary tables, fp32 [Tmax, D/2]: cos/sin(t theta^(-2i/D)).
void rope_tables(int64_t Tmax, int64_t D, Vec& cos, Vec& sin) {
  const int64_t half = D / 2;
  cos.resize(static_cast<std::size_t>(Tmax * half));
  sin.resize(cos.size());
  for (int64_t t = 0; t < Tmax; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double f = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / static_cast<double>(D));
      cos[t * half + i] = static_cast<float>(std::cos(f));
      sin[t * half + i] = static_cast<float>(std::sin(f));
    }
  }
}

TEST(CudaBackend, Rope) {
  std::mt19937 rng(28);
  struct Shape {
    int64_t B, T, Tmax, H, D, R;  // R < D: partial rotary, the other columns copied
  };
  for (DType t : kFloatTypes) {
    for (const Shape& sh :
         {Shape{2, 13, 20, 3, 8, 8}, Shape{1, 1, 1, 1, 2, 2}, Shape{3, 7, 7, 2, 6, 6},
          Shape{2, 65, 130, 4, 128, 128}, Shape{1, 33, 64, 8, 64, 64},
          Shape{2, 17, 20, 3, 128, 96}, Shape{2, 5, 5, 2, 10, 4}, Shape{1, 3, 3, 2, 7, 2}}) {
      SCOPED_TRACE(name(t) + " B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) +
                   " H=" + std::to_string(sh.H) + " D=" + std::to_string(sh.D) +
                   " R=" + std::to_string(sh.R));
      const int64_t n = sh.B * sh.T * sh.H * sh.D;
      Vec cv, sv;
      rope_tables(sh.Tmax, sh.R, cv, sv);
      Pair cos = make(DType::f32, cv), sin = make(DType::f32, sv);
      Pair x = make(t, uniform(n, rng, -3.0f, 3.0f)), out = make(t, uniform(n, rng)),
           dx = make(t, uniform(n, rng));
      both([&](Backend& be, Side s) {
        be.rope_forward(out.v(s), x.v(s), cos.v(s), sin.v(s), sh.B, sh.T, sh.H, sh.D, sh.R);
        be.rope_backward(dx.v(s), x.v(s), cos.v(s), sin.v(s), sh.B, sh.T, sh.H, sh.D, sh.R);
      });
      check(out, tol_for(t, kElemF32), "rope_forward");
      check(dx, tol_for(t, kElemF32), "rope_backward");
      both([&](Backend& be, Side s) {  // in place: out = x, then dx = dout
        be.rope_forward(x.v(s), x.v(s), cos.v(s), sin.v(s), sh.B, sh.T, sh.H, sh.D, sh.R);
      });
      check_sync(x, tol_for(t, kElemF32), "rope_forward in place");
      both([&](Backend& be, Side s) {
        be.rope_backward(x.v(s), x.v(s), cos.v(s), sin.v(s), sh.B, sh.T, sh.H, sh.D, sh.R);
      });
      check(x, tol_for(t, kElemF32), "rope_backward in place");
    }
  }
  // mixed storage: bf16 in, fp32 out
  Vec cv, sv;
  rope_tables(9, 16, cv, sv);
  Pair cos = make(DType::f32, cv), sin = make(DType::f32, sv);
  Pair x = make(DType::bf16, uniform(2 * 9 * 3 * 16, rng)), out = make(DType::f32, Vec(2 * 9 * 3 * 16));
  both([&](Backend& be, Side s) {
    be.rope_forward(out.v(s), x.v(s), cos.v(s), sin.v(s), 2, 9, 3, 16, 16);
  });
  check(out, kElemF32, "rope_forward bf16 -> fp32");
}

TEST(CudaBackend, Swiglu) {
  std::mt19937 rng(29);
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}, int64_t{100003}}) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      Vec gv = uniform(n, rng, -8.0f, 8.0f);
      const float extremes[] = {0.0f, -30.0f, 30.0f, -100.0f, 100.0f};
      for (std::size_t i = 0; i < 5 && i < gv.size(); ++i) gv[i] = extremes[i];
      Pair gate = make(t, gv), up = make(t, uniform(n, rng, -2.0f, 2.0f)),
           dout = make(t, uniform(n, rng)), out = make(t, uniform(n, rng)),
           dgate = make(t, uniform(n, rng)), dup = make(t, uniform(n, rng));
      const Tol tol = tol_for(t, kElemF32);
      both([&](Backend& be, Side s) {
        be.swiglu_forward(out.v(s), gate.v(s), up.v(s));
        be.swiglu_backward(dgate.v(s), dup.v(s), dout.v(s), gate.v(s), up.v(s));
      });
      check(out, tol, "swiglu_forward");
      check(dgate, tol, "swiglu_backward dgate");
      check(dup, tol, "swiglu_backward dup");
      // aliasing: dout = dgate; then dgate = gate, dup = up; then out = gate
      Pair d2 = make(t, Vec(n)), u2 = make(t, Vec(n));
      both([&](Backend& be, Side s) {
        be.copy(d2.v(s), dout.v(s));
        be.swiglu_backward(d2.v(s), u2.v(s), d2.v(s), gate.v(s), up.v(s));
      });
      check(d2, tol, "swiglu_backward dgate = dout");
      check(u2, tol, "swiglu_backward dup (dgate = dout)");
      Pair g3 = make(t, gv), u3 = make(t, Vec(n));
      both([&](Backend& be, Side s) {
        be.copy(u3.v(s), up.v(s));
        be.swiglu_backward(g3.v(s), u3.v(s), dout.v(s), g3.v(s), u3.v(s));
      });
      check(g3, tol, "swiglu_backward dgate = gate");
      check(u3, tol, "swiglu_backward dup = up");
      both([&](Backend& be, Side s) { be.swiglu_forward(gate.v(s), gate.v(s), up.v(s)); });
      check(gate, tol, "swiglu_forward out = gate");
    }
  }
  Pair a = make(DType::bf16, uniform(77, rng, -4.0f, 4.0f)), b = make(DType::f32, uniform(77, rng)),
       o = make(DType::f16, Vec(77)), d = make(DType::f32, uniform(77, rng)),
       ga = make(DType::f32, Vec(77)), gb = make(DType::bf16, Vec(77));
  both([&](Backend& be, Side s) {
    be.swiglu_forward(o.v(s), a.v(s), b.v(s));
    be.swiglu_backward(ga.v(s), gb.v(s), d.v(s), a.v(s), b.v(s));
  });
  check(o, kF16, "swiglu_forward mixed bf16, fp32 -> fp16");
  check(ga, kElemF32, "swiglu_backward mixed, dgate fp32");
  check(gb, kBf16, "swiglu_backward mixed, dup bf16");
}

// As run_mha for Llama's causal grouped-query attention: forward on both (out, lse), backward
// on both from the CPU's out and lse (outputs pre-filled: they are written), then the GPU's
// backward once more, bitwise equal (the dK/dV group sums have a fixed order). doc: the
// document mask's doc_start [B,T] (doc_starts), or empty for none (a null view).
void run_gqa(DType t, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, std::mt19937& rng,
             DType out_t, int64_t window = 0, float softcap = 0.f,
             const std::vector<int32_t>& doc = {}) {
  SCOPED_TRACE("q " + name(t) + " out " + name(out_t) + " B=" + std::to_string(B) +
               " T=" + std::to_string(T) + " H=" + std::to_string(H) +
               " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
               " window=" + std::to_string(window) + " softcap=" + std::to_string(softcap) +
               (doc.empty() ? "" : " doc_start"));
  const Tol tol = attn_tol(t == DType::f32 ? out_t : t);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
  Pair q = make(t, uniform(nq, rng, -1.5f, 1.5f)), k = make(t, uniform(nk, rng, -1.5f, 1.5f)),
       v = make(t, uniform(nk, rng));
  Pair out = make(out_t, uniform(nq, rng)), lse = make(DType::f32, uniform(nl, rng));
  const Pair starts = make_i32(doc.empty() ? std::vector<int32_t>{0} : doc);
  const auto ds = [&](Side s) { return doc.empty() ? TensorView{} : starts.v(s); };
  both([&](Backend& be, Side s) {
    be.gqa_attention_forward(out.v(s), lse.v(s), q.v(s), k.v(s), v.v(s), B, T, H, Hkv, D, scale,
                             window, softcap, ds(s));
  });
  check(out, tol, "out");
  check(lse, tol, "lse");
  out.cpu_to_gpu();
  lse.cpu_to_gpu();
  Pair dout = make(out_t, uniform(nq, rng));
  Pair dq = make(t, uniform(nq, rng)), dk = make(t, uniform(nk, rng)), dv = make(t, uniform(nk, rng));
  both([&](Backend& be, Side s) {
    be.gqa_attention_backward(dq.v(s), dk.v(s), dv.v(s), dout.v(s), q.v(s), k.v(s), v.v(s),
                              out.v(s), lse.v(s), B, T, H, Hkv, D, scale, window, softcap, ds(s));
  });
  check(dq, tol, "dq");
  check(dk, tol, "dk");
  check(dv, tol, "dv");
  const Bytes first[3] = {read_bytes(gpu(), dq.v(kGpu)), read_bytes(gpu(), dk.v(kGpu)),
                          read_bytes(gpu(), dv.v(kGpu))};
  Pair dq2 = make(t, Vec(nq)), dk2 = make(t, Vec(nk)), dv2 = make(t, Vec(nk));
  gpu().gqa_attention_backward(dq2.v(kGpu), dk2.v(kGpu), dv2.v(kGpu), dout.v(kGpu), q.v(kGpu),
                               k.v(kGpu), v.v(kGpu), out.v(kGpu), lse.v(kGpu), B, T, H, Hkv, D,
                               scale, window, softcap, ds(kGpu));
  expect_bytes(dq2, first[0], "dq rerun");
  expect_bytes(dk2, first[1], "dk rerun");
  expect_bytes(dv2, first[2], "dv rerun");
}

TEST(CudaBackend, GqaAttention) {
  std::mt19937 rng(30);
  for (DType t : kFloatTypes) {
    run_gqa(t, 2, 13, 4, 2, 8, rng, t);     // SIMT: groups of 2
    run_gqa(t, 2, 37, 6, 1, 16, rng, t);    // MQA
    run_gqa(t, 1, 9, 3, 3, 6, rng, t);      // MHA
    run_gqa(t, 2, 1, 4, 2, 64, rng, t);     // one position
    // head dims 64 and 128: the tensor-core kernels for 16-bit storage
    for (int64_t T : {63, 64, 65, 130}) run_gqa(t, 2, T, 8, 2, 64, rng, t);
    run_gqa(t, 1, 200, 4, 1, 128, rng, t);  // MQA, D 128
    run_gqa(t, 1, 129, 6, 3, 128, rng, t);
    run_gqa(t, 1, 512, 32, 8, 64, rng, t);  // Llama-like: 4 query heads per kv head
    // Sliding windows (Mistral): SIMT; tensor cores with windows inside one 64-key tile,
    // across tiles and not a multiple of 64 (tile_unmasked must see the window).
    run_gqa(t, 2, 37, 4, 2, 8, rng, t, 5);
    for (int64_t w : {1, 48, 64, 100}) run_gqa(t, 1, 300, 8, 2, 64, rng, t, w);
    run_gqa(t, 1, 260, 4, 1, 128, rng, t, 130);
    // Gemma 2's attention soft-cap: SIMT (its head dim 256), tensor cores, with a window.
    run_gqa(t, 2, 37, 4, 2, 256, rng, t, 0, 0.5f);
    run_gqa(t, 1, 130, 8, 2, 64, rng, t, 0, 0.5f);
    run_gqa(t, 1, 300, 8, 2, 128, rng, t, 100, 0.5f);
  }
  run_gqa(DType::bf16, 2, 33, 4, 2, 64, rng, DType::f32);  // mixed storage: fp32 fallback
}

// Document masking's doc_start [B,T] from each batch row's document lengths (summing to T):
// the positions of a document starting at s get s.
std::vector<int32_t> doc_starts(int64_t T, const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> starts;
  for (const std::vector<int64_t>& lengths : rows) {
    int64_t s = 0;
    for (int64_t len : lengths) {
      starts.insert(starts.end(), static_cast<std::size_t>(len), static_cast<int32_t>(s));
      s += len;
    }
    EXPECT_EQ(s, T) << "document lengths must sum to T";
  }
  return starts;
}

// GPT-2's attention (packed qkv) with a document mask against the CPU backend: the tensor-core
// kernels (16-bit, head size 64) and the SIMT ones.
TEST(CudaBackend, AttentionDocumentMask) {
  std::mt19937 rng(33);
  const std::vector<int32_t> d150 = doc_starts(150, {{1, 70, 79}, {64, 64, 22}});
  for (DType t : kFloatTypes) {
    run_attention(t, 2, 150, 128, 2, rng, t, d150);  // hs 64
    run_attention(t, 2, 150, 48, 2, rng, t, d150);   // hs 24: SIMT
  }
}

TEST(CudaBackend, GqaAttentionDocumentMask) {
  // Packed documents (block-causal masking) against the CPU backend: the tensor-core kernels
  // (16-bit storage, D 64 and 128; 64-key tiles) and the SIMT ones (fp32, or D 40; 32-key
  // tiles), with document boundaries inside, across and on the tiles' boundaries, one-token
  // documents, a row of one document (the causal mask alone), a window within and across
  // documents and a soft-cap. Key tiles left of a query tile's first start are skipped, as
  // are (dK/dV) query tiles whose first start lies past a key tile.
  std::mt19937 rng(31);
  const std::vector<int32_t> d150 = doc_starts(150, {{1, 70, 79}, {150}});
  const std::vector<int32_t> e150 = doc_starts(150, {{64, 64, 22}, {10, 20, 30, 40, 50}});
  const std::vector<int32_t> d300 = doc_starts(300, {{130, 1, 1, 100, 68}, {63, 2, 200, 35}});
  for (DType t : kFloatTypes) {
    for (int64_t D : {64, 40}) {
      run_gqa(t, 2, 150, 4, 2, D, rng, t, 0, 0.f, d150);
      run_gqa(t, 2, 150, 4, 2, D, rng, t, 0, 0.f, e150);
      run_gqa(t, 2, 300, 4, 2, D, rng, t, 0, 0.f, d300);
      run_gqa(t, 2, 300, 4, 2, D, rng, t, 48, 0.f, d300);
    }
    run_gqa(t, 2, 300, 4, 1, 128, rng, t, 100, 0.5f, d300);  // MQA, D 128, window, soft-cap
  }
  run_gqa(DType::bf16, 2, 150, 4, 2, 64, rng, DType::f32, 0, 0.f, d150);  // fp32 fallback
}

TEST(CudaBackend, GqaAttentionZeroDocStartsAreNoMask) {
  // doc_start all 0 (one document a row) masks nothing beyond causality and the window: the
  // results of a null doc_start bit for bit, on both paths (the same tiles, the same order).
  std::mt19937 rng(32);
  Backend& g = gpu();
  const int64_t B = 2, T = 150, H = 4, Hkv = 2;
  const Pair zeros = make_i32(std::vector<int32_t>(B * T, 0));
  struct Case {
    DType t;
    int64_t D;
  };
  for (const Case c : {Case{DType::bf16, 64}, Case{DType::f32, 40}}) {
    const DType t = c.t;
    const int64_t D = c.D;
    for (int64_t window : {0, 48}) {
      SCOPED_TRACE(name(t) + " D=" + std::to_string(D) + " window=" + std::to_string(window));
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
      Pair q = make(t, uniform(nq, rng, -1.5f, 1.5f)), k = make(t, uniform(nk, rng, -1.5f, 1.5f)),
           v = make(t, uniform(nk, rng)), dout = make(t, uniform(nq, rng));
      Pair out = make(t, Vec(nq)), lse = make(DType::f32, Vec(nl)), out0 = make(t, Vec(nq)),
           lse0 = make(DType::f32, Vec(nl));
      Pair dq = make(t, Vec(nq)), dk = make(t, Vec(nk)), dv = make(t, Vec(nk)),
           dq0 = make(t, Vec(nq)), dk0 = make(t, Vec(nk)), dv0 = make(t, Vec(nk));
      const auto run = [&](Pair& o, Pair& l, Pair& gq, Pair& gk, Pair& gv, const TensorView& ds) {
        g.gqa_attention_forward(o.v(kGpu), l.v(kGpu), q.v(kGpu), k.v(kGpu), v.v(kGpu), B, T, H,
                                Hkv, D, scale, window, 0.f, ds);
        g.gqa_attention_backward(gq.v(kGpu), gk.v(kGpu), gv.v(kGpu), dout.v(kGpu), q.v(kGpu),
                                 k.v(kGpu), v.v(kGpu), o.v(kGpu), l.v(kGpu), B, T, H, Hkv, D,
                                 scale, window, 0.f, ds);
      };
      run(out, lse, dq, dk, dv, TensorView{});
      run(out0, lse0, dq0, dk0, dv0, zeros.v(kGpu));
      expect_bytes(out0, read_bytes(g, out.v(kGpu)), "out, zero doc_start");
      expect_bytes(lse0, read_bytes(g, lse.v(kGpu)), "lse, zero doc_start");
      expect_bytes(dq0, read_bytes(g, dq.v(kGpu)), "dq, zero doc_start");
      expect_bytes(dk0, read_bytes(g, dk.v(kGpu)), "dk, zero doc_start");
      expect_bytes(dv0, read_bytes(g, dv.v(kGpu)), "dv, zero doc_start");
    }
  }
}

TEST(CudaBackend, GqaAttentionDocumentsAreSeparateSequences) {
  // Independent of the CPU reference: under the document mask each document attends as a
  // sequence of its own (the kernels see no positions), so its rows of out and lse equal a
  // separate call on its rows alone (B = 1, T = its length, no doc_start), and so do its rows
  // of dq, dk, dv given the same out and lse; to rounding (the tiles fall differently).
  std::mt19937 rng(33);
  Backend& g = gpu();
  const int64_t B = 2, T = 150, H = 4, Hkv = 2;
  const std::vector<std::vector<int64_t>> docs = {{1, 70, 79}, {30, 120}};
  const Pair starts = make_i32(doc_starts(T, docs));
  struct Case {
    DType t;
    int64_t D;
  };
  for (const Case c : {Case{DType::bf16, 64}, Case{DType::f32, 40}, Case{DType::f16, 128}}) {
    const DType t = c.t;
    const int64_t D = c.D;
    SCOPED_TRACE(name(t) + " D=" + std::to_string(D));
    const Tol tol = attn_tol(t);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int64_t Q = H * D, KV = Hkv * D, nq = B * T * Q, nk = B * T * KV;
    Pair q = make(t, uniform(nq, rng, -1.5f, 1.5f)), k = make(t, uniform(nk, rng, -1.5f, 1.5f)),
         v = make(t, uniform(nk, rng)), dout = make(t, uniform(nq, rng));
    Pair out = make(t, Vec(nq)), lse = make(DType::f32, Vec(B * H * T));
    Pair dq = make(t, Vec(nq)), dk = make(t, Vec(nk)), dv = make(t, Vec(nk));
    g.gqa_attention_forward(out.v(kGpu), lse.v(kGpu), q.v(kGpu), k.v(kGpu), v.v(kGpu), B, T, H,
                            Hkv, D, scale, 0, 0.f, starts.v(kGpu));
    g.gqa_attention_backward(dq.v(kGpu), dk.v(kGpu), dv.v(kGpu), dout.v(kGpu), q.v(kGpu),
                             k.v(kGpu), v.v(kGpu), out.v(kGpu), lse.v(kGpu), B, T, H, Hkv, D,
                             scale, 0, 0.f, starts.v(kGpu));
    for (int64_t b = 0; b < B; ++b) {
      int64_t s = 0;
      for (int64_t L : docs[static_cast<std::size_t>(b)]) {
        SCOPED_TRACE("b=" + std::to_string(b) + " document [" + std::to_string(s) + ", " +
                     std::to_string(s + L) + ")");
        // The document's rows of x (row width w).
        const auto rows = [&](const Pair& x, int64_t w) {
          return x.v(kGpu).slice((b * T + s) * w, L * w);
        };
        Pair o1 = make(t, Vec(L * Q)), l1 = make(DType::f32, Vec(H * L));
        Pair dq1 = make(t, Vec(L * Q)), dk1 = make(t, Vec(L * KV)), dv1 = make(t, Vec(L * KV));
        g.gqa_attention_forward(o1.v(kGpu), l1.v(kGpu), rows(q, Q), rows(k, KV), rows(v, KV), 1,
                                L, H, Hkv, D, scale, 0, 0.f, TensorView{});
        expect_close(read(g, o1.v(kGpu)), read(g, rows(out, Q)), tol, "out");
        for (int64_t h = 0; h < H; ++h) {
          const TensorView masked = lse.v(kGpu).slice((b * H + h) * T + s, L);
          expect_close(read(g, l1.v(kGpu).slice(h * L, L)), read(g, masked), tol, "lse");
          g.copy(l1.v(kGpu).slice(h * L, L), masked);  // backward from the masked call's
        }
        g.copy(o1.v(kGpu), rows(out, Q));
        g.gqa_attention_backward(dq1.v(kGpu), dk1.v(kGpu), dv1.v(kGpu), rows(dout, Q),
                                 rows(q, Q), rows(k, KV), rows(v, KV), o1.v(kGpu), l1.v(kGpu), 1,
                                 L, H, Hkv, D, scale, 0, 0.f, TensorView{});
        expect_close(read(g, dq1.v(kGpu)), read(g, rows(dq, Q)), tol, "dq");
        expect_close(read(g, dk1.v(kGpu)), read(g, rows(dk, KV)), tol, "dk");
        expect_close(read(g, dv1.v(kGpu)), read(g, rows(dv, KV)), tol, "dv");
        s += L;
      }
    }
  }
}

TEST(CudaBackend, LlamaWrongArgumentsThrow) {
  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 256, MemCategory::other), bf(g, DType::bf16, 64, MemCategory::other);
  const TensorView F = f32.view(), Hb = bf.view();
  expect_error([&] { g.rope_forward(F.slice(0, 36), F.slice(0, 36), F, F, 1, 3, 4, 3, 3); },
               "cuda backend: rope_forward: R");
  expect_error([&] { g.rope_backward(F, F, Hb, F, 1, 3, 4, 4, 4); },
               "cuda backend: rope_backward: cos is bf16");
  expect_error([&] { g.swiglu_forward(F, F.slice(0, 100), F); },
               "cuda backend: swiglu_forward: gate is fp32 [100]");
  expect_error([&] { g.swiglu_backward(F, F, F, F, F.slice(0, 3)); },
               "cuda backend: swiglu_backward: up is fp32 [3]");
  const TensorView none{};
  expect_error([&] { g.gqa_attention_forward(F, F, F, F, F, 1, 2, 6, 4, 4, 0.5f, 0, 0.f, none); },
               "cuda backend: gqa_attention_forward: Hkv = 4");
  expect_error(
      [&] {
        g.gqa_attention_backward(F, F, F, F, F, F, F, F, F, 1, 2, 6, 0, 4, 0.5f, 0, 0.f, none);
      },
      "cuda backend: gqa_attention_backward: Hkv = 0");
  expect_error([&] { g.gqa_attention_forward(F, Hb, F, F, F, 1, 2, 6, 3, 4, 0.5f, 0, 0.f, none); },
               "cuda backend: gqa_attention_forward: lse is bf16");
  // doc_start: int32 with B*T elements
  DeviceBuffer i32(g, DType::i32, 8, MemCategory::other);
  expect_error([&] { g.gqa_attention_forward(F, F, F, F, F, 1, 2, 6, 3, 4, 0.5f, 0, 0.f, Hb); },
               "cuda backend: gqa_attention_forward: doc_start is bf16");
  expect_error(
      [&] {
        g.gqa_attention_backward(F, F, F, F, F, F, F, F, F, 2, 3, 6, 3, 4, 0.5f, 0, 0.f,
                                 i32.view().slice(0, 5));
      },
      "cuda backend: gqa_attention_backward: doc_start is int32");
  g.synchronize();
}

// ---------------------------------------------------------------------------------------
// gpt-oss pieces: the clamped SwiGLU on interleaved (gate, up) pairs and the attention sinks
// on gqa_attention_forward's out and lse. Elementwise math (tol_for(t, kElemF32)); the sinks'
// gradient is a reduction over B*T rows (kReduceF32; 16-bit dsinks as tol_for), bitwise
// repeatable on the GPU (one block a head, no atomics).

TEST(CudaBackend, ClampedSwiglu) {
  std::mt19937 rng(42);
  const float alpha = 1.702f, limit = 7.0f;  // HF GptOssExperts
  // (gate, up) pairs on and beyond the bounds: gate == limit passes its gradient, gate >
  // limit does not; up on -limit or limit passes, outside does not; u = -1 (u + 1 = 0).
  const float pairs[][2] = {{limit, limit},        {limit, -limit},     {limit + 0.5f, 0.25f},
                            {100.0f, -limit - 1},  {-limit, limit + 3}, {-30.0f, -100.0f},
                            {0.0f, -1.0f},         {-limit - 2, 0.5f},  {6.96875f, 7.03125f}};
  for (DType t : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{13}, int64_t{1000}, int64_t{100003}}) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      Vec gv = uniform(2 * n, rng, -10.0f, 10.0f);
      for (std::size_t i = 0; i < 9 && 2 * i + 1 < gv.size(); ++i) {
        gv[2 * i] = pairs[i][0];
        gv[2 * i + 1] = pairs[i][1];
      }
      Pair gate_up = make(t, gv), out = make(t, uniform(n, rng)), dout = make(t, uniform(n, rng)),
           dgate_up = make(t, uniform(2 * n, rng));
      const Tol tol = tol_for(t, kElemF32);
      both([&](Backend& be, Side s) {
        be.clamped_swiglu_forward(out.v(s), gate_up.v(s), alpha, limit);
        be.clamped_swiglu_backward(dgate_up.v(s), dout.v(s), gate_up.v(s), alpha, limit);
      });
      check(out, tol, "clamped_swiglu_forward");
      check(dgate_up, tol, "clamped_swiglu_backward");
      // The clamped inputs' gradients are exactly 0 on both sides.
      const std::vector<double> got = read(gpu(), dgate_up.v(kGpu));
      if (n >= 9) {
        EXPECT_EQ(got[2 * 2], 0.0) << "gate above limit";
        EXPECT_EQ(got[2 * 3], 0.0) << "gate far above limit";
        EXPECT_EQ(got[2 * 3 + 1], 0.0) << "up below -limit";
        EXPECT_EQ(got[2 * 4 + 1], 0.0) << "up above limit";
        EXPECT_EQ(got[2 * 5 + 1], 0.0) << "up far below -limit";
        EXPECT_NE(got[0], 0.0) << "gate on limit";
        EXPECT_NE(got[1], 0.0) << "up on limit";
        EXPECT_NE(got[3], 0.0) << "up on -limit";
      }
      // in place: dgate_up = gate_up
      Pair gu2 = make(t, gv);
      both([&](Backend& be, Side s) {
        be.clamped_swiglu_backward(gu2.v(s), dout.v(s), gu2.v(s), alpha, limit);
      });
      check(gu2, tol, "clamped_swiglu_backward dgate_up = gate_up");
      expect_bytes(gu2, read_bytes(gpu(), dgate_up.v(kGpu)), "in place equals out of place");
    }
  }
  // Another alpha and limit, and mixed storage: bf16 pairs, fp32 out, fp16 dout, fp32 dgate_up.
  const int64_t n = 77;
  Pair gate_up = make(DType::bf16, uniform(2 * n, rng, -4.0f, 4.0f)),
       out = make(DType::f32, Vec(n)), dout = make(DType::f16, uniform(n, rng)),
       dgate_up = make(DType::f32, Vec(2 * n));
  both([&](Backend& be, Side s) {
    be.clamped_swiglu_forward(out.v(s), gate_up.v(s), 1.0f, 2.5f);
    be.clamped_swiglu_backward(dgate_up.v(s), dout.v(s), gate_up.v(s), 1.0f, 2.5f);
  });
  check(out, kElemF32, "clamped_swiglu_forward mixed bf16 -> fp32");
  check(dgate_up, kElemF32, "clamped_swiglu_backward mixed bf16, fp16 -> fp32");
}

// Gated attention's output gate (Qwen3-Next / Qwen3.5; HF Qwen3NextAttention: attn_output *
// sigmoid(gate)): sigmoid_gate_forward / backward against the CPU backend for each storage
// type, lengths around the 8-element packs, a misaligned view (the scalar path), saturated
// gates; in place (out = x) and aliased (dx = dout, dgate = gate) equal out of place bit for
// bit; mixed storage; the argument checks.
TEST(CudaBackend, SigmoidGate) {
  std::mt19937 rng(1234);
  const float special[] = {0.0f, 40.0f, -40.0f, -100.0f, 100.0f, 8.0f, -8.0f};
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}, int64_t{1000},
                      int64_t{100003}}) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      Vec gv = uniform(n, rng, -8.0f, 8.0f);
      for (std::size_t i = 0; i < std::size(special) && i < gv.size(); ++i) gv[i] = special[i];
      const Vec xv = uniform(n, rng, -3.0f, 3.0f), dv = uniform(n, rng);
      Pair x = make(t, xv), gate = make(t, gv), dout = make(t, dv), out = make(t, Vec(n)),
           dx = make(t, uniform(n, rng)), dgate = make(t, uniform(n, rng));
      const Tol tol = tol_for(t, kElemF32);
      both([&](Backend& be, Side s) {
        be.sigmoid_gate_forward(out.v(s), x.v(s), gate.v(s));
        be.sigmoid_gate_backward(dx.v(s), dgate.v(s), dout.v(s), x.v(s), gate.v(s));
      });
      check(out, tol, "sigmoid_gate_forward");
      check(dx, tol, "sigmoid_gate_backward dx");
      check(dgate, tol, "sigmoid_gate_backward dgate");
      // in place: out = x; dx = dout and dgate = gate
      Pair x2 = make(t, xv), d2 = make(t, dv), g2 = make(t, gv);
      both([&](Backend& be, Side s) {
        be.sigmoid_gate_forward(x2.v(s), x2.v(s), gate.v(s));
        be.sigmoid_gate_backward(d2.v(s), g2.v(s), d2.v(s), x.v(s), g2.v(s));
      });
      check(x2, tol, "sigmoid_gate_forward out = x");
      check(d2, tol, "sigmoid_gate_backward dx = dout");
      check(g2, tol, "sigmoid_gate_backward dgate = gate");
      expect_bytes(x2, read_bytes(gpu(), out.v(kGpu)), "forward in place equals out of place");
      expect_bytes(d2, read_bytes(gpu(), dx.v(kGpu)), "dx = dout equals out of place");
      expect_bytes(g2, read_bytes(gpu(), dgate.v(kGpu)), "dgate = gate equals out of place");
      if (n > 1) {  // views one element in: not 16-byte aligned (the element-wise path)
        const int64_t m = n - 1;
        both([&](Backend& be, Side s) {
          be.sigmoid_gate_forward(out.v(s, 1, m), x.v(s, 1, m), gate.v(s, 1, m));
          be.sigmoid_gate_backward(dx.v(s, 1, m), dgate.v(s, 1, m), dout.v(s, 1, m),
                                   x.v(s, 1, m), gate.v(s, 1, m));
        });
        check(out, tol, "sigmoid_gate_forward misaligned");
        check(dx, tol, "sigmoid_gate_backward dx misaligned");
        check(dgate, tol, "sigmoid_gate_backward dgate misaligned");
      }
    }
  }
  // Mixed storage: bf16 x, fp16 gate, fp32 out; fp16 dout, fp32 dx, bf16 dgate.
  const int64_t n = 77;
  Pair x = make(DType::bf16, uniform(n, rng, -3.0f, 3.0f)),
       gate = make(DType::f16, uniform(n, rng, -6.0f, 6.0f)), out = make(DType::f32, Vec(n)),
       dout = make(DType::f16, uniform(n, rng)), dx = make(DType::f32, Vec(n)),
       dgate = make(DType::bf16, Vec(n));
  both([&](Backend& be, Side s) {
    be.sigmoid_gate_forward(out.v(s), x.v(s), gate.v(s));
    be.sigmoid_gate_backward(dx.v(s), dgate.v(s), dout.v(s), x.v(s), gate.v(s));
  });
  check(out, kElemF32, "sigmoid_gate_forward mixed bf16, fp16 -> fp32");
  check(dx, kElemF32, "sigmoid_gate_backward mixed dx fp32");
  check(dgate, kBf16, "sigmoid_gate_backward mixed dgate bf16");

  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 256, MemCategory::other);
  const TensorView F = f32.view(), a = F.slice(0, 16), b = F.slice(32, 16), c = F.slice(64, 16),
                   d = F.slice(96, 16);
  expect_error([&] { g.sigmoid_gate_forward(F.slice(40, 16), a, b); },
               "cuda backend: sigmoid_gate_forward: out overlaps gate");
  expect_error([&] { g.sigmoid_gate_forward(c, a, b.slice(0, 15)); },
               "cuda backend: sigmoid_gate_forward: gate is fp32 [15] but needs at least 16");
  expect_error([&] { g.sigmoid_gate_backward(a, c, d, a, b); },
               "cuda backend: sigmoid_gate_backward: dx overlaps x");
  expect_error([&] { g.sigmoid_gate_backward(c, d, d, a, b); },
               "cuda backend: sigmoid_gate_backward: dgate overlaps dout");
  g.synchronize();
}

// Attention sinks after Llama-style attention: gqa_attention_forward on both (out and lse
// then made equal: the sink kernels' own differences are checked), attention_sink_forward,
// then attention_sink_backward into dsinks pre-filled with nonzero values (it adds), and the
// GPU's backward once more into the same start values, bitwise equal. sinks / dsinks have
// storage type sink_t.
void run_sink(DType t, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, std::mt19937& rng,
              DType sink_t) {
  SCOPED_TRACE("out " + name(t) + " sinks " + name(sink_t) + " B=" + std::to_string(B) +
               " T=" + std::to_string(T) + " H=" + std::to_string(H) +
               " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
  Pair q = make(t, uniform(nq, rng, -1.5f, 1.5f)), k = make(t, uniform(nk, rng, -1.5f, 1.5f)),
       v = make(t, uniform(nk, rng));
  Pair out = make(t, uniform(nq, rng)), lse = make(DType::f32, uniform(nl, rng));
  both([&](Backend& be, Side s) {
    be.gqa_attention_forward(out.v(s), lse.v(s), q.v(s), k.v(s), v.v(s), B, T, H, Hkv, D, scale,
                             0, 0.f, TensorView{});
  });
  check_sync(out, attn_tol(t), "gqa out");
  check_sync(lse, attn_tol(t), "gqa lse");
  // Sinks around the rows' logsumexps (about 0 .. log T): both branches of the stable form.
  Pair sinks = make(sink_t, uniform(H, rng, -3.0f, 6.0f));
  both([&](Backend& be, Side s) {
    be.attention_sink_forward(out.v(s), lse.v(s), sinks.v(s), B, T, H, D);
  });
  check_sync(out, tol_for(t, kElemF32), "attention_sink_forward out");
  check_sync(lse, kElemF32, "attention_sink_forward lse");
  const Vec start = uniform(H, rng, 0.5f, 2.0f);
  Pair dout = make(t, uniform(nq, rng)), dsinks = make(sink_t, start);
  both([&](Backend& be, Side s) {
    be.attention_sink_backward(dsinks.v(s), dout.v(s), out.v(s), lse.v(s), sinks.v(s), B, T, H,
                               D);
  });
  check(dsinks, tol_for(sink_t, kReduceF32), "attention_sink_backward dsinks");
  Pair dsinks2 = make(sink_t, start);
  gpu().attention_sink_backward(dsinks2.v(kGpu), dout.v(kGpu), out.v(kGpu), lse.v(kGpu),
                                sinks.v(kGpu), B, T, H, D);
  expect_bytes(dsinks2, read_bytes(gpu(), dsinks.v(kGpu)), "dsinks rerun");
}

TEST(CudaBackend, AttentionSink) {
  std::mt19937 rng(43);
  for (DType t : {DType::f32, DType::bf16}) {
    run_sink(t, 2, 13, 4, 2, 8, rng, t);     // SIMT attention, a few rows a warp
    run_sink(t, 1, 65, 8, 2, 64, rng, t);    // tensor cores for bf16
    run_sink(t, 2, 300, 8, 1, 64, rng, t);   // many rows per warp in the backward
    run_sink(t, 1, 3, 2, 2, 40, rng, t);     // D not a multiple of 32
  }
  run_sink(DType::bf16, 2, 33, 4, 2, 64, rng, DType::f32);  // fp32 sinks beside bf16 rows
  // Rows with lse = +inf (no visible key) are left as they are and add nothing to dsinks;
  // lse = -inf gives the sink the whole row (out *= 0, lse = sink). Synthetic out and lse.
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t B = 2, T = 5, H = 3, D = 6, nq = B * T * H * D, nl = B * H * T;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE("infinite lse, " + name(t));
    Vec lv = uniform(nl, rng, -6.0f, 6.0f);
    lv[0] = inf;
    lv[7] = inf;
    lv[nl - 1] = inf;
    lv[3] = -inf;
    Pair out = make(t, uniform(nq, rng)), lse = make(DType::f32, lv),
         sinks = make(t, {-20.0f, 0.5f, 20.0f});
    const Bytes out0 = read_bytes(gpu(), out.v(kGpu));
    both([&](Backend& be, Side s) {
      be.attention_sink_forward(out.v(s), lse.v(s), sinks.v(s), B, T, H, D);
    });
    check(out, tol_for(t, kElemF32), "attention_sink_forward out");
    check(lse, kElemF32, "attention_sink_forward lse");
    const std::vector<double> l = read(gpu(), lse.v(kGpu));
    EXPECT_EQ(l[0], inf);
    EXPECT_EQ(l[nl - 1], inf);
    EXPECT_EQ(l[3], -20.0);  // (b 0, h 0, t 3): sink -20
    // Row (b 0, t 0, h 0) has lse[0] = +inf: its D values kept, bit for bit.
    const Bytes out1 = read_bytes(gpu(), out.v(kGpu));
    const std::size_t row = static_cast<std::size_t>(D) * dtype_size(t);
    EXPECT_TRUE(std::equal(out0.begin(), out0.begin() + static_cast<std::ptrdiff_t>(row),
                           out1.begin()))
        << "a row with lse = +inf changed";
    out.cpu_to_gpu();
    Pair dout = make(t, uniform(nq, rng)), dsinks = make(t, {1.0f, -2.0f, 3.0f});
    both([&](Backend& be, Side s) {
      be.attention_sink_backward(dsinks.v(s), dout.v(s), out.v(s), lse.v(s), sinks.v(s), B, T,
                                 H, D);
    });
    check(dsinks, tol_for(t, kReduceF32), "attention_sink_backward dsinks");
  }
  // Empty shapes change nothing.
  Pair dsinks = make(DType::f32, {1.0f, 2.0f});
  Pair none = make(DType::f32, Vec(1));
  gpu().attention_sink_forward(none.v(kGpu).slice(0, 0), none.v(kGpu).slice(0, 0),
                               dsinks.v(kGpu), 0, 4, 2, 8);
  gpu().attention_sink_backward(dsinks.v(kGpu), none.v(kGpu).slice(0, 0),
                                none.v(kGpu).slice(0, 0), none.v(kGpu).slice(0, 0),
                                none.v(kGpu), 2, 0, 1, 8);
  EXPECT_EQ(read(gpu(), dsinks.v(kGpu)), (std::vector<double>{1.0, 2.0}));
}

TEST(CudaBackend, GptOssWrongArgumentsThrow) {
  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 256, MemCategory::other),
      bf(g, DType::bf16, 64, MemCategory::other);
  const TensorView F = f32.view(), Hb = bf.view();
  const TensorView out = F.slice(0, 16), gate_up = F.slice(32, 32), dout = F.slice(64, 16);
  expect_error([&] { g.clamped_swiglu_forward(out, gate_up, 1.702f, 0.0f); },
               "cuda backend: clamped_swiglu_forward: limit = 0");
  expect_error([&] { g.clamped_swiglu_forward(out, gate_up, 1.702f, -7.0f); },
               "cuda backend: clamped_swiglu_forward: limit = -7");
  expect_error(
      [&] { g.clamped_swiglu_backward(gate_up, dout, gate_up, 1.702f, INFINITY); },
      "cuda backend: clamped_swiglu_backward: limit = inf");
  expect_error([&] { g.clamped_swiglu_forward(out, gate_up, NAN, 7.0f); },
               "cuda backend: clamped_swiglu_forward: alpha");
  expect_error([&] { g.clamped_swiglu_forward(out, gate_up.slice(0, 31), 1.702f, 7.0f); },
               "cuda backend: clamped_swiglu_forward: gate_up is fp32 [31] but needs at least 32");
  expect_error([&] { g.clamped_swiglu_forward(F.slice(40, 16), gate_up, 1.702f, 7.0f); },
               "cuda backend: clamped_swiglu_forward: out overlaps gate_up");
  expect_error([&] { g.clamped_swiglu_backward(F.slice(56, 32), dout, gate_up, 1.702f, 7.0f); },
               "cuda backend: clamped_swiglu_backward: dout overlaps dgate_up");
  expect_error(
      [&] { g.clamped_swiglu_backward(F.slice(128, 32), F.slice(40, 16), gate_up, 1.f, 7.f); },
      "cuda backend: clamped_swiglu_backward: dout overlaps gate_up");
  // B=1, T=2, H=3, D=4: out, dout [24], lse [6], sinks, dsinks [3].
  const TensorView o = F.slice(0, 24), l = F.slice(24, 6), sk = F.slice(30, 3),
                   d = F.slice(40, 24), ds = F.slice(64, 3);
  expect_error([&] { g.attention_sink_forward(o, Hb.slice(0, 6), sk, 1, 2, 3, 4); },
               "cuda backend: attention_sink_forward: lse is bf16");
  expect_error([&] { g.attention_sink_forward(o, l, sk.slice(0, 2), 1, 2, 3, 4); },
               "cuda backend: attention_sink_forward: sinks is fp32 [2] but needs at least 3");
  expect_error([&] { g.attention_sink_forward(o, l, sk, -1, 2, 3, 4); },
               "cuda backend: attention_sink_forward: B = -1");
  expect_error([&] { g.attention_sink_backward(ds, d, o, l, sk, 1, 2, 3, 5); },
               "cuda backend: attention_sink_backward: out is fp32 [24] but needs at least 30");
  expect_error([&] { g.attention_sink_backward(d.slice(4, 3), d, o, l, sk, 1, 2, 3, 4); },
               "cuda backend: attention_sink_backward: dsinks overlaps dout");
  expect_error([&] { g.attention_sink_backward(sk, d, o, l, sk, 1, 2, 3, 4); },
               "cuda backend: attention_sink_backward: dsinks overlaps sinks");
  expect_error([&] { g.attention_sink_backward(ds, d, o, l, sk.slice(0, 1), 1, 2, 3, 4); },
               "cuda backend: attention_sink_backward: sinks is fp32 [1]");
  g.synchronize();  // nothing was enqueued by the failed calls
}

// ---------------------------------------------------------------------------------------
// Strided copies (kernels.hpp's strided_copy): Multi-head Latent Attention's layout work on
// [R tokens, H heads, columns] views. dst is pre-filled with random values, so the positions
// a call does not name must keep theirs on both sides. Copies (one storage type, a widening,
// or one rounding to dst's type) must equal the CPU's bit for bit; accumulations and group
// sums are fp32 adds on identical inputs (tol_for(dst, kElemF32)). Every CUDA call runs a
// second time into a fresh dst, which must be bitwise equal.

struct StridedCase {
  const char* what;
  int64_t dn, sn;  // dst's and src's lengths (elements)
  Kernels::Strided d, s;
  int64_t R, G, W;
  bool accumulate;
  int64_t shift = 0;  // both views start this many elements into their buffers (misaligned)
};

void run_strided_copy(const StridedCase& k, DType dt, DType st, std::mt19937& rng) {
  SCOPED_TRACE(std::string(k.what) + ": dst " + name(dt) + ", src " + name(st));
  const bool sums = k.accumulate || (k.d.group == 0 && k.G > 1);
  const Tol tol = sums ? tol_for(dt, kElemF32) : kExact;
  const Vec start = uniform(static_cast<std::size_t>(k.dn + k.shift), rng);
  Pair src = make(st, uniform(static_cast<std::size_t>(k.sn + k.shift), rng));
  Pair dst = make(dt, start);
  both([&](Backend& be, Side s) {
    be.strided_copy(dst.v(s, k.shift, k.dn), k.d, src.v(s, k.shift, k.sn), k.s, k.R, k.G, k.W,
                    k.accumulate);
  });
  check(dst, tol, "dst");
  Pair dst2 = make(dt, start);
  gpu().strided_copy(dst2.v(kGpu, k.shift, k.dn), k.d, src.v(kGpu, k.shift, k.sn), k.s, k.R, k.G,
                     k.W, k.accumulate);
  expect_bytes(dst2, read_bytes(gpu(), dst.v(kGpu)), "dst rerun");
}

TEST(CudaBackend, StridedCopy) {
  std::mt19937 rng(41);
  // R tokens, H heads of Dn "nope" and Dr rope columns (Dh = Dn + Dr a head), P rope pairs.
  const int64_t R = 37, H = 5, Dn = 16, Dr = 8, Dh = Dn + Dr, P = 12, P2 = 2 * P;
  const int64_t q = R * H * Dh, nope = R * H * Dn, rope = R * H * Dr, pairs = R * H * P2;
  const StridedCase cases[] = {
      // q [R, H, Dh] -> q_nope [R, H, Dn], q_rope [R, H, Dr] (16-byte packs), and back.
      {"split nope", nope, q, {H * Dn, 0, Dn, 1}, {H * Dh, 0, Dh, 1}, R, H, Dn, false},
      {"split rope", rope, q, {H * Dr, 0, Dr, 1}, {H * Dh, Dn, Dh, 1}, R, H, Dr, false},
      {"assemble nope", q, nope, {H * Dh, 0, Dh, 1}, {H * Dn, 0, Dn, 1}, R, H, Dn, false},
      {"assemble rope", q, rope, {H * Dh, Dn, Dh, 1}, {H * Dr, 0, Dr, 1}, R, H, Dr, false},
      // The same with misaligned views (element by element).
      {"split nope, shifted", nope, q, {H * Dn, 0, Dn, 1}, {H * Dh, 0, Dh, 1}, R, H, Dn, false, 1},
      {"assemble rope, shifted", q, rope, {H * Dh, Dn, Dh, 1}, {H * Dr, 0, Dr, 1}, R, H, Dr, false,
       3},
      // A column block of a [R, 29] matrix (G = 1, the default group strides 0; odd width).
      {"column block", R * 13, R * 29, {.row = 13}, {.row = 29, .offset = 3}, R, 1, 13, false},
      // Broadcast: the shared rope key [R, Dr] into every head's last Dr columns.
      {"broadcast", q, R * Dr, {H * Dh, Dn, Dh, 1}, {.row = Dr}, R, H, Dr, false},
      {"broadcast, odd width", q, R * 7, {H * Dh, 3, Dh, 1}, {.row = 7}, R, H, 7, false},
      // Its gradient: the sum over heads, written and accumulated; odd width.
      {"group sum", R * Dr, q, {.row = Dr}, {H * Dh, Dn, Dh, 1}, R, H, Dr, false},
      {"group sum, accumulate", R * Dr, q, {.row = Dr}, {H * Dh, Dn, Dh, 1}, R, H, Dr, true},
      {"group sum, odd width", R * 7, q, {.row = 7}, {H * Dh, 3, Dh, 1}, R, H, 7, false},
      {"group sum, odd width, accumulate", R * 7, q, {.row = 7}, {H * Dh, 3, Dh, 1}, R, H, 7,
       true},
      {"group sum of a broadcast", R * Dr, R * Dr, {.row = Dr}, {.row = Dr}, R, H, Dr, false},
      // RoPE pairs (x0 y0 x1 y1 ...) de-interleaved into halves (x0 x1 ... y0 y1 ...), back.
      {"de-interleave x", pairs, pairs, {H * P2, 0, P2, 1}, {H * P2, 0, P2, 2}, R, H, P, false},
      {"de-interleave y", pairs, pairs, {H * P2, P, P2, 1}, {H * P2, 1, P2, 2}, R, H, P, false},
      {"interleave x", pairs, pairs, {H * P2, 0, P2, 2}, {H * P2, 0, P2, 1}, R, H, P, false},
      {"interleave y", pairs, pairs, {H * P2, 1, P2, 2}, {H * P2, P, P2, 1}, R, H, P, false},
      // Accumulating copies (16-byte packs, element by element, a broadcast).
      {"split nope, accumulate", nope, q, {H * Dn, 0, Dn, 1}, {H * Dh, 0, Dh, 1}, R, H, Dn, true},
      {"interleave y, accumulate", pairs, pairs, {H * P2, 1, P2, 2}, {H * P2, P, P2, 1}, R, H, P,
       true},
      {"broadcast, accumulate", q, R * Dr, {H * Dh, Dn, Dh, 1}, {.row = Dr}, R, H, Dr, true},
  };
  // One storage type, and the mixed pairs (bf16 into fp32: exact; fp32 into bf16: one rounding).
  const std::pair<DType, DType> types[] = {{DType::f32, DType::f32},
                                           {DType::bf16, DType::bf16},
                                           {DType::f16, DType::f16},
                                           {DType::f32, DType::bf16},
                                           {DType::bf16, DType::f32}};
  for (const StridedCase& k : cases) {
    for (const auto& [dt, st] : types) run_strided_copy(k, dt, st, rng);
  }
}

TEST(CudaBackend, StridedCopyGridStride) {
  // More outputs than the grid has threads (8192 blocks of 256): each thread's (r, g, c)
  // carried along the grid-stride loop across column, group and row boundaries.
  std::mt19937 rng(42);
  const int64_t R = 4099, G = 17, W = 41;  // 2.86M outputs, element by element
  run_strided_copy({"copy", R * G * W, R * G * 43, {G * W, 0, W, 1}, {G * 43, 1, 43, 1}, R, G, W,
                    true},
                   DType::f32, DType::bf16, rng);
  const int64_t Rv = 2053, Gv = 128, Wv = 64;  // 2.1M packs of 8
  run_strided_copy({"packs", Rv * Gv * Wv, Rv * Gv * 72, {Gv * Wv, 0, Wv, 1}, {Gv * 72, 8, 72, 1},
                    Rv, Gv, Wv, false},
                   DType::bf16, DType::bf16, rng);
  const int64_t Rs = 32771, Gs = 3, Ws = 67;  // 2.2M group sums
  run_strided_copy({"group sum", Rs * Ws, Rs * Gs * Ws, {.row = Ws}, {Gs * Ws, 0, Ws, 1}, Rs, Gs,
                    Ws, true},
                   DType::f32, DType::f32, rng);
}

TEST(CudaBackend, StridedCopyEmptyAndWrongArguments) {
  Backend& g = gpu();
  std::mt19937 rng(43);
  // R G W == 0: nothing written (no launch), whatever the strides.
  Pair dst = make(DType::bf16, uniform(64, rng)), src = make(DType::f32, uniform(64, rng));
  const Bytes before = read_bytes(gpu(), dst.v(kGpu));
  using S = Kernels::Strided;
  const S d{.row = 8, .offset = 1, .group = 0, .col = 1}, s{.row = 1000, .group = 1000};
  const int64_t shapes[][3] = {{0, 4, 8}, {4, 0, 8}, {4, 4, 0}};
  for (const auto& rgw : shapes) {
    both([&](Backend& be, Side side) {
      be.strided_copy(dst.v(side), d, src.v(side), s, rgw[0], rgw[1], rgw[2], true);
    });
  }
  g.synchronize();
  expect_bytes(dst, before, "dst untouched");

  DeviceBuffer f32(g, DType::f32, 64, MemCategory::other),
      i32(g, DType::i32, 64, MemCategory::other);
  const TensorView F = f32.view(), I = i32.view();
  const S dense{.row = 4};  // [2, 4] rows of 4 (G = 1)
  expect_error([&] { g.strided_copy(F, {.row = -4}, F.slice(0, 8), dense, 2, 1, 4, false); },
               "cuda backend: strided_copy: dst has a negative stride or offset");
  expect_error([&] { g.strided_copy(F, dense, F, {.row = 4, .col = -1}, 2, 1, 4, false); },
               "cuda backend: strided_copy: src has a negative stride or offset");
  expect_error([&] { g.strided_copy(F, {.row = 4, .col = 0}, F, dense, 2, 1, 4, false); },
               "cuda backend: strided_copy: dst has column stride 0 (expected >= 1)");
  expect_error([&] { g.strided_copy(F, dense, F, {.row = 64}, 2, 1, 4, false); },
               "cuda backend: strided_copy: src is fp32 [64] but needs at least 68 elements");
  const S short_dst{.row = 8, .offset = 3, .group = 20};
  expect_error([&] { g.strided_copy(F.slice(0, 30), short_dst, F, dense, 2, 2, 4, false); },
               "cuda backend: strided_copy: dst is fp32 [30] but needs at least 35 elements");
  expect_error([&] { g.strided_copy(I, dense, F, dense, 2, 1, 4, false); },
               "cuda backend: strided_copy: dst is int32");
  expect_error([&] { g.strided_copy(F, dense, F, dense, -1, 1, 4, false); },
               "cuda backend: strided_copy: R = -1 (expected >= 0)");
  g.synchronize();  // nothing was enqueued by the failed calls
}

// ---------------------------------------------------------------------------------------
// Mixture of experts: top-k routing and the weighted combination of the experts' rows.
// idx must match exactly: a row's logits are distinct multiples of 1/16 (exact in bf16), so
// neighbouring p differ by a factor e^(1/16) and expf's last bits cannot reorder them.
// weights and dlogits are fp32 math on identical inputs (kElemF32; dlogits rounded once to
// 16-bit storage: tol_for); out and drows are rounded once to the storage type (tol_for);
// dweights, fp32 dot products over C in another order than the CPU's fp64 one, kReduceF32.
// Every CUDA kernel runs a second time into fresh outputs, which must be bitwise equal.

struct MoeShape {
  int64_t R, E, K, C;
};
// The brief's shapes (one token and top-1; Mixtral-like E 8, K 2; Qwen3-30B-A3B-like E 128,
// K 8; OLMoE-like E 64, K 8 with an odd C), then E 256 / K 16 (the largest register-cached
// router) and E 300 (the uncached router).
const MoeShape kMoeShapes[] = {{1, 4, 1, 8},   {37, 8, 2, 40},   {64, 128, 8, 96},
                               {5, 64, 8, 33}, {9, 256, 16, 64}, {3, 300, 4, 16}};

std::string moe_trace(DType t, const MoeShape& m) {
  return name(t) + " R=" + std::to_string(m.R) + " E=" + std::to_string(m.E) +
         " K=" + std::to_string(m.K) + " C=" + std::to_string(m.C);
}

// Router logits [R,E]: row r is a random permutation of (e - E/2) / 16, e < E, plus a random
// row offset in [-2, 2) in steps of 1/16: distinct values, all exact in bf16 (|16 x| < 256).
Vec moe_logits(int64_t R, int64_t E, std::mt19937& rng) {
  Vec v(static_cast<std::size_t>(R * E));
  std::vector<int64_t> perm(static_cast<std::size_t>(E));
  for (int64_t r = 0; r < R; ++r) {
    std::iota(perm.begin(), perm.end(), int64_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    const float off = static_cast<float>(static_cast<int64_t>(rng() % 64) - 32) / 16.0f;
    for (int64_t e = 0; e < E; ++e) {
      v[static_cast<std::size_t>(r * E + e)] =
          static_cast<float>(perm[static_cast<std::size_t>(e)] - E / 2) / 16.0f + off;
    }
  }
  return v;
}

// Distinct slots: a random permutation of [0, N) cut to its first n.
std::vector<int32_t> moe_slots(int64_t n, int64_t N, std::mt19937& rng) {
  std::vector<int32_t> v(static_cast<std::size_t>(N));
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(static_cast<std::size_t>(n));
  return v;
}

// Forward on both (outputs pre-filled: they are written), then backward on both from the
// same idx (dweights random), each CUDA kernel once more into fresh outputs.
void run_moe_router(DType t, const MoeShape& m, bool normalize, std::mt19937& rng) {
  SCOPED_TRACE(moe_trace(t, m) + " normalize=" + std::to_string(normalize));
  const int64_t R = m.R, E = m.E, K = m.K;
  Pair logits = make(t, moe_logits(R, E, rng));
  Pair idx = make_i32(std::vector<int32_t>(static_cast<std::size_t>(R * K), -7));
  Pair w = make(DType::f32, uniform(R * K, rng));
  both([&](Backend& be, Side s) {
    be.moe_router_forward(idx.v(s), w.v(s), logits.v(s), R, E, K, normalize);
  });
  const Bytes idx1 = read_bytes(gpu(), idx.v(kGpu)), w1 = read_bytes(gpu(), w.v(kGpu));
  check_sync(idx, kExact, "idx");  // the backward below reads the same picks on both sides
  check(w, kElemF32, "weights");
  Pair idx2 = make_i32(std::vector<int32_t>(static_cast<std::size_t>(R * K)));
  Pair w2 = make(DType::f32, Vec(R * K));
  gpu().moe_router_forward(idx2.v(kGpu), w2.v(kGpu), logits.v(kGpu), R, E, K, normalize);
  expect_bytes(idx2, idx1, "idx rerun");
  expect_bytes(w2, w1, "weights rerun");

  Pair dw = make(DType::f32, uniform(R * K, rng)), dlogits = make(t, uniform(R * E, rng));
  both([&](Backend& be, Side s) {
    be.moe_router_backward(dlogits.v(s), dw.v(s), logits.v(s), idx.v(s), R, E, K, normalize);
  });
  check(dlogits, tol_for(t, kElemF32), "dlogits");
  Pair dlogits2 = make(t, Vec(R * E));
  gpu().moe_router_backward(dlogits2.v(kGpu), dw.v(kGpu), logits.v(kGpu), idx.v(kGpu), R, E, K,
                            normalize);
  expect_bytes(dlogits2, read_bytes(gpu(), dlogits.v(kGpu)), "dlogits rerun");
}

TEST(CudaBackend, MoeRouter) {
  std::mt19937 rng(31);
  for (DType t : {DType::f32, DType::bf16}) {
    for (const MoeShape& m : kMoeShapes) {
      for (bool normalize : {true, false}) run_moe_router(t, m, normalize, rng);
    }
  }
}

// DeepSeek-V3 / GLM-4.5 sigmoid routing. The choice values c = sigmoid(logit) + bias are
// kept well apart, so that expf's last bits cannot reorder them: the bias is an integer in
// {-1, 0, 1} (exact in bf16), and a row's logits a random permutation of distinct multiples
// of 1/32 within |x| < 8 (exact in bf16), whose sigmoids differ by more than 2e-5; two
// experts of different biases differ by more than 1e-3 in c, and every c by more than 9e-4
// from a masked expert's 0. With n_group > 1 a row is redrawn while two of its group scores
// lie within 1e-4 (in double). Every fourth row is all zeros (s = 0.5 exactly, so c and the
// group scores are exact): exact ties, which both backends break to the lower group and the
// lower expert.
Vec sigmoid_router_logits(int64_t R, int64_t E, int64_t n_group, const Vec& bias,
                          std::mt19937& rng) {
  Vec v(static_cast<std::size_t>(R * E), 0.0f);
  std::vector<int64_t> perm(static_cast<std::size_t>(E));
  const int64_t size = E / n_group;
  for (int64_t r = 0; r < R; ++r) {
    if (r % 4 == 3) continue;
    float* x = &v[static_cast<std::size_t>(r * E)];
    for (bool apart = false; !apart;) {
      std::iota(perm.begin(), perm.end(), int64_t{0});
      std::shuffle(perm.begin(), perm.end(), rng);
      const float off = static_cast<float>(static_cast<int64_t>(rng() % 64) - 32) / 32.0f;
      for (int64_t e = 0; e < E; ++e) {
        x[e] = static_cast<float>(perm[static_cast<std::size_t>(e)] - E / 2) / 32.0f + off;
      }
      std::vector<double> score;
      for (int64_t h = 0; n_group > 1 && h < n_group; ++h) {
        std::vector<double> c;
        for (int64_t e = h * size; e < (h + 1) * size; ++e) {
          c.push_back(1.0 / (1.0 + std::exp(-static_cast<double>(x[e]))) +
                      bias[static_cast<std::size_t>(e)]);
        }
        std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<>());
        score.push_back(c[0] + c[1]);
      }
      apart = true;
      for (std::size_t a = 0; a < score.size(); ++a) {
        for (std::size_t b = a + 1; b < score.size(); ++b) {
          apart = apart && std::abs(score[a] - score[b]) >= 1e-4;
        }
      }
    }
  }
  return v;
}

Vec sigmoid_router_bias(int64_t E, std::mt19937& rng) {
  Vec v(static_cast<std::size_t>(E));
  for (float& b : v) b = static_cast<float>(static_cast<int64_t>(rng() % 3) - 1);
  return v;
}

// As run_moe_router: forward on both (outputs pre-filled), backward on both from the same idx,
// each CUDA kernel once more into fresh outputs.
void run_moe_sigmoid_router(DType t, int64_t E, int64_t K, const Kernels::SigmoidRouting& g,
                            std::mt19937& rng) {
  const int64_t R = 23;
  SCOPED_TRACE(name(t) + " E=" + std::to_string(E) + " K=" + std::to_string(K) + " n_group=" +
               std::to_string(g.n_group) + " topk_group=" + std::to_string(g.topk_group) +
               " normalize=" + std::to_string(g.normalize));
  const Vec bias0 = sigmoid_router_bias(E, rng);
  Pair bias = make(t, bias0), logits = make(t, sigmoid_router_logits(R, E, g.n_group, bias0, rng));
  Pair idx = make_i32(std::vector<int32_t>(static_cast<std::size_t>(R * K), -7));
  Pair w = make(DType::f32, uniform(R * K, rng));
  both([&](Backend& be, Side s) {
    be.moe_sigmoid_router_forward(idx.v(s), w.v(s), logits.v(s), bias.v(s), R, E, K, g);
  });
  const Bytes idx1 = read_bytes(gpu(), idx.v(kGpu)), w1 = read_bytes(gpu(), w.v(kGpu));
  check_sync(idx, kExact, "idx");  // the backward below reads the same picks on both sides
  check(w, kElemF32, "weights");
  Pair idx2 = make_i32(std::vector<int32_t>(static_cast<std::size_t>(R * K)));
  Pair w2 = make(DType::f32, Vec(R * K));
  gpu().moe_sigmoid_router_forward(idx2.v(kGpu), w2.v(kGpu), logits.v(kGpu), bias.v(kGpu), R, E, K,
                                   g);
  expect_bytes(idx2, idx1, "idx rerun");
  expect_bytes(w2, w1, "weights rerun");

  Pair dw = make(DType::f32, uniform(R * K, rng)), dlogits = make(t, uniform(R * E, rng));
  both([&](Backend& be, Side s) {
    be.moe_sigmoid_router_backward(dlogits.v(s), dw.v(s), logits.v(s), idx.v(s), R, E, K, g);
  });
  check(dlogits, tol_for(t, kElemF32), "dlogits");
  Pair dlogits2 = make(t, Vec(R * E));
  gpu().moe_sigmoid_router_backward(dlogits2.v(kGpu), dw.v(kGpu), logits.v(kGpu), idx.v(kGpu), R, E,
                                    K, g);
  expect_bytes(dlogits2, read_bytes(gpu(), dlogits.v(kGpu)), "dlogits rerun");
}

TEST(CudaBackend, MoeSigmoidRouter) {
  // DeepSeek-V3-like (n_group 8 of E 256 there) with 4 groups, 2 kept; and no groups. E 8:
  // groups of 2, so K 8 also picks masked experts (c = 0, to the lower index).
  std::mt19937 rng(37);
  for (DType t : {DType::f32, DType::bf16}) {
    for (int64_t E : {8, 64, 160, 384}) {
      for (int64_t K : {1, 2, 8}) {
        for (int64_t n_group : {1, 4}) {
          for (bool normalize : {true, false}) {
            const Kernels::SigmoidRouting g{.n_group = n_group,
                                            .topk_group = n_group > 1 ? 2 : 1,
                                            .normalize = normalize,
                                            .scale = 2.5f};
            run_moe_sigmoid_router(t, E, K, g, rng);
          }
        }
      }
    }
  }
}

// Forward with routing weights and with an empty weights view (ones); backward with drows
// pre-filled: its N - R K rows that no slot names must keep their values on both sides.
void run_moe_combine(DType t, const MoeShape& m, std::mt19937& rng) {
  SCOPED_TRACE(moe_trace(t, m));
  const int64_t R = m.R, K = m.K, C = m.C, N = R * K + 3;
  const Tol tol = tol_for(t, kElemF32);
  Pair slot = make_i32(moe_slots(R * K, N, rng));
  Pair rows = make(t, uniform(N * C, rng)), w = make(DType::f32, uniform(R * K, rng, 0.0f, 1.0f));
  Pair out = make(t, uniform(R * C, rng)), ones = make(t, uniform(R * C, rng));
  both([&](Backend& be, Side s) {
    be.moe_combine_forward(out.v(s), rows.v(s), w.v(s), slot.v(s), R, K, C);
    be.moe_combine_forward(ones.v(s), rows.v(s), TensorView{}, slot.v(s), R, K, C);
  });
  check(out, tol, "out");
  check(ones, tol, "out, empty weights view");
  Pair out2 = make(t, Vec(R * C)), ones2 = make(t, Vec(R * C));
  gpu().moe_combine_forward(out2.v(kGpu), rows.v(kGpu), w.v(kGpu), slot.v(kGpu), R, K, C);
  gpu().moe_combine_forward(ones2.v(kGpu), rows.v(kGpu), TensorView{}, slot.v(kGpu), R, K, C);
  expect_bytes(out2, read_bytes(gpu(), out.v(kGpu)), "out rerun");
  expect_bytes(ones2, read_bytes(gpu(), ones.v(kGpu)), "out (empty weights view) rerun");

  const Vec drows0 = uniform(N * C, rng);
  Pair dout = make(t, uniform(R * C, rng)), drows = make(t, drows0);
  Pair dw = make(DType::f32, uniform(R * K, rng));
  both([&](Backend& be, Side s) {
    be.moe_combine_backward(drows.v(s), dw.v(s), dout.v(s), rows.v(s), w.v(s), slot.v(s), R, K, C);
  });
  check(drows, tol, "drows");
  check(dw, kReduceF32, "dweights");
  Pair drows2 = make(t, drows0), dw2 = make(DType::f32, Vec(R * K));
  gpu().moe_combine_backward(drows2.v(kGpu), dw2.v(kGpu), dout.v(kGpu), rows.v(kGpu), w.v(kGpu),
                             slot.v(kGpu), R, K, C);
  expect_bytes(drows2, read_bytes(gpu(), drows.v(kGpu)), "drows rerun");
  expect_bytes(dw2, read_bytes(gpu(), dw.v(kGpu)), "dweights rerun");
}

TEST(CudaBackend, MoeCombine) {
  std::mt19937 rng(32);
  for (DType t : {DType::f32, DType::bf16}) {
    for (const MoeShape& m : kMoeShapes) run_moe_combine(t, m, rng);
  }
}

TEST(CudaBackend, MoeMixedStorage) {
  // bf16 logits with fp32 dlogits; bf16 rows with fp32 out and dout: the run-time typed
  // kernels (each output rounded once, to its own type).
  std::mt19937 rng(33);
  const int64_t R = 11, E = 16, K = 4, C = 24, N = R * K;
  Pair logits = make(DType::bf16, moe_logits(R, E, rng));
  Pair idx = make_i32(std::vector<int32_t>(static_cast<std::size_t>(R * K)));
  Pair w = make(DType::f32, Vec(R * K)), dw = make(DType::f32, uniform(R * K, rng));
  Pair dlogits = make(DType::f32, Vec(R * E));
  both([&](Backend& be, Side s) {
    be.moe_router_forward(idx.v(s), w.v(s), logits.v(s), R, E, K, true);
  });
  check_sync(idx, kExact, "idx");
  check(w, kElemF32, "weights");
  both([&](Backend& be, Side s) {
    be.moe_router_backward(dlogits.v(s), dw.v(s), logits.v(s), idx.v(s), R, E, K, true);
  });
  check(dlogits, kElemF32, "dlogits fp32 from bf16 logits");
  // Sigmoid routing: bf16 logits, fp32 bias; fp32 dlogits.
  const Kernels::SigmoidRouting sg{.n_group = 4, .topk_group = 2, .normalize = true, .scale = 2.5f};
  const Vec bias0 = sigmoid_router_bias(E, rng);
  Pair bias = make(DType::f32, bias0);
  Pair slogits = make(DType::bf16, sigmoid_router_logits(R, E, sg.n_group, bias0, rng));
  both([&](Backend& be, Side s) {
    be.moe_sigmoid_router_forward(idx.v(s), w.v(s), slogits.v(s), bias.v(s), R, E, K, sg);
  });
  check_sync(idx, kExact, "sigmoid idx, bf16 logits and fp32 bias");
  check(w, kElemF32, "sigmoid weights");
  both([&](Backend& be, Side s) {
    be.moe_sigmoid_router_backward(dlogits.v(s), dw.v(s), slogits.v(s), idx.v(s), R, E, K, sg);
  });
  check(dlogits, kElemF32, "sigmoid dlogits fp32 from bf16 logits");
  Pair slot = make_i32(moe_slots(R * K, N, rng));
  Pair rows = make(DType::bf16, uniform(N * C, rng)), out = make(DType::f32, Vec(R * C));
  Pair dout = make(DType::f32, uniform(R * C, rng)), drows = make(DType::bf16, Vec(N * C));
  Pair dw2 = make(DType::f32, Vec(R * K));
  both([&](Backend& be, Side s) {
    be.moe_combine_forward(out.v(s), rows.v(s), w.v(s), slot.v(s), R, K, C);
    be.moe_combine_backward(drows.v(s), dw2.v(s), dout.v(s), rows.v(s), w.v(s), slot.v(s), R, K, C);
  });
  check(out, kElemF32, "out fp32 from bf16 rows");
  check(drows, kBf16, "drows bf16 from fp32 dout");
  check(dw2, kReduceF32, "dweights");
}

// The load-balancing loss's kernels on both backends: the probability sums (accumulating
// onto a starting psum), the loss term into an fp64 scalar, and the backward accumulating
// onto dlogits; each CUDA kernel run again for the same bits.
TEST(CudaBackend, MoeLoadBalancingLoss) {
  std::mt19937 rng(35);
  for (DType t : {DType::f32, DType::bf16}) {
    for (const MoeShape& m : kMoeShapes) {
      SCOPED_TRACE(moe_trace(t, m));
      const int64_t R = m.R, E = m.E;
      Pair logits = make(t, moe_logits(R, E, rng));
      const Vec start = uniform(E, rng);
      Pair psum = make(DType::f32, start);
      both([&](Backend& be, Side s) { be.moe_router_prob_sums(psum.v(s), logits.v(s), R, E); });
      check(psum, kReduceF32, "psum");
      Pair psum2 = make(DType::f32, start);
      gpu().moe_router_prob_sums(psum2.v(kGpu), logits.v(kGpu), R, E);
      expect_bytes(psum2, read_bytes(gpu(), psum.v(kGpu)), "psum rerun");

      Pair counts = make(DType::f32, uniform(E, rng)), loss = make_f64({0.25});
      both([&](Backend& be, Side s) {
        be.moe_aux_loss(loss.v(s), counts.v(s), psum.v(s), E, 0.3);
      });
      check(loss, kReduceF32, "loss");

      Pair dprobs = make(DType::f32, uniform(E, rng)), dlogits = make(t, uniform(R * E, rng));
      const Bytes before = read_bytes(gpu(), dlogits.v(kGpu));
      both([&](Backend& be, Side s) {
        be.moe_aux_loss_backward(dlogits.v(s), logits.v(s), dprobs.v(s), R, E);
      });
      check(dlogits, tol_for(t, kElemF32), "dlogits");
      Pair dlogits2 = make_bytes(t, R * E, before);
      gpu().moe_aux_loss_backward(dlogits2.v(kGpu), logits.v(kGpu), dprobs.v(kGpu), R, E);
      expect_bytes(dlogits2, read_bytes(gpu(), dlogits.v(kGpu)), "dlogits rerun");
    }
  }
}

// Qwen2-MoE's shared expert gate on both backends: accumulated forward, backward (dshared,
// dlogit), each CUDA kernel again for the same bits.
TEST(CudaBackend, MoeSharedGate) {
  std::mt19937 rng(36);
  for (DType t : {DType::f32, DType::bf16}) {
    for (const MoeShape& m : kMoeShapes) {
      SCOPED_TRACE(moe_trace(t, m));
      const int64_t R = m.R, C = m.C;
      Pair shared = make(t, uniform(R * C, rng)), logit = make(t, uniform(R, rng));
      const Vec start = uniform(R * C, rng);
      Pair out = make(t, start);
      both([&](Backend& be, Side s) {
        be.moe_shared_gate_forward(out.v(s), shared.v(s), logit.v(s), R, C);
      });
      check(out, tol_for(t, kElemF32), "out");
      Pair out2 = make(t, start);
      gpu().moe_shared_gate_forward(out2.v(kGpu), shared.v(kGpu), logit.v(kGpu), R, C);
      expect_bytes(out2, read_bytes(gpu(), out.v(kGpu)), "out rerun");
      Pair dout = make(t, uniform(R * C, rng)), dshared = make(t, Vec(R * C)),
           dlogit = make(t, Vec(R));
      both([&](Backend& be, Side s) {
        be.moe_shared_gate_backward(dshared.v(s), dlogit.v(s), dout.v(s), shared.v(s),
                                    logit.v(s), R, C);
      });
      check(dshared, tol_for(t, kElemF32), "dshared");
      check(dlogit, tol_for(t, kReduceF32), "dlogit");
      Pair dlogit2 = make(t, Vec(R)), dshared2 = make(t, Vec(R * C));
      gpu().moe_shared_gate_backward(dshared2.v(kGpu), dlogit2.v(kGpu), dout.v(kGpu),
                                     shared.v(kGpu), logit.v(kGpu), R, C);
      expect_bytes(dlogit2, read_bytes(gpu(), dlogit.v(kGpu)), "dlogit rerun");
    }
  }
}

TEST(CudaBackend, MoeZeroTokensIsANoOp) {
  // R = 0: no launch (a zero grid would fail), every output left as it was.
  std::mt19937 rng(34);
  const int64_t E = 4, K = 2, C = 8;
  Pair logits = make(DType::bf16, uniform(E, rng)), idx = make_i32({1, 3});
  Pair w = make(DType::f32, uniform(K, rng)), dw = make(DType::f32, uniform(K, rng));
  Pair dlogits = make(DType::bf16, uniform(E, rng)), rows = make(DType::bf16, uniform(K * C, rng));
  Pair out = make(DType::bf16, uniform(C, rng)), dout = make(DType::bf16, uniform(C, rng));
  Pair drows = make(DType::bf16, uniform(K * C, rng));
  const Pair* outs[] = {&idx, &w, &dw, &dlogits, &out, &drows};
  std::vector<Bytes> before;
  for (const Pair* p : outs) before.push_back(read_bytes(gpu(), p->v(kGpu)));
  const Kernels::SigmoidRouting g{.n_group = 2, .topk_group = 1, .normalize = true, .scale = 1.f};
  Pair bias = make(DType::bf16, uniform(E, rng));
  both([&](Backend& be, Side s) {
    be.moe_router_forward(idx.v(s), w.v(s), logits.v(s), 0, E, K, true);
    be.moe_router_backward(dlogits.v(s), w.v(s), logits.v(s), idx.v(s), 0, E, K, true);
    be.moe_sigmoid_router_forward(idx.v(s), w.v(s), logits.v(s), bias.v(s), 0, E, K, g);
    be.moe_sigmoid_router_backward(dlogits.v(s), w.v(s), logits.v(s), idx.v(s), 0, E, K, g);
    be.moe_combine_forward(out.v(s), rows.v(s), w.v(s), idx.v(s), 0, K, C);
    be.moe_combine_forward(out.v(s), rows.v(s), TensorView{}, idx.v(s), 0, K, C);
    be.moe_combine_backward(drows.v(s), dw.v(s), dout.v(s), rows.v(s), w.v(s), idx.v(s), 0, K, C);
  });
  gpu().synchronize();
  for (std::size_t i = 0; i < before.size(); ++i) {
    expect_bytes(*outs[i], before[i], "output " + std::to_string(i) + " untouched");
  }
}

TEST(CudaBackend, MoeWrongArgumentsThrow) {
  Backend& g = gpu();
  DeviceBuffer f32(g, DType::f32, 64, MemCategory::other),
      bf(g, DType::bf16, 64, MemCategory::other), i32(g, DType::i32, 64, MemCategory::other);
  const TensorView F = f32.view(), Hb = bf.view(), I = i32.view();
  expect_error([&] { g.moe_router_forward(I, F, F, 2, 4, 5, true); },
               "cuda backend: moe_router_forward: K = 5");
  expect_error([&] { g.moe_router_forward(I, Hb, F, 2, 4, 2, true); },
               "cuda backend: moe_router_forward: weights is bf16");
  expect_error([&] { g.moe_router_backward(F, F, F, F, 2, 4, 2, false); },
               "cuda backend: moe_router_backward: idx is fp32");
  using Routing = Kernels::SigmoidRouting;
  const Routing five_of_four{.n_group = 4, .topk_group = 5};
  expect_error([&] { g.moe_sigmoid_router_forward(I, F, F, F, 2, 8, 2, five_of_four); },
               "cuda backend: moe_sigmoid_router_forward: topk_group = 5 (expected 1 <= "
               "topk_group <= n_group = 4)");
  expect_error(
      [&] { g.moe_sigmoid_router_backward(F, F, F, I, 2, 8, 2, Routing{.n_group = 3}); },
      "cuda backend: moe_sigmoid_router_backward: n_group = 3 (expected 1, or a divisor of E = 8");
  expect_error(
      [&] { g.moe_sigmoid_router_forward(I, F, F, F, 2, 8, 2, Routing{.n_group = 8}); },
      "cuda backend: moe_sigmoid_router_forward: n_group = 8 (expected 1, or a divisor of E = 8 "
      "into groups of at least 2 experts)");
  expect_error([&] { g.moe_sigmoid_router_forward(I, F, F, I, 2, 8, 2, Routing{}); },
               "cuda backend: moe_sigmoid_router_forward: bias is int32");
  expect_error([&] { g.moe_sigmoid_router_backward(F, F, F, F, 2, 8, 2, Routing{}); },
               "cuda backend: moe_sigmoid_router_backward: idx is fp32");
  {
    // The forward keeps a row in shared memory: E <= 1024 (the backward has no limit).
    const int64_t E = 1025;
    DeviceBuffer big(g, DType::f32, E, MemCategory::other);
    expect_error(
        [&] { g.moe_sigmoid_router_forward(I, F, big.view(), big.view(), 1, E, 1, Routing{}); },
        "cuda backend: moe_sigmoid_router_forward: E = 1025 (expected at most 1024)");
  }
  expect_error([&] { g.moe_combine_forward(F, F, F, I, 2, 2, 8); },
               "cuda backend: moe_combine_forward: out overlaps rows");
  expect_error([&] { g.moe_combine_backward(Hb, F, F, Hb.slice(0, 32), F, I, 2, 2, 8); },
               "cuda backend: moe_combine_backward: drows overlaps rows");
  g.synchronize();  // nothing was enqueued by the failed calls
}

}  // namespace
}  // namespace fsdp
