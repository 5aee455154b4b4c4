// CPU offload's stream ordering, checked on the CPU backend (issue 22: the CUDA path overlaps
// its copies with compute, and no GPU has run it yet). The CPU backend's streams run
// everything at once, so an engine that left out a wait between two streams would still pass
// every other CPU test. Here the engine runs on DeferredCopyRuntime, the CPU backend under one
// of three adversarial schedules, each a legal order of a GPU's streams:
//  - side streams late (Schedule::side_late): an asynchronous copy enqueued on a side stream
//    (the engine's copy and reduction streams) happens only when an event recorded after it
//    is waited on or synchronized, or its stream synchronized, as a GPU's copy engine may
//    finish long after the host has moved on; the compute stream runs at once. A host read
//    (or a compute-stream read) that did not wait for a copy then reads stale memory.
//  - compute late (Schedule::compute_late, issue 31 item 1): the other way round. Every
//    compute-stream operation (the model's kernels through DeferredKernels, the engine's and
//    optimizer's device arithmetic) waits in a queue until something needs it done (an event
//    after it synchronized or waited on by another stream, a blocking copy, a synchronize, a
//    collective ordered after the stream), while side-stream copies run at once, as a copy
//    engine may run ahead of a busy compute stream. A copy that did not wait for the compute
//    work before it (filling a block that a queued kernel still reads, or reading a gradient
//    a queued kernel has not yet written) then changes the losses.
//  - shuffled (Schedule::shuffled, 32 seeds): both kinds of stream queued, and after each
//    enqueue a random part of a random stream's queue runs: random interleavings between
//    the two extremes, which catch both kinds of missing wait.
//
// A stream's wait on an event orders only that stream (cudaStreamWaitEvent): a marker in its
// queue runs the event's stream as far as the event covered when wait() was called, and
// neither the host nor other streams are held. So a wait placed on the wrong stream fails
// here too (tried: the compute stream's wait for an unshard's upload moved onto the copy
// stream fails side_late and shuffled; when wait() synchronized the event at once, it passed).
//
// Every operand is also checked against the side that allocated it (MemoryMap): a device
// operation on a host shard, or a host one on a device buffer, throws.
//
// GPT-2 in bf16 with AdamW and clipping, offloaded on the deferred runtime (fsdp.cpu_offload,
// and fsdp.offload_optimizer's resident device shards), must equal the same run without
// offload bit for bit under every schedule: one micro-batch a step (the gradient staged in
// reduce_dtype) and several (the device accumulator, staged once at the boundary), for 3
// steps, reduce_dtype bf16 and fp32; alone, and at 2 ranks sharded (all-gather after the
// upload, reduce-scatter) or replicated (all-reduce). MPI collectives run on the host at
// once, so there the communicator first runs what the stream it is ordered after holds, as
// NCCL's stream would wait for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <mpi.h>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/caching_allocator.hpp"
#include "fsdp/core/stream.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/fsdp/grad_clip.hpp"
#include "fsdp/model/gpt2.hpp"
#include "fsdp/optim/optimizer.hpp"

namespace {

using fsdp::DType;
using fsdp::Event;
using fsdp::Stream;
using fsdp::TensorView;

class DeferredStream;

// The device side's deferred streams. Under Schedule::shuffled, after each enqueue some queued
// operations of a random stream run (a random legal interleaving of the streams). One lock for
// all of them: the offloaded host step's thread may enqueue too.
class StreamGroup {
 public:
  explicit StreamGroup(bool shuffled, unsigned seed) : shuffled_(shuffled), rng_(seed) {}
  std::recursive_mutex& mutex() { return mutex_; }
  void add(DeferredStream* s) {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    streams_.push_back(s);
  }
  void remove(DeferredStream* s) {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    streams_.erase(std::find(streams_.begin(), streams_.end(), s));
  }
  void after_enqueue();
  // Operations queued on every stream but `except` and not yet run.
  int64_t pending_except(const DeferredStream* except);

 private:
  const bool shuffled_;
  std::mt19937 rng_;
  std::recursive_mutex mutex_;
  std::vector<DeferredStream*> streams_;
};

// A stream whose operations wait in a queue until something needs them done, or (eager) run
// as they are enqueued. Destroyed, it runs what it holds (as cudaStreamDestroy lets the work
// finish).
class DeferredStream final : public Stream {
 public:
  explicit DeferredStream(StreamGroup& group, bool eager = false) : group_(group), eager_(eager) {
    group_.add(this);
  }
  ~DeferredStream() override {
    synchronize();
    group_.remove(this);
  }
  fsdp::Device device() const override { return fsdp::Device::cpu; }
  // cudaStreamWaitEvent: this stream's later operations wait for what `event` covered when
  // wait() was called (a marker in the queue runs the event's stream that far); other streams
  // and the host are not held. Defined below DeferredEvent.
  void wait(Event& event) override;
  void synchronize() override { run_until(enqueued()); }
  void enqueue(std::function<void()> op) {
    const std::lock_guard<std::recursive_mutex> lock(group_.mutex());
    queue_.push_back(std::move(op));
    ++enqueued_;
    if (eager_) run_until(enqueued_);
    group_.after_enqueue();
  }
  void run_until(int64_t position) {
    const std::lock_guard<std::recursive_mutex> lock(group_.mutex());
    while (done_ < position) {
      std::function<void()> op = std::move(queue_.front());
      queue_.pop_front();
      ++done_;
      op();
    }
  }
  int64_t enqueued() const {
    const std::lock_guard<std::recursive_mutex> lock(group_.mutex());
    return enqueued_;
  }
  int64_t done() const {
    const std::lock_guard<std::recursive_mutex> lock(group_.mutex());
    return done_;
  }
  // Expires when the stream is destroyed (an event recorded on it is then complete).
  std::weak_ptr<int> alive() const { return alive_; }

 private:
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  StreamGroup& group_;
  const bool eager_;
  std::deque<std::function<void()>> queue_;
  int64_t enqueued_ = 0, done_ = 0;
};

int64_t StreamGroup::pending_except(const DeferredStream* except) {
  const std::lock_guard<std::recursive_mutex> lock(mutex_);
  int64_t n = 0;
  for (const DeferredStream* s : streams_) {
    if (s != except) n += s->enqueued() - s->done();
  }
  return n;
}

void StreamGroup::after_enqueue() {
  if (!shuffled_ || streams_.empty()) return;
  // Half the time nothing; else 1 .. all of a random stream's queued operations.
  if (std::uniform_int_distribution<int>(0, 1)(rng_) == 0) return;
  std::uniform_int_distribution<std::size_t> pick(0, streams_.size() - 1);
  DeferredStream* s = streams_[pick(rng_)];
  const int64_t pending = s->enqueued() - s->done();
  if (pending == 0) return;
  s->run_until(s->done() + std::uniform_int_distribution<int64_t>(1, pending)(rng_));
}

// Complete once its stream has run what was enqueued before record(); on any other stream
// (a stream that runs everything at once) complete at once.
class DeferredEvent final : public Event {
 public:
  void record(Stream& stream) override {
    auto* s = dynamic_cast<DeferredStream*>(&stream);
    stream_ = s;
    alive_ = s ? s->alive() : std::weak_ptr<int>();
    position_ = s ? s->enqueued() : 0;
  }
  // A stream destroyed since record() ran all its work (the caching allocator may hold an
  // event past the end of the run).
  void synchronize() override {
    if (stream_ && !alive_.expired()) stream_->run_until(position_);
  }
  bool query() override { return !stream_ || alive_.expired() || stream_->done() >= position_; }
  // What synchronize() would run, as of now (a later record() does not change it).
  std::function<void()> completion() const {
    return [s = stream_, alive = alive_, pos = position_] {
      if (s && !alive.expired()) s->run_until(pos);
    };
  }

