// CPU offload's stream ordering, checked on the CPU backend (issue 22: the CUDA path overlaps
// its copies with compute, and no GPU has run it yet). The CPU backend's streams run
// everything at once, so an engine that read a buffer before waiting for the copy filling
// it would still pass every other CPU test. Here the engine runs on DeferredCopyRuntime: the
// CPU backend, except that an asynchronous copy enqueued on a side stream (the engine's copy
// and reduction streams) happens only when an event recorded after it is waited on or
// synchronized, or its stream synchronized, as a GPU's copy engine may finish long after the
// host has moved on. A missing wait then reads stale memory and changes the losses.
//
// Every operand is also checked against the side that allocated it (MemoryMap): a device
// operation on a host shard, or a host one on a device buffer, throws.
//
// GPT-2 in bf16 with AdamW and clipping, offloaded on the deferred runtime (fsdp.cpu_offload,
// and fsdp.offload_optimizer's resident device shards), must equal the same run without
// offload bit for bit: one micro-batch a step (the gradient staged in
// reduce_dtype) and several (the device accumulator, staged once at the boundary), for 3
// steps; alone, and at 2 ranks sharded (all-gather after the upload, reduce-scatter) or
// replicated (all-reduce). MPI collectives run on the host at once, so there the
// communicator first runs what the stream it is ordered after holds, as NCCL's stream would
// wait for it.
#include <gtest/gtest.h>

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

// A side stream whose operations wait in a queue until something needs them done.
class DeferredStream final : public Stream {
 public:
  fsdp::Device device() const override { return fsdp::Device::cpu; }
  void wait(Event& event) override { event.synchronize(); }  // conservative: done now
  void synchronize() override { run_until(enqueued_); }
  void enqueue(std::function<void()> op) {
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  void run_until(int64_t position) {
    while (done_ < position) {
      std::function<void()> op = std::move(queue_.front());
      queue_.pop_front();
      ++done_;
      op();
    }
  }
  int64_t enqueued() const { return enqueued_; }
  int64_t done() const { return done_; }

 private:
  std::deque<std::function<void()>> queue_;
  int64_t enqueued_ = 0, done_ = 0;
};

// Complete once its stream has run what was enqueued before record(); on any other stream
// (the compute stream, which runs everything at once) complete at once.
class DeferredEvent final : public Event {
 public:
  void record(Stream& stream) override {
    stream_ = dynamic_cast<DeferredStream*>(&stream);
    position_ = stream_ ? stream_->enqueued() : 0;
  }
  void synchronize() override {
    if (stream_) stream_->run_until(position_);
  }
  bool query() override { return !stream_ || stream_->done() >= position_; }

 private:
  DeferredStream* stream_ = nullptr;
  int64_t position_ = 0;
};

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

// The CPU backend `inner` as one side of an offloaded run: its allocations recorded in `map`
// and every operand checked against it (MemoryMap); on the device side its asynchronous
// copies on side streams are deferred.
class DeferredCopyRuntime final : public fsdp::DeviceRuntime {
 public:
  DeferredCopyRuntime(fsdp::DeviceRuntime& inner, MemoryMap& map, Side side)
      : in_(inner), map_(map), side_(side) {}
  int64_t deferred_copies = 0;  // how many copies waited in a queue

