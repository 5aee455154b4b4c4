// fsdp/backend/counting_backend.hpp: a Backend that computes nothing and counts.
//
// Every kernel is a no-op and memory is never touched: allocate() hands out distinct fake
// addresses and records the bytes by category in its MemoryTracker. Two uses:
//  - the --dry-run memory plan (plan_memory, fsdp/fsdp/engine.hpp) drives the real engine
//    and optimizer through a step on it, so the plan is what the engine allocates, for any
//    model size, without allocating it;
//  - with `record_gemms`, it keeps the shape and dtypes of every gemm() call, so a model's
//    GEMMs can be listed for a full-size configuration (GPT-2 124M, t5-small) in
//    milliseconds and checked for tensor-core alignment (misaligned_gemms below; test:
//    tests/test_gemm_alignment.cpp).
// Nothing it returns may be dereferenced.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/backend/backend.hpp"

namespace fsdp {

// One Backend::gemm call: C[M,N] = op(A)[M,K] @ op(B)[K,N], row-major as Backend::gemm
// stores its operands, with the leading dimensions (row strides) that follow.
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  DType a = DType::f32, b = DType::f32, c = DType::f32;
  int64_t lda() const { return trans_a ? M : K; }  // A stored [K,M] if trans_a, else [M,K]
  int64_t ldb() const { return trans_b ? K : N; }  // B stored [N,K] if trans_b, else [K,N]
  int64_t ldc() const { return N; }                // C [M,N]
  // Any operand stored in 16 bits (bf16, fp16): what tensor cores run.
  bool sixteen_bit() const;
};
// "gemm(trans_a=0, trans_b=1, M=1024, N=50257, K=768, lda=768, ldb=768, ldc=50257, bf16 x bf16 -> bf16)"
std::string to_string(const GemmCall& g);

// The calls among `gemms` with a 16-bit operand and any of M, N, K, lda, ldb, ldc not a
// multiple of `multiple` (8: 16 bytes of bf16/fp16, the alignment cuBLAS(Lt) needs for its
// tensor-core kernels, NVIDIA's "Matrix Multiplication Background" guide), in call order.
std::vector<GemmCall> misaligned_gemms(const std::vector<GemmCall>& gemms, int64_t multiple = 8);

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(bool record_gemms = false) : record_gemms_(record_gemms) {}
  // The gemm() calls so far, in order (empty unless constructed with record_gemms).
  const std::vector<GemmCall>& gemms() const { return gemms_; }

  Device device() const override { return Device::cpu; }
  Stream& compute_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void* allocate(std::size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                  std::shared_ptr<Event>) noexcept override;
  MemoryTracker& memory() override { return memory_; }
  const AllocatorStats& allocator_stats() const override { return stats_; }
  void fill_zero(const TensorView&) override {}
  void copy(const TensorView&, const TensorView&) override {}
  void cast(const TensorView&, const TensorView&) override {}
  void copy_to_host(void*, const TensorView&) override {}
  void copy_from_host(const TensorView&, const void*) override {}
  void synchronize() override {}
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float,
            const TensorView& A, const TensorView& B, float, const TensorView& C) override;
  void add_bias(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void bias_backward(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void add(const TensorView&, const TensorView&, const TensorView&) override {}
  void axpy(const TensorView&, float, const TensorView&) override {}
  void scale(const TensorView&, float) override {}
  void squared_norm(const TensorView&, const TensorView&) override {}
  void clip_coefficient(const TensorView&, const TensorView&, const TensorView&, double) override {}
  void scale_by(const TensorView&, const TensorView&) override {}
  void unscale_and_check(const TensorView&, float, const TensorView&) override {}
  void embedding_forward(const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, int64_t, int64_t, int64_t) override {}
  void embedding_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, int64_t, int64_t, int64_t) override {}
  void layernorm_forward(const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t, float) override {}
  void layernorm_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void gelu_forward(const TensorView&, const TensorView&) override {}
  void gelu_backward(const TensorView&, const TensorView&, const TensorView&) override {}
  void bias_gelu_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t) override {}
  void gelu_bias_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, int64_t, int64_t) override {}
  void attention_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t, int64_t, int64_t) override {}
  void attention_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, int64_t, int64_t, int64_t,
                          int64_t) override {}
  void cross_entropy_forward_backward(const TensorView&, const TensorView&, const TensorView&,
                                      int64_t, int64_t, int64_t, float) override {}
  void cross_entropy_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t, int64_t) override {}
  void embedding_lookup_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                                int64_t) override {}
  void embedding_lookup_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                                 int64_t) override {}
  void rmsnorm_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                       int64_t, int64_t, float) override {}
  void rmsnorm_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void relu_forward(const TensorView&, const TensorView&) override {}
  void relu_backward(const TensorView&, const TensorView&, const TensorView&) override {}
  void mul(const TensorView&, const TensorView&, const TensorView&) override {}
  void position_bias_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t, int64_t) override {}
  void position_bias_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                              int64_t, int64_t) override {}
  void mha_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                   const TensorView&, const TensorView&, const TensorView&, int64_t, int64_t,
                   int64_t, int64_t, int64_t, float, bool) override {}
  void mha_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    int64_t, int64_t, int64_t, int64_t, int64_t, float, bool) override {}
  void adamw_update(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    float, float, float, float, float, int64_t) override {}
  void sgd_update(const TensorView&, const TensorView&, const TensorView&, float, float, float,
                  int64_t) override {}

 private:
  bool record_gemms_;
  std::vector<GemmCall> gemms_;
  HostStream stream_;
  MemoryTracker memory_;
  AllocatorStats stats_;
  std::uintptr_t next_ = 0x10000;
};

}  // namespace fsdp