 private:
  DeferredStream* stream_ = nullptr;
  std::weak_ptr<int> alive_;
  int64_t position_ = 0;
};

void DeferredStream::wait(Event& event) {
  auto* deferred = dynamic_cast<DeferredEvent*>(&event);
  if (deferred == nullptr) return event.synchronize();  // another runtime's: done now
  enqueue(deferred->completion());  // an eager stream runs it at once
}

// Which runtime allocated each live buffer of an offloaded run: the device's (the engine's
// backend) or the host's (the offload runtime). On the CPU backend both are host memory, so
// a device operation on a host shard (or a host operation on a device buffer) would compute
// the right numbers here and fault or read garbage on a GPU; the runtimes below check every
// argument against this map and throw instead. Thread-safe (the host step runs on a thread).
enum class Side { device, host };
class MemoryMap {
 public:
  void add(const void* p, std::size_t bytes, Side side) {
    const std::lock_guard<std::mutex> lock(mutex_);
    live_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, side};
  }
  void remove(const void* p) {
    const std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  // Throws if `p` lies in a live buffer of the other side than `side`.
  void expect(const void* p, Side side, const char* op) const {
    if (p == nullptr) return;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return;
    --it;
    if (a < it->first + it->second.first && it->second.second != side) {
      throw fsdp::Error(std::string("offload: ") + op + " reads or writes " +
                        (side == Side::device ? "host" : "device") + " memory on the " +
                        (side == Side::device ? "device" : "host") + " runtime");
    }
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::pair<std::size_t, Side>> live_;
};

enum class Schedule { side_late, compute_late, shuffled };

// The CPU backend `inner` as one side of an offloaded run: its allocations recorded in `map`
// and every operand checked against it (MemoryMap). On the device side, `schedule` orders its
// streams: side_late defers the asynchronous copies on side streams; compute_late defers
// every compute-stream operation instead and runs side-stream copies at once; shuffled
// defers both and runs a random part of a random stream's queue after each enqueue (`seed`).
// The host side runs everything at once.
class DeferredCopyRuntime final : public fsdp::DeviceRuntime {
 public:
  DeferredCopyRuntime(fsdp::DeviceRuntime& inner, MemoryMap& map, Side side,
                      Schedule schedule = Schedule::side_late, unsigned seed = 0)
      : in_(inner), map_(map), side_(side),
        late_compute_(side == Side::device && schedule != Schedule::side_late),
        eager_side_(schedule == Schedule::compute_late),
        group_(side == Side::device && schedule == Schedule::shuffled, seed),
        compute_(group_),
        alloc_([](std::size_t n) { return std::aligned_alloc(256, (n + 255) / 256 * 256); },
               [](void* p) { std::free(p); }, memory_) {}
  ~DeferredCopyRuntime() override { compute_.synchronize(); }
  int64_t deferred_copies = 0;  // how many side-stream copies were queued (side_late, shuffled)
  // Side-stream operations (the copy and reduction streams') queued and not yet run.
  int64_t pending_side_ops() { return group_.pending_except(&compute_); }
  int64_t deferred_ops = 0;     // how many compute-stream operations (compute_late, shuffled)
  // Elements written by whole-buffer passes (more than one element: not the scalars):
  // fill_zero, axpy, casts into fp32 (on the host: a gradient shard's first copy) and into
  // 16 bits (a separate pass making the param_dtype copy the uploads read), squared_norm (the
  // clip's read of a shard) and scale_by (a clip that scales the shards).
  int64_t fill_elements = 0, axpy_elements = 0, cast_f32_elements = 0, norm_elements = 0;
  int64_t scale_elements = 0, cast_16_elements = 0;

  // Runs `op` on the compute stream: queued (compute_late) or at once.
  void later(std::function<void()> op) {
    if (!late_compute_) return op();
    ++deferred_ops;
    compute_.enqueue(std::move(op));
  }
  // Runs what the compute stream holds (before a blocking operation).
  void flush() { compute_.synchronize(); }

  fsdp::Device device() const override { return in_.device(); }
  Stream& compute_stream() override {
    return late_compute_ ? static_cast<Stream&>(compute_) : in_.compute_stream();
  }
  std::unique_ptr<Stream> create_stream() override {
    return std::make_unique<DeferredStream>(group_, eager_side_);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<DeferredEvent>(); }
  // The device side allocates as the CUDA backend does: a stream-ordered caching allocator
  // whose reuse of a block with pending work makes the compute stream wait (a marker in its
  // queue when it is deferred), never the host; and a block comes with garbage, written in
  // the compute stream's order (all bytes 0xff: NaN in every float type), so a read before
  // the first write, or a side-stream write not ordered after the allocation, shows in the
  // losses. The host side is the CPU backend's.
  void* allocate(std::size_t bytes, fsdp::MemCategory category) override {
    if (side_ == Side::host) {
      void* p = in_.allocate(bytes, category);
      map_.add(p, bytes, side_);
      return p;
    }
    void* p = alloc_.allocate(bytes, category, compute_stream());
    map_.add(p, bytes, side_);
    later([p, bytes] { std::memset(p, 0xff, bytes); });
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes, fsdp::MemCategory category,
                  std::shared_ptr<Event> pending) noexcept override {
    map_.remove(ptr);
    if (side_ == Side::host) return in_.deallocate(ptr, bytes, category, std::move(pending));
    alloc_.deallocate(ptr, bytes, category, std::move(pending));
  }
  fsdp::MemoryTracker& memory() override {
    return side_ == Side::host ? in_.memory() : memory_;
  }
  const fsdp::AllocatorStats& allocator_stats() const override {
    return side_ == Side::host ? in_.allocator_stats() : alloc_.stats();
  }
  void set_ordered_reuse(bool on) override { alloc_.set_ordered_reuse(on); }
  void fill_zero(const TensorView& dst) override {
    mine(dst, "fill_zero");
    if (dst.numel() > 1) fill_elements += dst.numel();
    later([=, this] { in_.fill_zero(dst); });
  }
  void copy(const TensorView& dst, const TensorView& src) override {
    mine(dst, "copy");
    mine(src, "copy");
    later([=, this] { in_.copy(dst, src); });
  }
  void cast(const TensorView& dst, const TensorView& src) override {
    mine(dst, "cast");
    mine(src, "cast");
    if (dst.dtype == DType::f32) cast_f32_elements += dst.numel();
    if (fsdp::dtype_size(dst.dtype) == 2 && dst.numel() > 1) cast_16_elements += dst.numel();
    later([=, this] { in_.cast(dst, src); });
  }
  // Blocking copies: after everything enqueued on the compute stream (cudaMemcpyAsync on it,
  // then a stream synchronize).
  void copy_to_host(void* host_dst, const TensorView& src) override {
    flush();
    in_.copy_to_host(host(host_dst, "copy_to_host"), mine(src, "copy_to_host"));
  }
  void copy_from_host(const TensorView& dst, const void* host_src) override {
    flush();
    in_.copy_from_host(mine(dst, "copy_from_host"), host(host_src, "copy_from_host"));
  }
  void copy_to_host_async(void* host_dst, const TensorView& src, Stream& stream) override {
    host(host_dst, "copy_to_host_async");
    mine(src, "copy_to_host_async");
    defer(stream, [this, host_dst, src] { in_.copy_to_host(host_dst, src); });
  }
  void copy_from_host_async(const TensorView& dst, const void* host_src, Stream& stream) override {
    mine(dst, "copy_from_host_async");
    host(host_src, "copy_from_host_async");
    defer(stream, [this, dst, host_src] { in_.copy_from_host(dst, host_src); });
  }
  void synchronize() override {
    flush();
    in_.synchronize();
  }
  void axpy(const TensorView& y, float alpha, const TensorView& x) override {
    mine(y, "axpy");
    mine(x, "axpy");
    if (y.numel() > 1) axpy_elements += y.numel();
    later([=, this] { in_.axpy(y, alpha, x); });
  }
  void squared_norm(const TensorView& acc, const TensorView& x) override {
    mine(acc, "squared_norm");
    mine(x, "squared_norm");
    if (x.numel() > 1) norm_elements += x.numel();
    later([=, this] { in_.squared_norm(acc, x); });
  }
  void clip_coefficient(const TensorView& norm, const TensorView& coef, const TensorView& parts,
                        double max_norm) override {
    mine(norm, "clip_coefficient");
    mine(coef, "clip_coefficient");
    mine(parts, "clip_coefficient");
    later([=, this] { in_.clip_coefficient(norm, coef, parts, max_norm); });
  }
  void scale_by(const TensorView& x, const TensorView& coef) override {
    mine(x, "scale_by");
    mine(coef, "scale_by");
    if (x.numel() > 1) scale_elements += x.numel();
    later([=, this] { in_.scale_by(x, coef); });
  }
  void unscale_and_check(const TensorView& x, float inv_scale, const TensorView& found) override {
    mine(x, "unscale_and_check");
    mine(found, "unscale_and_check");
    later([=, this] { in_.unscale_and_check(x, inv_scale, found); });
  }
  void adamw_update(const TensorView& p, const TensorView& g, const TensorView& m,
                    const TensorView& v, float lr, float b1, float b2, float eps,
                    const fsdp::WeightDecay& wd, int64_t step, const TensorView& copy,
                    const TensorView& scale) override {
    for (const TensorView* t : {&p, &g, &m, &v, &copy, &scale}) mine(*t, "adamw");
    flush();  // WeightDecay points at the caller's ranges: not kept for later
    in_.adamw_update(p, g, m, v, lr, b1, b2, eps, wd, step, copy, scale);
  }
  void sgd_update(const TensorView& p, const TensorView& g, const TensorView& buf, float lr,
                  float momentum, const fsdp::WeightDecay& wd, int64_t step,
                  const TensorView& copy, const TensorView& scale) override {
    for (const TensorView* t : {&p, &g, &buf, &copy, &scale}) mine(*t, "sgd");
    flush();
    in_.sgd_update(p, g, buf, lr, momentum, wd, step, copy, scale);
  }

 private:
  const TensorView& mine(const TensorView& v, const char* op) const {
    map_.expect(v.data, side_, op);
    return v;
  }
  const void* host(const void* p, const char* op) const {
    map_.expect(p, Side::host, op);
    return p;
  }
  void* host(void* p, const char* op) const {
    map_.expect(p, Side::host, op);
    return p;
  }
  // An asynchronous copy on `stream`: on the compute stream in its order; on a side stream
  // queued (side_late) or at once (compute_late: the side streams are eager).
  void defer(Stream& stream, std::function<void()> op) {
    if (&stream == &compute_stream()) return later(std::move(op));
    auto* s = dynamic_cast<DeferredStream*>(&stream);
    if (s == nullptr) return op();
    if (!eager_side_) ++deferred_copies;
    s->enqueue(std::move(op));
  }
  fsdp::DeviceRuntime& in_;
  MemoryMap& map_;
  Side side_;
  const bool late_compute_, eager_side_;
  StreamGroup group_;
  DeferredStream compute_;  // used when late_compute_
  fsdp::MemoryTracker memory_;     // the device side's (allocate)
  fsdp::CachingAllocator alloc_;
};

// The model's kernels on `rt`'s compute stream (queued under Schedule::compute_late); the
// CPU backend `inner` computes them.
class DeferredKernels final : public fsdp::Kernels {
 public:
  DeferredKernels(fsdp::Kernels& inner, DeferredCopyRuntime& rt) : in_(inner), rt_(rt) {}
  fsdp::DeviceRuntime& runtime() override { return rt_; }
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const TensorView& A, const TensorView& B, float beta, const TensorView& C) override {
    later([=, this] { in_.gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C); });
  }
  void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) override {
    later([=, this] { in_.add_bias(out, bias, R, C); });
  }
  void bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                     int64_t C) override {
    later([=, this] { in_.bias_backward(dbias, dout, R, C); });
  }
  void add(const TensorView& out, const TensorView& a, const TensorView& b) override {
    later([=, this] { in_.add(out, a, b); });
  }
  void scale(const TensorView& x, float alpha) override {
    later([=, this] { in_.scale(x, alpha); });
  }
  void embedding_forward(const TensorView& out, const TensorView& tokens, const TensorView& wte,
                         const TensorView& wpe, int64_t B, int64_t T, int64_t C) override {
    later([=, this] { in_.embedding_forward(out, tokens, wte, wpe, B, T, C); });
  }
  void embedding_backward(const TensorView& dwte, const TensorView& dwpe, const TensorView& dout,
                          const TensorView& tokens, int64_t B, int64_t T, int64_t C) override {
    later([=, this] { in_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C); });
  }
  void layernorm_forward(const TensorView& out, const TensorView& mean, const TensorView& rstd,
                         const TensorView& x, const TensorView& weight, const TensorView& bias,
                         int64_t R, int64_t C, float eps) override {
    later([=, this] { in_.layernorm_forward(out, mean, rstd, x, weight, bias, R, C, eps); });
  }
  void layernorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dbias,
                          const TensorView& dout, const TensorView& x, const TensorView& weight,
                          const TensorView& mean, const TensorView& rstd, int64_t R,
                          int64_t C) override {
    later([=, this] {
      in_.layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, R, C);
    });
  }
  void add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                         const TensorView& residual, int64_t R, int64_t C) override {
    later([=, this] { in_.add_bias_residual(h, proj_bias, residual, R, C); });
  }
  void add_layernorm_forward(const TensorView& h, const TensorView& out, const TensorView& mean,
                             const TensorView& rstd, const TensorView& residual,
                             const TensorView& proj_bias, const TensorView& weight,
                             const TensorView& bias, int64_t R, int64_t C, float eps) override {
    later([=, this] {
      in_.add_layernorm_forward(h, out, mean, rstd, residual, proj_bias, weight, bias, R, C, eps);
    });
  }
  void add_rmsnorm_forward(const TensorView& h, const TensorView& out, const TensorView& rstd,
                           const TensorView& residual, const TensorView& proj_bias,
                           const TensorView& weight, int64_t R, int64_t C, float eps) override {
    later([=, this] {
      in_.add_rmsnorm_forward(h, out, rstd, residual, proj_bias, weight, R, C, eps);
    });
  }
  void gelu_forward(const TensorView& out, const TensorView& x) override {
    later([=, this] { in_.gelu_forward(out, x); });
  }
  void gelu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) override {
    later([=, this] { in_.gelu_backward(dx, x, dout); });
  }
  void bias_gelu_forward(const TensorView& out, const TensorView& fc, const TensorView& bias,
                         int64_t R, int64_t C) override {
    later([=, this] { in_.bias_gelu_forward(out, fc, bias, R, C); });
  }
  void gelu_bias_backward(const TensorView& dfc, const TensorView& dbias, const TensorView& fc,
                          const TensorView& dout, int64_t R, int64_t C) override {
    later([=, this] { in_.gelu_bias_backward(dfc, dbias, fc, dout, R, C); });
  }
  void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& qkv,
                         int64_t B, int64_t T, int64_t C, int64_t H,
                         const TensorView& doc_start) override {
    later([=, this] { in_.attention_forward(out, lse, qkv, B, T, C, H, doc_start); });
  }
  void attention_backward(const TensorView& dqkv, const TensorView& dout, const TensorView& qkv,
                          const TensorView& out, const TensorView& lse, int64_t B, int64_t T,
                          int64_t C, int64_t H, const TensorView& doc_start) override {
    later([=, this] { in_.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, H, doc_start); });
  }
  void cross_entropy_forward_backward(const TensorView& loss, const TensorView& logits,
                                      const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                                      float grad_scale, float softcap) override {
    later([=, this] {
      in_.cross_entropy_forward_backward(loss, logits, targets, R, V, ld, grad_scale, softcap);
    });
  }
  void cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                             const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                             float softcap) override {
    later([=, this] { in_.cross_entropy_forward(loss, logits, targets, R, V, ld, softcap); });
  }
  void embedding_lookup_forward(const TensorView& out, const TensorView& tokens,
                                const TensorView& table, int64_t N, int64_t C) override {
    later([=, this] { in_.embedding_lookup_forward(out, tokens, table, N, C); });
  }
  void embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                 const TensorView& tokens, int64_t N, int64_t C) override {
    later([=, this] { in_.embedding_lookup_backward(dtable, dout, tokens, N, C); });
  }
  void rmsnorm_forward(const TensorView& out, const TensorView& rstd, const TensorView& x,
                       const TensorView& weight, int64_t R, int64_t C, float eps) override {
    later([=, this] { in_.rmsnorm_forward(out, rstd, x, weight, R, C, eps); });
  }
  void rmsnorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dout,
                        const TensorView& x, const TensorView& weight, const TensorView& rstd,
                        int64_t R, int64_t C) override {
    later([=, this] { in_.rmsnorm_backward(dx, dweight, dout, x, weight, rstd, R, C); });
  }
  void relu_forward(const TensorView& out, const TensorView& x) override {
    later([=, this] { in_.relu_forward(out, x); });
  }
  void relu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) override {
    later([=, this] { in_.relu_backward(dx, x, dout); });
  }
  void mul(const TensorView& out, const TensorView& a, const TensorView& b) override {
    later([=, this] { in_.mul(out, a, b); });
  }
  void geglu_forward(const TensorView& out, const TensorView& gate, const TensorView& up) override {
    later([=, this] { in_.geglu_forward(out, gate, up); });
  }
  void geglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dout,
                      const TensorView& gate, const TensorView& up) override {
    later([=, this] { in_.geglu_backward(dgate, dup, dout, gate, up); });
  }
  void position_bias_forward(const TensorView& bias, const TensorView& table,
                             const TensorView& buckets, int64_t H, int64_t Tq,
                             int64_t Tk) override {
    later([=, this] { in_.position_bias_forward(bias, table, buckets, H, Tq, Tk); });
  }
  void position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                              const TensorView& buckets, int64_t H, int64_t Tq,
                              int64_t Tk) override {
    later([=, this] { in_.position_bias_backward(dtable, dbias, buckets, H, Tq, Tk); });
  }
  void mha_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& bias,
                   const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                   int64_t D, float scale, bool causal) override {
    later([=, this] {
      in_.mha_forward(out, lse, q, k, v, bias, key_mask, B, Tq, Tk, H, D, scale, causal);
    });
  }
  void mha_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dbias, const TensorView& dout, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& lse, const TensorView& bias, const TensorView& key_mask,
                    int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                    bool causal) override {
    later([=, this] {
      in_.mha_backward(dq, dk, dv, dbias, dout, q, k, v, out, lse, bias, key_mask, B, Tq, Tk, H, D,
                       scale, causal);
    });
  }
  void rope_forward(const TensorView& out, const TensorView& x, const TensorView& cos,
                    const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                    int64_t R) override {
    later([=, this] { in_.rope_forward(out, x, cos, sin, B, T, H, D, R); });
  }
  void rope_backward(const TensorView& dx, const TensorView& dout, const TensorView& cos,
                     const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t R) override {
    later([=, this] { in_.rope_backward(dx, dout, cos, sin, B, T, H, D, R); });
  }
  void swiglu_forward(const TensorView& out, const TensorView& gate,
                      const TensorView& up) override {
    later([=, this] { in_.swiglu_forward(out, gate, up); });
  }
  void swiglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dout,
                       const TensorView& gate, const TensorView& up) override {
    later([=, this] { in_.swiglu_backward(dgate, dup, dout, gate, up); });
  }
  void gqa_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                             const TensorView& k, const TensorView& v, int64_t B, int64_t T,
                             int64_t H, int64_t Hkv, int64_t D, float scale, int64_t window,
                             float softcap, const TensorView& doc_start) override {
    later([=, this] {
      in_.gqa_attention_forward(out, lse, q, k, v, B, T, H, Hkv, D, scale, window, softcap,
                                doc_start);
    });
  }
  void gqa_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                              int64_t window, float softcap,
                              const TensorView& doc_start) override {
    later([=, this] {
      in_.gqa_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D, scale,
                                 window, softcap, doc_start);
    });
  }
  void moe_router_forward(const TensorView& idx, const TensorView& weights,
                          const TensorView& logits, int64_t R, int64_t E, int64_t K,
                          bool normalize) override {
    later([=, this] { in_.moe_router_forward(idx, weights, logits, R, E, K, normalize); });
  }
  void moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                           const TensorView& logits, const TensorView& idx, int64_t R, int64_t E,
                           int64_t K, bool normalize) override {
    later([=, this] {
      in_.moe_router_backward(dlogits, dweights, logits, idx, R, E, K, normalize);
    });
  }
  void strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                    const Strided& src_at, int64_t R, int64_t G, int64_t W,
                    bool accumulate) override {
    later([=, this] { in_.strided_copy(dst, dst_at, src, src_at, R, G, W, accumulate); });
  }
  void causal_conv1d_forward(const TensorView& out, const TensorView& x, const TensorView& weight,
                             int64_t B, int64_t T, int64_t C, int64_t K,
                             const TensorView& doc_start) override {
    later([=, this] { in_.causal_conv1d_forward(out, x, weight, B, T, C, K, doc_start); });
  }
  void causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                              const TensorView& dout, const TensorView& x,
                              const TensorView& weight, int64_t B, int64_t T, int64_t C,
                              int64_t K, const TensorView& doc_start) override {
    later([=, this] {
      in_.causal_conv1d_backward(dx, dweight, dout, x, weight, B, T, C, K, doc_start);
    });
  }
  void gated_delta_rule_forward(const TensorView& out, const TensorView& qkv, const TensorView& a,
                                const TensorView& b, const TensorView& A_log,
                                const TensorView& dt_bias, int64_t B, int64_t T, int64_t Hk,
                                int64_t Hv, int64_t Dk, int64_t Dv,
                                const TensorView& doc_start) override {
    later([=, this] {
      in_.gated_delta_rule_forward(out, qkv, a, b, A_log, dt_bias, B, T, Hk, Hv, Dk, Dv,
                                   doc_start);
    });
  }
  void gated_delta_rule_backward(const TensorView& dqkv, const TensorView& da,
                                 const TensorView& db, const TensorView& dA_log,
                                 const TensorView& ddt_bias, const TensorView& dout,
                                 const TensorView& qkv, const TensorView& a, const TensorView& b,
                                 const TensorView& A_log, const TensorView& dt_bias, int64_t B,
                                 int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                 const TensorView& doc_start) override {
    later([=, this] {
      in_.gated_delta_rule_backward(dqkv, da, db, dA_log, ddt_bias, dout, qkv, a, b, A_log,
                                    dt_bias, B, T, Hk, Hv, Dk, Dv, doc_start);
    });
  }
  void sigmoid_gate_forward(const TensorView& out, const TensorView& x,
                            const TensorView& gate) override {
    later([=, this] { in_.sigmoid_gate_forward(out, x, gate); });
  }
  void sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate, const TensorView& dout,
                             const TensorView& x, const TensorView& gate) override {
    later([=, this] { in_.sigmoid_gate_backward(dx, dgate, dout, x, gate); });
  }
  void clamped_swiglu_forward(const TensorView& out, const TensorView& gate_up, float alpha,
                              float limit) override {
    later([=, this] { in_.clamped_swiglu_forward(out, gate_up, alpha, limit); });
  }
  void clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                               const TensorView& gate_up, float alpha, float limit) override {
    later([=, this] { in_.clamped_swiglu_backward(dgate_up, dout, gate_up, alpha, limit); });
  }
  void attention_sink_forward(const TensorView& out, const TensorView& lse,
                              const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                              int64_t D) override {
    later([=, this] { in_.attention_sink_forward(out, lse, sinks, B, T, H, D); });
  }
  void attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                               const TensorView& out, const TensorView& lse,
                               const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                               int64_t D) override {
    later([=, this] { in_.attention_sink_backward(dsinks, dout, out, lse, sinks, B, T, H, D); });
  }
  void moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                  const TensorView& logits, const TensorView& bias, int64_t R,
                                  int64_t E, int64_t K, const SigmoidRouting& g) override {
    later([=, this] { in_.moe_sigmoid_router_forward(idx, weights, logits, bias, R, E, K, g); });
  }
  void moe_sigmoid_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                   const TensorView& logits, const TensorView& idx, int64_t R,
                                   int64_t E, int64_t K, const SigmoidRouting& g) override {
    later([=, this] {
      in_.moe_sigmoid_router_backward(dlogits, dweights, logits, idx, R, E, K, g);
    });
  }
  void moe_combine_forward(const TensorView& out, const TensorView& rows,
                           const TensorView& weights, const TensorView& slot, int64_t R, int64_t K,
                           int64_t C) override {
    later([=, this] { in_.moe_combine_forward(out, rows, weights, slot, R, K, C); });
  }
  void moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                            const TensorView& dout, const TensorView& rows,
                            const TensorView& weights, const TensorView& slot, int64_t R,
                            int64_t K, int64_t C) override {
    later([=, this] {
      in_.moe_combine_backward(drows, dweights, dout, rows, weights, slot, R, K, C);
    });
  }
  void moe_router_prob_sums(const TensorView& psum, const TensorView& logits, int64_t R,
                            int64_t E) override {
    later([=, this] { in_.moe_router_prob_sums(psum, logits, R, E); });
  }
  void moe_aux_loss(const TensorView& loss, const TensorView& counts, const TensorView& psum,
                    int64_t E, double alpha) override {
    later([=, this] { in_.moe_aux_loss(loss, counts, psum, E, alpha); });
  }
  void moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                             const TensorView& dprobs, int64_t R, int64_t E) override {
    later([=, this] { in_.moe_aux_loss_backward(dlogits, logits, dprobs, R, E); });
  }
  void moe_shared_gate_forward(const TensorView& out, const TensorView& shared,
                               const TensorView& logit, int64_t R, int64_t C) override {
    later([=, this] { in_.moe_shared_gate_forward(out, shared, logit, R, C); });
  }
  void moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                const TensorView& dout, const TensorView& shared,
                                const TensorView& logit, int64_t R, int64_t C) override {
    later([=, this] { in_.moe_shared_gate_backward(dshared, dlogit, dout, shared, logit, R, C); });
  }

 private:
  void later(std::function<void()> op) {
    rt_.later(std::move(op));
  }
  fsdp::Kernels& in_;
  DeferredCopyRuntime& rt_;
};

