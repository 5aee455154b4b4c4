// fsdp/backend/device_runtime.hpp: the device runtime, what the FSDP engine, the optimizers
// and DeviceBuffer use: streams and events, the tagged caching allocator, copies and casts
// between buffers and to/from the host, and the arithmetic on flat fp32 shards (gradient
// norms and clipping, loss-scale unscaling, the optimizer updates). Models use the kernel
// set (fsdp/backend/kernels.hpp), which reaches this runtime through Kernels::runtime().
// `Backend` (fsdp/backend/backend.hpp) is both: the CPU and CUDA backends implement it; the
// --dry-run memory plan's CountingRuntime (fsdp/backend/counting_runtime.hpp) implements only
// this, as PyTorch's torch.cuda (streams, caching allocator) sits apart from ATen's kernels.
//
// Conventions for every operation here and in fsdp/backend/kernels.hpp:
//  - Tensors are TensorViews (pointer, dtype, shape): contiguous, row-major, in this
//    backend's memory. Dimensions that a kernel needs are also passed explicitly; a view
//    must hold at least that many elements (checked).
//  - Storage dtypes. "float" arguments may be fp32, bf16 or fp16 (the mixed-precision
//    param_dtype of parameters, gradients and activations); every kernel computes in fp32
//    and rounds to nearest even when it stores (the CPU backend converts on the way in and
//    out; CUDA kernels load, compute in fp32 registers and store). Arguments marked "fp32"
//    must be fp32: LayerNorm statistics, optimizer shards and state, gradient shards.
//    Device scalars (loss and norm accumulators) are fp64 [1] views in backend memory, so a
//    training step never waits for the device until its end.
//  - Kernels are enqueued in order on compute_stream() (the CPU backend runs them
//    synchronously on the calling thread); synchronize() waits for all of them.
//  - "writes" means the output is overwritten; "accumulates" means `out += ...`.
//    Parameter gradients always accumulate (the engine zeroes them before backward);
//    activation gradients are written unless stated otherwise.
//  - Errors: a view too small or of a dtype the kernel does not take throws fsdp::Error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/core/caching_allocator.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/memory.hpp"
#include "fsdp/core/stream.hpp"
#include "fsdp/core/tensor.hpp"

namespace fsdp {

// Elements [begin, end) of a flat shard.
struct ElementRange {
  int64_t begin = 0, end = 0;
};

// The weight decay of an optimizer update over a flat shard: `rate` on the elements inside
// `ranges` (sorted, disjoint element ranges of the shard: the parameters that take decay, as
// torch users split their param groups), 0 on the rest; null `ranges`: every element. One
// update then covers a whole FlatParameter shard, one launch instead of one per parameter.
struct WeightDecay {
  WeightDecay(float r = 0.f, const std::vector<ElementRange>* only = nullptr)  // NOLINT: implicit
      : rate(r), ranges(only) {}
  float rate;
  const std::vector<ElementRange>* ranges;
  // f(lo, hi, rate_or_0) for the pieces of [lo, hi) in order, each wholly decayed or not.
  template <class F>
  void for_each_piece(int64_t lo, int64_t hi, F&& f) const {
    if (ranges == nullptr) {
      if (lo < hi) f(lo, hi, rate);
      return;
    }
    int64_t at = lo;
    auto it = std::upper_bound(ranges->begin(), ranges->end(), lo,
                               [](int64_t i, const ElementRange& r) { return i < r.end; });
    for (; it != ranges->end() && at < hi; ++it) {
      const int64_t b = std::max(at, it->begin), e = std::min(hi, it->end);
      if (b >= e) break;  // the range starts at or after hi
      if (at < b) f(at, b, 0.f);
      f(b, e, rate);
      at = e;
    }
    if (at < hi) f(at, hi, 0.f);
  }
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  // True when memory from allocate() is ordinary host memory that any host thread may read and
  // write directly while nothing is enqueued on it (the CPU backend, pageable or page-locked);
  // a writer may then skip a host staging copy (FsdpParamGroup::init_shard does).
  virtual bool host_addressable() const { return false; }

  // ---- streams and events ----
  // The stream every operation here and every kernel (fsdp/backend/kernels.hpp) is enqueued on.
  virtual Stream& compute_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // An event that timestamps the point of compute_stream() it is recorded at, or null when
  // kernels run synchronously on the host (the CPU backend), whose clock then times them.
  virtual std::unique_ptr<TimedEvent> create_timed_event() { return nullptr; }