  fsdp::Device device() const override { return in_.device(); }
  Stream& compute_stream() override { return in_.compute_stream(); }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<DeferredStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<DeferredEvent>(); }
  void* allocate(std::size_t bytes, fsdp::MemCategory category) override {
    void* p = in_.allocate(bytes, category);
    map_.add(p, bytes, side_);
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes, fsdp::MemCategory category,
                  std::shared_ptr<Event> pending) noexcept override {
    map_.remove(ptr);
    in_.deallocate(ptr, bytes, category, std::move(pending));
  }
  fsdp::MemoryTracker& memory() override { return in_.memory(); }
  const fsdp::AllocatorStats& allocator_stats() const override { return in_.allocator_stats(); }
  void fill_zero(const TensorView& dst) override { in_.fill_zero(mine(dst, "fill_zero")); }
  void copy(const TensorView& dst, const TensorView& src) override {
    in_.copy(mine(dst, "copy"), mine(src, "copy"));
  }
  void cast(const TensorView& dst, const TensorView& src) override {
    in_.cast(mine(dst, "cast"), mine(src, "cast"));
  }
  void copy_to_host(void* host_dst, const TensorView& src) override {
    in_.copy_to_host(host(host_dst, "copy_to_host"), mine(src, "copy_to_host"));
  }
  void copy_from_host(const TensorView& dst, const void* host_src) override {
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
  void synchronize() override { in_.synchronize(); }
  void axpy(const TensorView& y, float alpha, const TensorView& x) override {
    in_.axpy(mine(y, "axpy"), alpha, mine(x, "axpy"));
  }
  void squared_norm(const TensorView& acc, const TensorView& x) override {
    in_.squared_norm(mine(acc, "squared_norm"), mine(x, "squared_norm"));
  }
  void clip_coefficient(const TensorView& norm, const TensorView& coef, const TensorView& parts,
                        double max_norm) override {
    in_.clip_coefficient(mine(norm, "clip_coefficient"), mine(coef, "clip_coefficient"),
                         mine(parts, "clip_coefficient"), max_norm);
  }
  void scale_by(const TensorView& x, const TensorView& coef) override {
    in_.scale_by(mine(x, "scale_by"), mine(coef, "scale_by"));
  }
  void unscale_and_check(const TensorView& x, float inv_scale, const TensorView& found) override {
    in_.unscale_and_check(mine(x, "unscale_and_check"), inv_scale, mine(found, "unscale_and_check"));
  }
  void adamw_update(const TensorView& p, const TensorView& g, const TensorView& m,
                    const TensorView& v, float lr, float b1, float b2, float eps,
                    const fsdp::WeightDecay& wd, int64_t step, const TensorView& copy) override {
    in_.adamw_update(mine(p, "adamw"), mine(g, "adamw"), mine(m, "adamw"), mine(v, "adamw"), lr,
                     b1, b2, eps, wd, step, mine(copy, "adamw"));
  }
  void sgd_update(const TensorView& p, const TensorView& g, const TensorView& buf, float lr,
                  float momentum, const fsdp::WeightDecay& wd, int64_t step,
                  const TensorView& copy) override {
    in_.sgd_update(mine(p, "sgd"), mine(g, "sgd"), mine(buf, "sgd"), lr, momentum, wd, step,
                   mine(copy, "sgd"));
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
  void defer(Stream& stream, std::function<void()> op) {
    auto* s = dynamic_cast<DeferredStream*>(&stream);
    if (s == nullptr) return op();  // the compute stream: at once
    ++deferred_copies;
    s->enqueue(std::move(op));
  }
  fsdp::DeviceRuntime& in_;
  MemoryMap& map_;
  Side side_;
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
  static std::unique_ptr<fsdp::Work> copied(void* recv, const void* send, std::size_t bytes) {
    if (recv != send && bytes > 0) std::memmove(recv, send, bytes);
    return std::make_unique<Done>();
  }
  std::unique_ptr<fsdp::Work> all_gather_impl(const void* send, void* recv, std::size_t n,
                                              DType t, Stream&) override {
    return copied(recv, send, n * fsdp::dtype_size(t));
  }
  std::unique_ptr<fsdp::Work> reduce_scatter_impl(const void* send, void* recv, std::size_t n,
                                                  DType t, fsdp::ReduceOp, Stream&) override {
    return copied(recv, send, n * fsdp::dtype_size(t));
  }
  std::unique_ptr<fsdp::Work> all_reduce_impl(const void* send, void* recv, std::size_t n,
                                              DType t, fsdp::ReduceOp, Stream&) override {
    return copied(recv, send, n * fsdp::dtype_size(t));
  }
  std::unique_ptr<fsdp::Work> broadcast_impl(void*, std::size_t, DType, int, Stream&) override {
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
};

// 3 AdamW steps of a 3-block GPT-2 (bf16 compute and reduction, clipping at 0.5, weight
// decay) on one random batch of 4 sequences per rank, `micro` at a time; offloaded on the deferred
// runtime, or on the plain CPU backend without offload.
Trained train(bool offload, int64_t micro, Group group, bool resident = false) {
  auto be = fsdp::make_cpu_backend(1);
  auto host_backend = fsdp::make_cpu_backend(1);
  MemoryMap map;
  DeferredCopyRuntime deferred(*be, map, Side::device);
  DeferredCopyRuntime host(*host_backend, map, Side::host);
  fsdp::Gpt2Config mc;
  mc.n_layer = 3;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.n_positions = 16;
  mc.vocab_size = 64;
  fsdp::Gpt2Model model(mc, *be, DType::bf16);
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
  fc.cpu_offload = offload && !resident;
  fc.offload_optimizer = offload && resident;
  fsdp::MixedPrecisionConfig mp;
  mp.param_dtype = DType::bf16;
  mp.reduce_dtype = DType::bf16;
  SoloCommunicator solo;
  fsdp::MpiCommunicator world_mpi(MPI_COMM_WORLD);
  StreamOrdered world(world_mpi);
  fsdp::Communicator& shard = group == Group::sharded ? static_cast<fsdp::Communicator&>(world) : solo;
  fsdp::Communicator& replicate =
      group == Group::replicated ? static_cast<fsdp::Communicator&>(world) : solo;
  fsdp::DeviceRuntime& rt = offload ? static_cast<fsdp::DeviceRuntime&>(deferred) : *be;
  fsdp::FsdpEngine engine(model.modules(), fc, mp, shard, replicate, rt, 7, true,
                          offload ? &host : nullptr);
  fsdp::GradNormClipper clipper(engine);
  fsdp::OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  fsdp::Optimizer opt(oc, engine.shard_runtime());
  for (int u = 0; u < engine.num_units(); ++u) {
    opt.add_shard(engine.shard_param(u), engine.shard_grad(u),
                  fsdp::decayed_ranges(engine.layout(u), engine.shard_index()));
  }
  fsdp::DeviceBuffer loss(*be, DType::f64, 1, fsdp::MemCategory::other);
  fsdp::DeviceBuffer norm(*be, DType::f64, 1, fsdp::MemCategory::other);
  std::mt19937 rng(3 + static_cast<unsigned>(world_mpi.rank()));  // each rank its own data
  std::uniform_int_distribution<int32_t> token(0, 63);
  const int64_t B = 4, L = 12;
  Trained r;
  fsdp::data::Batch batch;  // the same batch every step: the loss must fall
  batch.B = B;
  batch.L = L;
  batch.target_len = L;
  for (int64_t i = 0; i < B * L; ++i) {
    batch.inputs.push_back(token(rng));
    batch.targets.push_back(token(rng));
  }
  for (int step = 1; step <= 3; ++step) {
    engine.zero_grad();
    be->fill_zero(loss.view());
    for (int64_t m0 = 0; m0 < B; m0 += micro) {
      engine.set_gradient_accumulation_boundary(m0 + micro >= B);
      engine.begin_step(true);
      model.forward_backward(micro == B ? batch : batch.rows(m0, micro), 1.0f / (B * L), engine,
                             loss.view());
      engine.end_step();
    }
    clipper.clip(0.5, norm.view());
    double host_loss = 0;
    be->copy_to_host(&host_loss, loss.view());
    r.losses.push_back(host_loss);
    opt.begin_update();
    engine.update_shards([&opt, lr = oc.lr](int u) { opt.step_shard(u, lr); });
  }
  r.params = engine.gather_full_params();
  r.deferred_copies = deferred.deferred_copies;
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

TEST(OffloadStreams, DeferredCopiesGiveTheRunWithoutOffloadBitForBit) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<Group> groups = {Group::alone};
  if (ranks > 1) groups = {Group::sharded, Group::replicated};
  for (Group group : groups)
  for (int64_t micro : {4, 1}) {
    SCOPED_TRACE(std::string(group == Group::alone ? "alone" : group == Group::sharded ? "sharded" : "replicated") +
                 ", micro-batches of " + std::to_string(micro));
    const Trained plain = train(false, micro, group);
    EXPECT_LT(plain.losses.back(), plain.losses.front());
    for (bool resident : {false, true}) {  // fsdp.cpu_offload, fsdp.offload_optimizer
      SCOPED_TRACE(resident ? "offload_optimizer" : "cpu_offload");
      const Trained off = train(true, micro, group, resident);
      // Uploads (cpu_offload: every unit, forward and backward, every micro-batch; resident:
      // each unit once a step) and the gradient copies all went through the queues.
      EXPECT_GE(off.deferred_copies, resident ? 3 * 4 : 3 * 4 * 2 * (4 / micro));
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

}  // namespace