// This rank alone: every collective is a copy (or nothing).
class SoloCommunicator final : public fsdp::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  fsdp::Device device() const override { return fsdp::Device::cpu; }
  Stream& default_stream() override { return stream_; }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  std::unique_ptr<Communicator> split_node() override { return nullptr; }

 protected:
  class Done final : public fsdp::Work {
   public:
    void wait() override {}
    std::shared_ptr<Event> done() override { return std::make_shared<fsdp::HostEvent>(); }
  };
  // After what the stream it is ordered after holds (a queued compute stream), at once.
  static std::unique_ptr<fsdp::Work> copied(void* recv, const void* send, std::size_t bytes,
                                            Stream& after) {
    after.synchronize();
    if (recv != send && bytes > 0) std::memmove(recv, send, bytes);
    return std::make_unique<Done>();
  }
  // Every collective of a group of one is Communicator's trivial case, which reaches only
  // local_impl (the *_impl below are never called): ordered after `after`, as NCCL's copy on
  // its stream would be. (The base class's copies at once: a gather from a device shard whose
  // update or target's allocation fill still waits in a deferred compute queue would then
  // read or be overwritten out of order.)
  std::unique_ptr<fsdp::Work> local_impl(const char*, const void* send, void* recv,
                                         std::size_t n, DType t, Stream& after) override {
    return copied(recv, send, n * fsdp::dtype_size(t), after);
  }
  std::unique_ptr<fsdp::Work> all_gather_impl(const void* send, void* recv, std::size_t n,
                                              DType t, Stream& after) override {
    return copied(recv, send, n * fsdp::dtype_size(t), after);
  }
  std::unique_ptr<fsdp::Work> reduce_scatter_impl(const void* send, void* recv, std::size_t n,
                                                  DType t, fsdp::ReduceOp,
                                                  Stream& after) override {
    return copied(recv, send, n * fsdp::dtype_size(t), after);
  }
  std::unique_ptr<fsdp::Work> all_reduce_impl(const void* send, void* recv, std::size_t n,
                                              DType t, fsdp::ReduceOp, Stream& after) override {
    return copied(recv, send, n * fsdp::dtype_size(t), after);
  }
  std::unique_ptr<fsdp::Work> broadcast_impl(void*, std::size_t, DType, int,
                                             Stream& after) override {
    after.synchronize();
    return std::make_unique<Done>();
  }

 private:
  fsdp::HostStream stream_;
};