  // ---- memory: a stream-ordered caching allocator; every allocation is tagged ----
  // Returns 256-byte aligned uninitialised memory for use on compute_stream(); throws
  // fsdp::Error when out of memory. bytes == 0 returns nullptr.
  virtual void* allocate(std::size_t bytes, MemCategory category) = 0;
  // Returns memory to the cache; with `pending`, not reused before that event completes
  // (e.g. the Work event of a collective still reading it). Never throws.
  virtual void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                          std::shared_ptr<Event> pending = nullptr) noexcept = 0;
  // The caching allocator's reuse order (CachingAllocator::set_ordered_reuse): true, the
  // cached block of the lowest address, whatever the device's progress (train.cuda_graphs
  // sets it); false, the oldest whose work is done.
  virtual void set_ordered_reuse(bool on) = 0;
  virtual MemoryTracker& memory() = 0;                 // logical bytes by category
  virtual const AllocatorStats& allocator_stats() const = 0;  // raw allocations underneath
  // dst = 0 (all bytes of the view).
  virtual void fill_zero(const TensorView& dst) = 0;
  // dst = src, same dtype and numel (device to device).
  virtual void copy(const TensorView& dst, const TensorView& src) = 0;
  // dst = src converted elementwise (any of fp32, bf16, fp16, fp64 to any), same numel;
  // rounds to nearest even. The mixed-precision casts of the engine.
  virtual void cast(const TensorView& dst, const TensorView& src) = 0;
  // Blocking copies between host memory and the view (src.bytes() / dst.bytes() bytes).
  virtual void copy_to_host(void* host_dst, const TensorView& src) = 0;
  virtual void copy_from_host(const TensorView& dst, const void* host_src) = 0;
  // Enqueues on `stream` (this runtime's, e.g. from create_stream) a copy of src into host
  // memory at host_dst and returns; host_dst must stay valid and src unchanged until an
  // Event recorded on `stream` afterwards completes. From page-locked host memory the CUDA
  // copy overlaps the kernels of other streams (cudaMemcpyAsync); a host stream (the CPU
  // backend) copies at once.
  virtual void copy_to_host_async(void* host_dst, const TensorView& src, Stream& stream) = 0;
  // The other direction: enqueues on `stream` a copy of dst.bytes() bytes from host_src into
  // dst and returns; host_src must stay valid and unchanged, and dst unused by other streams,
  // until an Event recorded on `stream` afterwards completes (CPU offload's parameter
  // uploads ahead of their all-gather). A host stream copies at once.
  virtual void copy_from_host_async(const TensorView& dst, const void* host_src,
                                    Stream& stream) = 0;
  virtual void synchronize() = 0;

  // ---- arithmetic on flat shards (gradient accumulation, norms, clipping, loss scaling) ----
  // y[n] += alpha * x[n], n = y.numel(); x may have another float dtype than y.
  virtual void axpy(const TensorView& y, float alpha, const TensorView& x) = 0;

  // Reductions into device scalars (fp64 [1] views):
  // acc[0] += sum of x[i]^2 over x.numel() elements, summed in fp64 (deterministic order).
  virtual void squared_norm(const TensorView& acc, const TensorView& x) = 0;
  // torch.nn.utils.clip_grad_norm_'s tail: total = sum of parts[0..n) in index order,
  // norm[0] = sqrt(total) (fp64 [1]); coef[0] (fp32 [1]) = float(max_norm / (norm + 1e-6))
  // if max_norm > 0 and norm > max_norm, else 1 (so scaling by it is exact when no clipping).
  virtual void clip_coefficient(const TensorView& norm, const TensorView& coef,
                                const TensorView& parts, double max_norm) = 0;
  // x[n] *= coef[0] (coef: fp32 [1] device scalar); with coef[0] == 1 nothing is read or
  // written (x * 1 is x), so a step clipped by a coefficient of 1 costs no pass.
  virtual void scale_by(const TensorView& x, const TensorView& coef) = 0;
  // Dynamic loss scaling (torch._amp_foreach_non_finite_check_and_unscale_): x (fp32)
  // *= inv_scale; found_inf[0] (fp64 [1]) = 1 if any element of x was inf or NaN (left
  // unchanged otherwise).
  virtual void unscale_and_check(const TensorView& x, float inv_scale,
                                 const TensorView& found_inf) = 0;

  // ---- optimizers, on fp32 flat shards (n = param.numel()) ----
  // AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW semantics): step is 1-based.
  // p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps).
  // weight_decay: its rate where it applies (WeightDecay; a float: everywhere). Throws
  // fsdp::Error if its ranges are not sorted, disjoint and inside [0, n).
  // compute_copy (optional; an empty view, the default, is none): a bf16 or fp16 [n] view
  // that the same pass writes with the updated param, rounded to nearest even: the bits
  // cast(compute_copy, param) would write after the update, without its second pass over
  // the shard (CPU offload's param_dtype copy of the host shard, fsdp/optim/optimizer.hpp).
  // grad_scale (optional; an empty view is none): an fp32 [1] scalar in this runtime's memory
  // that each gradient element is multiplied by as it is read, grad itself left as it is:
  // what scale_by(grad, grad_scale) followed by the unscaled update makes, bit for bit (g * s
  // rounded to fp32 either way; s == 1 is exact), without scale_by's pass over the shard (the
  // clip coefficient: torch.nn.utils.clip_grad_norm_'s g *= coef folded into the step, as
  // DeepSpeed's cpu_adam folds its combined scale; fsdp/fsdp/grad_clip.hpp).
  virtual void adamw_update(const TensorView& param, const TensorView& grad,
                            const TensorView& exp_avg, const TensorView& exp_avg_sq, float lr,
                            float beta1, float beta2, float eps, const WeightDecay& weight_decay,
                            int64_t step, const TensorView& compute_copy = {},
                            const TensorView& grad_scale = {}) = 0;
  // SGD with momentum, torch.optim.SGD semantics (dampening 0, nesterov off, coupled wd):
  // g += wd * p; buf = momentum * buf + g (buf = g at step 1); p -= lr * buf.
  // compute_copy, grad_scale: as adamw_update's.
  virtual void sgd_update(const TensorView& param, const TensorView& grad,
                          const TensorView& momentum_buf, float lr, float momentum,
                          const WeightDecay& weight_decay, int64_t step,
                          const TensorView& compute_copy = {},
                          const TensorView& grad_scale = {}) = 0;
};

}  // namespace fsdp