// A host communicator whose collectives start once the stream they are ordered after has run
// its queue (on a GPU the collective's stream waits for that one).
class StreamOrdered final : public fsdp::Communicator {
 public:
  explicit StreamOrdered(fsdp::Communicator& inner) : in_(inner) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  fsdp::Device device() const override { return in_.device(); }
  Stream& default_stream() override { return in_.default_stream(); }
  void barrier() override { in_.barrier(); }
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  std::unique_ptr<Communicator> split_node() override { return nullptr; }

 protected:
  std::unique_ptr<fsdp::Work> all_gather_impl(const void* send, void* recv, std::size_t n,
                                              DType t, Stream& after) override {
    after.synchronize();
    return in_.all_gather(send, recv, n, t);
  }
  std::unique_ptr<fsdp::Work> reduce_scatter_impl(const void* send, void* recv, std::size_t n,
                                                  DType t, fsdp::ReduceOp op,
                                                  Stream& after) override {
    after.synchronize();
    return in_.reduce_scatter(send, recv, n, t, op);
  }
  std::unique_ptr<fsdp::Work> all_reduce_impl(const void* send, void* recv, std::size_t n,
                                              DType t, fsdp::ReduceOp op, Stream& after) override {
    after.synchronize();
    return in_.all_reduce(send, recv, n, t, op);
  }
  std::unique_ptr<fsdp::Work> broadcast_impl(void* buf, std::size_t n, DType t, int root,
                                             Stream& after) override {
    after.synchronize();
    return in_.broadcast(buf, n, t, root);
  }

 private:
  fsdp::Communicator& in_;
};

enum class Group { alone, sharded, replicated };  // what the world's ranks do together

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  int64_t deferred_copies = 0;
  int64_t deferred_ops = 0;
  // The host side's whole-buffer passes during the 3 steps (DeferredCopyRuntime's counts) and
  // the gradient shards' elements (the sum of shard_numel).
  int64_t host_fill = 0, host_axpy = 0, host_cast_f32 = 0, host_norm = 0, host_scale = 0;
  int64_t host_cast_16 = 0;
  int64_t grad_elements = 0;
  int64_t nonzero_grads_after_update = 0;  // what reading the gradient shards then gives
  // Side-stream operations still queued right after a step's last end_step (the most over the
  // steps): gradient copies the engine left landing beside the host step.
  int64_t side_ops_after_end_step = 0;
  double eval_loss = 0;  // an evaluation pass after the last update
};

// The model, batch and optimizer settings every run here shares.
fsdp::Gpt2Config test_model() {
  fsdp::Gpt2Config mc;
  mc.n_layer = 3;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.n_positions = 16;
  mc.vocab_size = 64;
  return mc;
}
fsdp::OptimConfig test_optim() {
  fsdp::OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  return oc;
}
// The same random batch of 4 sequences of 12 every step (each rank its own): the loss must fall.
fsdp::data::Batch test_batch(int rank) {
  std::mt19937 rng(3 + static_cast<unsigned>(rank));
  std::uniform_int_distribution<int32_t> token(0, 63);
  fsdp::data::Batch batch;
  batch.B = 4;
  batch.L = 12;
  batch.target_len = 12;
  for (int64_t i = 0; i < batch.B * batch.L; ++i) {
    batch.inputs.push_back(token(rng));
    batch.targets.push_back(token(rng));
  }
  return batch;
}

// Every unit's shard to the optimizer (the trainer's build_model does the same).
void add_shards(fsdp::Optimizer& opt, fsdp::FsdpEngine& engine) {
  for (int u = 0; u < engine.num_units(); ++u) {
    opt.add_shard(engine.shard_param(u), engine.shard_grad(u),
                  fsdp::decayed_ranges(engine.layout(u), engine.shard_index()),
                  &engine.shard_runtime(u));
  }
}
// One step's forward and backward, `micro` sequences a pass (the last the accumulation
// boundary), the loss summed into `loss`.
void forward_backward(fsdp::FsdpEngine& engine, fsdp::Gpt2Model& model,
                      const fsdp::data::Batch& batch, int64_t micro, const TensorView& loss) {
  const int64_t B = batch.B;
  for (int64_t m0 = 0; m0 < B; m0 += micro) {
    engine.set_gradient_accumulation_boundary(m0 + micro >= B);
    engine.begin_step(true);
    model.forward_backward(micro == B ? batch : batch.rows(m0, micro),
                           1.0f / static_cast<float>(B * batch.L), engine, loss);
    engine.end_step();
  }
}

// 3 AdamW steps of a 3-block GPT-2 (bf16 compute, `reduce` reduction, clipping at 0.5,
// weight decay) on one random batch of 4 sequences per rank, `micro` at a time; offloaded on
// the deferred runtime under `schedule`, or on the plain CPU backend without offload. As the
// trainer does, nothing zeroes the gradients between steps but update_shards (offloaded: the
// discarded shard the next reduction's first copy overwrites). `delayed` (resident only):
// fsdp.delayed_parameter_update. After the steps, one evaluation pass of the same batch.
Trained train(bool offload, int64_t micro, Group group, DType reduce, bool resident = false,
              Schedule schedule = Schedule::side_late, unsigned seed = 0, bool delayed = false,
              double ratio = 1.0) {
  auto be = fsdp::make_cpu_backend(1);
  auto host_backend = fsdp::make_cpu_backend(1);
  MemoryMap map;
  DeferredCopyRuntime deferred(*be, map, Side::device, schedule, seed);
  DeferredCopyRuntime host(*host_backend, map, Side::host);
  DeferredKernels deferred_kernels(*be, deferred);
  const fsdp::Gpt2Config mc = test_model();
  fsdp::Kernels& kernels = offload ? static_cast<fsdp::Kernels&>(deferred_kernels) : *be;
  fsdp::Gpt2Model model(mc, kernels, DType::bf16);
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
  fc.cpu_offload = offload && !resident;
  fc.offload_optimizer = offload && resident;
  fc.delayed_parameter_update = delayed;
  fc.offload_optimizer_ratio = ratio;
  fsdp::DeviceRuntime& rt = offload ? static_cast<fsdp::DeviceRuntime&>(deferred) : *be;
  fsdp::MixedPrecisionConfig mp;
  mp.param_dtype = DType::bf16;
  mp.reduce_dtype = reduce;
  SoloCommunicator solo;
  fsdp::MpiCommunicator world_mpi(MPI_COMM_WORLD);
  StreamOrdered world(world_mpi);
  fsdp::Communicator& shard = group == Group::sharded ? static_cast<fsdp::Communicator&>(world) : solo;
  fsdp::Communicator& replicate =
      group == Group::replicated ? static_cast<fsdp::Communicator&>(world) : solo;

  fsdp::FsdpEngine engine(model.modules(), fc, mp, shard, replicate, rt, 7, true,
                          offload ? &host : nullptr);
  fsdp::GradNormClipper clipper(engine);
  const fsdp::OptimConfig oc = test_optim();
  fsdp::Optimizer opt(oc, engine.backend());
  add_shards(opt, engine);
  fsdp::DeviceBuffer loss(rt, DType::f64, 1, fsdp::MemCategory::other);
  fsdp::DeviceBuffer norm(rt, DType::f64, 1, fsdp::MemCategory::other);
  const fsdp::data::Batch batch = test_batch(world_mpi.rank());
  Trained r;
  host.fill_elements = host.axpy_elements = host.cast_f32_elements = host.norm_elements = 0;
  host.scale_elements = host.cast_16_elements = 0;
  for (int step = 1; step <= 3; ++step) {
    rt.fill_zero(loss.view());
    forward_backward(engine, model, batch, micro, loss.view());
    if (offload) {
      r.side_ops_after_end_step = std::max(r.side_ops_after_end_step, deferred.pending_side_ops());
    }
    clipper.clip(0.5, norm.view());
    double host_loss = 0;
    rt.copy_to_host(&host_loss, loss.view());
    r.losses.push_back(host_loss);
    opt.begin_update();
    engine.update_shards([&opt, &clipper, lr = oc.lr](int u, const TensorView& copy) {
      opt.step_shard(u, lr, clipper.coefficient(u), copy);
    });
  }
  r.host_fill = host.fill_elements;
  r.host_scale = host.scale_elements;
  r.host_axpy = host.axpy_elements;
  r.host_cast_f32 = host.cast_f32_elements;
  r.host_norm = host.norm_elements;
  r.host_cast_16 = host.cast_16_elements;
  engine.begin_step(false);
  rt.fill_zero(loss.view());
  model.forward_loss(batch, engine, loss.view());
  engine.end_step();
  rt.copy_to_host(&r.eval_loss, loss.view());
  r.params = engine.gather_full_params();
  for (int u = 0; u < engine.num_units(); ++u) {  // read as zeros, discarded or not
    const TensorView g = engine.shard_grad(u);
    std::vector<float> values(static_cast<std::size_t>(g.numel()));
    engine.shard_runtime(u).copy_to_host(values.data(), g);
    for (float v : values) r.nonzero_grads_after_update += v != 0.f;
  }
  deferred.flush();
  r.deferred_copies = deferred.deferred_copies;
  r.deferred_ops = deferred.deferred_ops;
  for (int u = 0; u < engine.num_units(); ++u) r.grad_elements += engine.shard_numel(u);
  return r;
}

// What fsdp.delayed_parameter_update computes, spelled out on the plain CPU backend without
// offload: step n's forward and backward run at the parameters before update n-1 (written in
// for the pass, the current ones written back before the clip and the update), so each
// gradient is one update late; the evaluation after the last step sees the updated ones.
Trained train_delayed_reference(int64_t micro, Group group, DType reduce) {
  auto be = fsdp::make_cpu_backend(1);
  fsdp::Gpt2Model model(test_model(), *be, DType::bf16);
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
  fsdp::MixedPrecisionConfig mp;
  mp.param_dtype = DType::bf16;
  mp.reduce_dtype = reduce;
  SoloCommunicator solo;
  fsdp::MpiCommunicator world_mpi(MPI_COMM_WORLD);
  fsdp::Communicator& shard =
      group == Group::sharded ? static_cast<fsdp::Communicator&>(world_mpi) : solo;
  fsdp::Communicator& replicate =
      group == Group::replicated ? static_cast<fsdp::Communicator&>(world_mpi) : solo;
  fsdp::FsdpEngine engine(model.modules(), fc, mp, shard, replicate, *be, 7, true);
  fsdp::GradNormClipper clipper(engine);
  const fsdp::OptimConfig oc = test_optim();
  fsdp::Optimizer opt(oc, engine.backend());
  add_shards(opt, engine);
  using Shards = std::vector<std::vector<float>>;
  auto read = [&] {
    Shards s(static_cast<std::size_t>(engine.num_units()));
    for (int u = 0; u < engine.num_units(); ++u) {
      const TensorView p = engine.shard_param(u);
      s[u].resize(static_cast<std::size_t>(p.numel()));
      be->copy_to_host(s[u].data(), p);
    }
    return s;
  };
  auto write = [&](const Shards& s) {
    engine.write_shards([&] {
      for (int u = 0; u < engine.num_units(); ++u) {
        be->copy_from_host(engine.shard_param(u), s[u].data());
      }
    });
  };
  fsdp::DeviceBuffer loss(*be, DType::f64, 1, fsdp::MemCategory::other);
  fsdp::DeviceBuffer norm(*be, DType::f64, 1, fsdp::MemCategory::other);
  const fsdp::data::Batch batch = test_batch(world_mpi.rank());
  Trained r;
  Shards before = read();  // the parameters before the last update
  for (int step = 1; step <= 3; ++step) {
    const Shards current = read();
    write(before);
    be->fill_zero(loss.view());
    forward_backward(engine, model, batch, micro, loss.view());
    write(current);
    clipper.clip(0.5, norm.view());
    double host_loss = 0;
    be->copy_to_host(&host_loss, loss.view());
    r.losses.push_back(host_loss);
    opt.begin_update();
    engine.update_shards([&opt, &clipper, lr = oc.lr](int u, const TensorView& copy) {
      opt.step_shard(u, lr, clipper.coefficient(u), copy);
    });
    before = current;
  }
  engine.begin_step(false);
  be->fill_zero(loss.view());
  model.forward_loss(batch, engine, loss.view());
  engine.end_step();
  be->copy_to_host(&r.eval_loss, loss.view());
  r.params = engine.gather_full_params();
  return r;
}

// The memory map catches what only a GPU would: a device operation on a host buffer, a host
// operation on a device buffer, an asynchronous copy whose host side is device memory.
TEST(OffloadStreams, OperationsOnTheOtherSidesMemoryAreCaught) {
  auto be = fsdp::make_cpu_backend(1);
  auto host_backend = fsdp::make_cpu_backend(1);
  MemoryMap map;
  DeferredCopyRuntime device(*be, map, Side::device);
  DeferredCopyRuntime host(*host_backend, map, Side::host);
  fsdp::DeviceBuffer d = fsdp::DeviceBuffer::floats(device, 8, fsdp::MemCategory::other);
  fsdp::DeviceBuffer h = fsdp::DeviceBuffer::floats(host, 8, fsdp::MemCategory::other);
  EXPECT_NO_THROW(device.fill_zero(d.view()));
  EXPECT_NO_THROW(host.fill_zero(h.view()));
  EXPECT_NO_THROW(device.copy_from_host(d.view(), h.data()));
  EXPECT_THROW(device.axpy(d.view(), 1.f, h.view()), fsdp::Error);
  EXPECT_THROW(device.fill_zero(h.view().slice(2, 4)), fsdp::Error);  // inside, not at the start
  EXPECT_THROW(host.axpy(h.view(), 1.f, d.view()), fsdp::Error);
  std::unique_ptr<Stream> side = device.create_stream();
  EXPECT_THROW(device.copy_to_host_async(d.data(), d.view(), *side), fsdp::Error);
}

// Under each schedule, every offloaded run equals the plain run bit for bit.
void expect_offload_equals_plain(Schedule schedule, unsigned seed = 0) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<Group> groups = {Group::alone};
  if (ranks > 1) groups = {Group::sharded, Group::replicated};
  // reduce_dtype bf16 stages 16-bit gradients; fp32 (the GPU tests' choice) lands the first
  // reduction straight in the fresh accumulator or the empty shard
  for (DType reduce : {DType::bf16, DType::f32})
  for (Group group : groups)
  for (int64_t micro : {4, 1}) {
    SCOPED_TRACE(std::string(group == Group::alone     ? "alone"
                             : group == Group::sharded ? "sharded"
                                                       : "replicated") +
                 ", micro-batches of " + std::to_string(micro) + ", reduce_dtype " +
                 std::string(fsdp::to_string(reduce)));
    const Trained plain = train(false, micro, group, reduce);
    EXPECT_LT(plain.losses.back(), plain.losses.front());
    // fsdp.cpu_offload, fsdp.offload_optimizer, and offload_optimizer_ratio 0.5 (the root and
    // the first block on the device, stepping there beside the host's units)
    for (int variant = 0; variant < 3; ++variant) {
      const bool resident = variant > 0;
      SCOPED_TRACE(variant == 0 ? "cpu_offload" : variant == 1 ? "offload_optimizer" : "half");
      const Trained off = train(true, micro, group, reduce, resident, schedule, seed, false,
                                variant == 2 ? 0.5 : 1.0);
      const int64_t units = variant == 2 ? 2 : 4;  // offloaded
      if (schedule == Schedule::shuffled) {
        EXPECT_GE(off.deferred_ops, 3 * (4 / micro) * 40);
        EXPECT_GE(off.deferred_copies, resident ? 3 * units : 3 * 4 * 2 * (4 / micro));
      } else if (schedule == Schedule::side_late) {
        // Uploads (cpu_offload: every unit, forward and backward, every micro-batch;
        // resident: each offloaded unit once a step) and the gradient copies all went
        // through the queues.
        EXPECT_GE(off.deferred_copies, resident ? 3 * units : 3 * 4 * 2 * (4 / micro));
      } else {  // every kernel of every micro-batch waited in the compute queue
        EXPECT_GE(off.deferred_ops, 3 * (4 / micro) * 40);
      }
      ASSERT_EQ(off.losses.size(), plain.losses.size());
      for (std::size_t i = 0; i < plain.losses.size(); ++i) {
        EXPECT_EQ(off.losses[i], plain.losses[i]) << "step " << i + 1;
      }
      for (const auto& [name, values] : plain.params) {
        EXPECT_EQ(off.params.at(name), values) << name;
      }
    }
  }
}

// The host writes each step's gradient shards once (issue 31 item 3: bytes per parameter of
// the host step): update_shards discards them instead of writing zeros, and the first copy of
// a step lands in the shard (fp32: the device copies into it, no host pass) or is cast into
// it (16-bit), never added onto zeros. Only a second copy (the accumulator, then a
// communicated boundary gradient) is added. Where the shard is the accumulator alone, the
// clip's squared norm comes from the device too, and the clip's scaling is the update's. Copies
// that land are left in flight at the step's end (the host step waits for each unit's).
TEST(OffloadStreams, TheHostWritesEachGradientShardOnceAStep) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const Group group = ranks > 1 ? Group::sharded : Group::alone;
  for (DType reduce : {DType::bf16, DType::f32})
  for (int64_t micro : {4, 1})
  for (bool resident : {false, true}) {
    SCOPED_TRACE("micro-batches of " + std::to_string(micro) + ", reduce_dtype " +
                 std::string(fsdp::to_string(reduce)) + (resident ? ", resident" : ""));
    const Trained off = train(true, micro, group, reduce, resident);
    const int64_t steps = 3, n = off.grad_elements;
    EXPECT_EQ(off.host_fill, 0);
    // An accumulator (micro-batches) is fp32; one micro-batch stages reduce_dtype, or alone
    // (nothing communicated) the bf16 gradient itself when reduce_dtype is fp32.
    const bool lands = micro < 4 || (reduce == DType::f32 && group != Group::alone);
    EXPECT_EQ(off.host_cast_f32, lands ? 0 : steps * n);
    // Sharded with micro-batches, the boundary's reduce-scatter follows the accumulator.
    EXPECT_EQ(off.host_axpy, group == Group::sharded && micro < 4 ? steps * n : 0);
    // The clip reads a shard on the host unless the device summed its norm before the copy
    // (alone with micro-batches: the shard is the accumulator).
    EXPECT_EQ(off.host_norm, group == Group::alone && micro < 4 ? 0 : steps * n);
    // The clip's coefficient is applied by the update as it reads the gradient: no pass
    // scales the shards (the run clips at 0.5, so the coefficient is below 1).
    EXPECT_EQ(off.host_scale, 0);
    // The bf16 copy the uploads read is written by the update's own pass (step_shard's
    // compute_copy), not by a cast after it.
    EXPECT_EQ(off.host_cast_16, 0);
    // A discarded shard still reads as zeros (the engine writes them for a reader).
    EXPECT_EQ(off.nonzero_grads_after_update, 0);
    // Alone with micro-batches (GPT 7B's case) every gradient lands in its shard, and the
    // step's end does not wait for those copies: the host step waits for each unit's own.
    if (group == Group::alone && micro < 4) EXPECT_GT(off.side_ops_after_end_step, 0);
  }
}

// fsdp.delayed_parameter_update under every schedule equals its definition
// (train_delayed_reference) bit for bit: the passes gather the device shards from before the
// host's update while it runs, each unit's new gradient lands only after its update read the
// old one, and its upload follows its last use. It differs from the undelayed run from step 2.
TEST(OffloadStreams, DelayedParameterUpdateIsTheUpdateOneStepLate) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const Group group = ranks > 1 ? Group::sharded : Group::alone;
  for (DType reduce : {DType::bf16, DType::f32})
  for (int64_t micro : {4, 1}) {
    SCOPED_TRACE("micro-batches of " + std::to_string(micro) + ", reduce_dtype " +
                 std::string(fsdp::to_string(reduce)));
    const Trained ref = train_delayed_reference(micro, group, reduce);
    const Trained undelayed = train(false, micro, group, reduce);
    ASSERT_EQ(ref.losses.size(), 3u);
    EXPECT_EQ(ref.losses[0], undelayed.losses[0]);
    EXPECT_EQ(ref.losses[1], undelayed.losses[0]);  // step 2 still at the initial parameters
    EXPECT_NE(ref.losses[2], undelayed.losses[2]);
    EXPECT_LT(ref.losses[2], ref.losses[0]);
    const std::vector<std::pair<Schedule, unsigned>> schedules = {
        {Schedule::side_late, 0}, {Schedule::compute_late, 0}, {Schedule::shuffled, 1},
        {Schedule::shuffled, 2}, {Schedule::shuffled, 3}, {Schedule::shuffled, 4}};
    for (const auto& [schedule, seed] : schedules) {
      SCOPED_TRACE("schedule " + std::to_string(static_cast<int>(schedule)) + ", seed " +
                   std::to_string(seed));
      const Trained off = train(true, micro, group, reduce, true, schedule, seed, true);
      EXPECT_EQ(off.losses, ref.losses);
      EXPECT_EQ(off.eval_loss, ref.eval_loss);
      for (const auto& [name, values] : ref.params) EXPECT_EQ(off.params.at(name), values) << name;
      EXPECT_EQ(off.nonzero_grads_after_update, 0);
    }
  }
}

TEST(OffloadStreams, DeferredCopiesGiveTheRunWithoutOffloadBitForBit) {
  expect_offload_equals_plain(Schedule::side_late);
}

TEST(OffloadStreams, DeferredComputeGivesTheRunWithoutOffloadBitForBit) {
  expect_offload_equals_plain(Schedule::compute_late);
}

// Random legal interleavings of the compute, copy and reduction streams (32 seeds).
TEST(OffloadStreams, ShuffledStreamsGiveTheRunWithoutOffloadBitForBit) {
  for (unsigned seed = 1; seed <= 32; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_offload_equals_plain(Schedule::shuffled, seed);
  }
}

// GradNormClipper is torch.nn.utils.clip_grad_norm_ with its scaling left to the update: the
// norm is the gradient's L2 norm over the world (within 1e-12 of the host's sum in double),
// coefficient(unit) is torch's max_norm / (norm + 1e-6) when the norm exceeds max_norm and 1
// otherwise, in the unit's shard runtime's memory, none for max_norm 0, and the gradient
// shards are left as they are (the update applies it: CpuRuntime.GradScaleEqualsScaleBy-
// ThenTheUpdate). Without offload, with cpu_offload, with offload_optimizer, and with half of
// it offloaded (fsdp.offload_optimizer_ratio 0.5: units on both sides), sharded over the world.
TEST(GradClip, TorchsCoefficientLeftForTheUpdate) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int mode = 0; mode < 4; ++mode)      // no offload, cpu_offload, offload_optimizer, half
  for (double ratio : {0.25, 4.0, 0.0}) {   // max_norm = ratio * norm: clipped, not, no clip
    SCOPED_TRACE("offload mode " + std::to_string(mode) + ", max_norm / norm " +
                 std::to_string(ratio));
    auto be = fsdp::make_cpu_backend(1);
    auto host = fsdp::make_cpu_backend(1);
    fsdp::Gpt2Model model(test_model(), *be, DType::bf16);
    fsdp::FsdpConfig fc;
    fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
    fc.cpu_offload = mode == 1;
    fc.offload_optimizer = mode >= 2;
    fc.offload_optimizer_ratio = mode == 3 ? 0.5 : 1.0;
    fsdp::MixedPrecisionConfig mp;
    mp.param_dtype = DType::bf16;
    mp.reduce_dtype = DType::f32;
    fsdp::MpiCommunicator world(MPI_COMM_WORLD);
    SoloCommunicator solo;
    fsdp::FsdpEngine engine(model.modules(), fc, mp, world, solo, *be, 7, true,
                            mode > 0 ? host.get() : nullptr);
    fsdp::GradNormClipper clipper(engine);
    EXPECT_FALSE(clipper.coefficient(0));
    int offloaded_units = 0;  // half: the root and the first block stay on the device
    for (int u = 0; u < engine.num_units(); ++u) offloaded_units += engine.offloaded(u);
    EXPECT_EQ(offloaded_units, mode == 0 ? 0 : mode == 3 ? 2 : engine.num_units());
    if (mode == 3) EXPECT_FALSE(engine.offloaded(0) || engine.offloaded(1));
    fsdp::DeviceBuffer loss(*be, DType::f64, 1, fsdp::MemCategory::other);
    fsdp::DeviceBuffer norm(*be, DType::f64, 1, fsdp::MemCategory::other);
    forward_backward(engine, model, test_batch(rank), 2, loss.view());
    std::vector<std::vector<float>> grads;
    double local = 0;
    for (int u = 0; u < engine.num_units(); ++u) {
      const TensorView g = engine.shard_grad(u);
      grads.emplace_back(static_cast<std::size_t>(g.numel()));
      engine.shard_runtime(u).copy_to_host(grads.back().data(), g);
      for (const float x : grads.back()) local += static_cast<double>(x) * x;
    }
    double total = 0;
    MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double want = std::sqrt(total), max_norm = ratio * want;
    ASSERT_GT(want, 0.0);
    clipper.clip(max_norm, norm.view());
    double got = 0;
    be->copy_to_host(&got, norm.view());
    EXPECT_NEAR(got, want, 1e-12 * want);
    for (int u = 0; u < engine.num_units(); ++u) {
      fsdp::DeviceRuntime& sh = engine.shard_runtime(u);
      const TensorView coef = clipper.coefficient(u);
      if (ratio == 0.0) {
        EXPECT_FALSE(coef);
      } else {
        ASSERT_TRUE(coef);
        float c = 0;
        sh.copy_to_host(&c, coef);
        EXPECT_EQ(c, ratio < 1 ? static_cast<float>(max_norm / (got + 1e-6)) : 1.0f);
      }
      std::vector<float> after(grads[static_cast<std::size_t>(u)].size());
      sh.copy_to_host(after.data(), engine.shard_grad(u));
      EXPECT_EQ(after, grads[static_cast<std::size_t>(u)]) << "unit " << u << " scaled";
    }
  }
}

}  // namespace
