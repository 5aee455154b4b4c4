// One FSDP unit (FSDP2's FSDPParamGroup): its shards, state machine, unshard / reshard and
// gradient reduction (see fsdp/fsdp/param_group.hpp).
#include "fsdp/fsdp/param_group.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp {

FsdpParamGroup::FsdpParamGroup(int index, FlatParamLayout layout, const ParamGroupContext& ctx,
                               bool initialise)
    : index_(index), layout_(std::move(layout)), ctx_(ctx) {
  const int64_t n = layout_.shard_numel;
  shard_param_ = DeviceBuffer::floats(*ctx_.sh, n, MemCategory::sharded_params);
  shard_grad_ = DeviceBuffer::floats(*ctx_.sh, n, MemCategory::grads);
  if (initialise) ctx_.sh->fill_zero(shard_grad_.view());
  if (ctx_.offloaded() && ctx_.mp.param_dtype != DType::f32) {
    host_param_ = DeviceBuffer(*ctx_.sh, ctx_.mp.param_dtype, n, MemCategory::comm_buffers);
  }
  if (ctx_.resident) {
    device_param_ = DeviceBuffer(*ctx_.be, ctx_.mp.param_dtype, n, MemCategory::sharded_params);
  }
}

FsdpParamGroup::~FsdpParamGroup() = default;

bool FsdpParamGroup::needs_full() const {
  return layout_.num_shards > 1 || ctx_.mp.param_dtype != DType::f32 || ctx_.offloaded();
}

CollectiveTrace FsdpParamGroup::trace() const {
  CollectiveTrace t;
  t.profiler = ctx_.profiler;
  t.timer = ctx_.timer;
  if (ctx_.profiler) {
    t.describe = [this](ProfileRange& range, const char* op, const char* stage,
                        const Communicator& comm, int64_t numel, DType dtype) {
      describe_collective(range, op, stage, index_, name(), comm, numel, dtype);
    };
  }
  return t;
}

// ---- initialisation ----

namespace {
// Elements [lo, hi) of the flat buffer, all inside entry e, into out[0, hi - lo).
void init_elements(const FlatEntry& e, uint64_t seed, int64_t lo, int64_t hi, float* out) {
  // The model's rows first, then vocabulary pad rows (k >= own), which stay 0.
  const int64_t k0 = lo - e.offset, own = std::clamp<int64_t>(e.spec.unpadded_numel() - k0, 0, hi - lo);
  switch (e.spec.init) {
    case InitKind::normal:
      rng::NormalStream(seed, rng::key_of(e.spec.name))
          .fill(static_cast<uint64_t>(k0), own, e.spec.init_std, out);
      break;
    case InitKind::zeros: std::fill(out, out + own, 0.f); break;
    case InitKind::ones: std::fill(out, out + own, 1.f); break;
    case InitKind::log_uniform: {  // log(low + (high - low) u), u in (0, 1): 24 random bits
      const uint64_t key = rng::key_of(e.spec.name);  // + 1/2 (finite at low = 0, HF's MoE's)
      const double lo = e.spec.init_low, hi = e.spec.init_high;
      for (int64_t i = 0; i < own; ++i) {
        const double u =
            (static_cast<double>(rng::bits(seed, key, static_cast<uint64_t>(k0 + i)) >> 40) +
             0.5) /
            static_cast<double>(uint64_t{1} << 24);
        out[i] = static_cast<float>(std::log(lo + (hi - lo) * u));
      }
      break;
    }
  }
  if (e.spec.zero_row >= 0 && !e.spec.shape.empty() && e.spec.shape[0] > 0) {
    const int64_t width = e.spec.numel() / e.spec.shape[0];
    const int64_t r0 = std::max(e.spec.zero_row * width, k0),
                  r1 = std::min((e.spec.zero_row + 1) * width, k0 + own);
    if (r0 < r1) std::fill(out + (r0 - k0), out + (r1 - k0), 0.f);
  }
  std::fill(out + own, out + (hi - lo), 0.f);
}
}  // namespace

// Rank s generates only flat elements [s*shard_numel, (s+1)*shard_numel). Every element is a
// function of (seed, name, k) alone, so the shard is filled by as many threads as this rank
// may use (usable_cpus, one per 2^20 elements at most): the same values for any thread
// count (7B: 6.7e9 normals, ~3.5 s on 16 cores; see rng::NormalStream).
void FsdpParamGroup::init_shard(uint64_t seed) {
  const auto& L = layout_;
  const int rank = ctx_.shard->rank();
  const int64_t begin = L.shard_begin(rank), end = L.shard_end(rank);
  // Filled in place when the shard is host memory (the CPU backend, cpu_offload's master
  // shard), else in a host staging array copied up once. Not zeroed here: each thread zeroes
  // and fills its own chunk (parallel first touch).
  std::unique_ptr<float[]> staging;
  float* host = static_cast<float*>(shard_param_.view().data);
  if (!ctx_.sh->host_addressable()) {
    staging.reset(new float[static_cast<std::size_t>(L.shard_numel)]);
    host = staging.get();
  }
  const int64_t threads =
      std::clamp<int64_t>(L.shard_numel >> 20, 1, static_cast<int64_t>(usable_cpus()));
  const int64_t chunk = (L.shard_numel + threads - 1) / threads;
  auto fill = [&](int64_t from, int64_t to) {  // flat elements [from, to) of the shard range
    if (from < to) std::fill(host + (from - begin), host + (to - begin), 0.f);
    for (const auto& e : L.entries) {
      const int64_t lo = std::max(from, e.offset), hi = std::min(to, e.offset + e.spec.numel());
      if (lo < hi) init_elements(e, seed, lo, hi, host + (lo - begin));
    }
  };
  auto part = [&](int64_t t) {  // the t-th chunk of the shard range
    fill(std::min(end, begin + t * chunk), std::min(end, begin + (t + 1) * chunk));
  };
  run_parts(threads, part);
  if (staging) ctx_.sh->copy_from_host(shard_param_.view(), staging.get());
}

void FsdpParamGroup::refresh_copies() {
  if (host_param_) ctx_.sh->cast(host_param_.view(), shard_param_.view());
  host_copy_written();
  upload_resident();
}

void FsdpParamGroup::upload_resident() {
  if (!upload_due_) return;
  upload_due_ = false;
  DeviceRuntime& be = *ctx_.be;
  const std::shared_ptr<Event> read = be.create_event();  // gathers still sending from it
  read->record(be.compute_stream());
  ctx_.copy_stream->wait(*read);
  be.copy_from_host_async(device_param_.view(),
                          host_param_ ? host_param_.data() : shard_param_.data(),
                          *ctx_.copy_stream);
  uploaded_ = be.create_event();
  uploaded_->record(*ctx_.copy_stream);
}

// ---- state ----

void FsdpParamGroup::transition(TrainingState from, TrainingState to, const char* hook) {
  if (training_ != from) {
    throw Error("FSDP: illegal unit state transition in " + std::string(hook) + ": unit " +
                std::to_string(index_) + " (" + name() + ") is " + to_string(training_) +
                ", expected " + to_string(from) + " to enter " + to_string(to));
  }
  training_ = to;
}

void FsdpParamGroup::begin_pass() {
  if (training_ != TrainingState::IDLE) {
    throw Error("FSDP: begin_step while unit " + std::to_string(index_) + " (" + name() +
                ") is " + to_string(training_) +
                ": the previous pass was not ended with end_step");
  }
  fwd_done_ = 0;
  bwd_done_ = 0;
}

void FsdpParamGroup::end_pass() {
  full_grad_.reset();  // a backward cut short (not in the contract)
  training_ = TrainingState::IDLE;
}

bool FsdpParamGroup::pre_forward() {
  const bool first = fwd_done_ == 0;
  if (first) {
    transition(TrainingState::IDLE, TrainingState::FORWARD, "pre_forward");
  } else if (training_ != TrainingState::FORWARD) {  // its forward already ended
    transition(TrainingState::FORWARD, TrainingState::FORWARD, "pre_forward");
  }
  return first;
}

bool FsdpParamGroup::post_forward() {
  if (training_ != TrainingState::FORWARD) {
    transition(TrainingState::FORWARD, TrainingState::IDLE, "post_forward");
  }
  if (++fwd_done_ < static_cast<int>(modules_.size())) return false;
  training_ = TrainingState::IDLE;
  return true;
}

bool FsdpParamGroup::pre_backward(bool training) {
  if (training_ == TrainingState::PRE_BACKWARD) return false;
  if (!training) {
    throw Error("FSDP: pre_backward of unit " + std::to_string(index_) + " (" + name() +
                ") in an evaluation pass (begin_step(false))");
  }
  if (training_ == TrainingState::IDLE && fwd_done_ != static_cast<int>(modules_.size())) {
    throw Error("FSDP: pre_backward of unit " + std::to_string(index_) + " (" + name() +
                ") before its forward completed in this pass");
  }
  transition(TrainingState::IDLE, TrainingState::PRE_BACKWARD, "pre_backward");
  return true;
}

void FsdpParamGroup::provide_grad_storage() {
  if (!needs_full()) return;
  full_grad_ = DeviceBuffer(*ctx_.be, ctx_.mp.param_dtype, layout_.padded_numel,
                            MemCategory::unsharded_grads);
  ctx_.be->fill_zero(full_grad_.view());
}

bool FsdpParamGroup::post_backward() {
  if (training_ != TrainingState::PRE_BACKWARD) {
    transition(TrainingState::PRE_BACKWARD, TrainingState::POST_BACKWARD, "post_backward");
  }
  if (++bwd_done_ < static_cast<int>(modules_.size())) return false;
  training_ = TrainingState::POST_BACKWARD;
  return true;
}

// ---- unshard / reshard ----

// Casts this rank's fp32 shard to param_dtype into its slot of the full buffer, then
// all-gathers in place (fp32: straight from the shard); offloaded, the slot is uploaded from
// the host copy on the copy stream first.
void FsdpParamGroup::unshard(bool host_copy_ready, bool refresh) {
  if (sharded_ == ShardedState::UNSHARDED || !needs_full()) return;
  if (ctx_.offloaded() && !host_copy_ready) {
    throw Error("FSDP: unit " + std::to_string(index_) + " (" + name() +
                ") unsharded before its shards were written: with offload the shards are "
                "written through FsdpEngine::write_shards / update_shards (initialisation, a "
                "checkpoint load, model.init_from, the optimizer step), which make the copies "
                "the unshards upload");
  }
  Stream& compute = ctx_.be->compute_stream();
  AllGatherResult r;
  if (ctx_.resident) {  // gathered from the device shard, once its refresh has landed
    if (refresh) upload_resident();  // update_shards' host thread left it due
    if (uploaded_) {
      compute.wait(*uploaded_);
      uploaded_.reset();
    }
    r = foreach_all_gather(*ctx_.be, *ctx_.shard, layout_, device_param_, ctx_.mp.param_dtype,
                           compute, trace());
  } else {
    HostUpload upload;
    if (ctx_.offloaded()) {
      upload.src = host_param_ ? host_param_.data() : shard_param_.data();
      upload.stream = ctx_.copy_stream;
    }
    r = foreach_all_gather(*ctx_.be, *ctx_.shard, layout_, shard_param_, ctx_.mp.param_dtype,
                           compute, trace(), ctx_.offloaded() ? &upload : nullptr);
  }
  full_param_ = std::move(r.full_param);
  gather_ = std::move(r.work);
  ready_ = std::move(r.ready);
  sharded_ = ShardedState::UNSHARDED;
}

void FsdpParamGroup::wait_for_unshard() {
  if (gather_) {
    StepTimer::Scope waiting(ctx_.timer, Phase::comm_wait);
    ProfileRange range(ctx_.profiler, "collective");
    if (range) {
      describe_collective(range, "all_gather", "wait", index_, name(), *ctx_.shard,
                          layout_.shard_numel, ctx_.mp.param_dtype);
    }
    gather_->wait();
    gather_.reset();
  }
  if (ready_) {
    ctx_.be->compute_stream().wait(*ready_);
    ready_.reset();
  }
}

void FsdpParamGroup::reshard() {
  wait_for_unshard();  // prefetched, never used (a pass cut short): freed after its fill
  full_param_.reset();
  sharded_ = ShardedState::SHARDED;
}

// ---- gradient reduction ----

void FsdpParamGroup::reduce(bool boundary, const StagedSink& to_host) {
  DeviceRuntime& be = *ctx_.be;
  const bool shard_was_empty = grad_ == GradState::EMPTY;
  grad_ = GradState::ACCUMULATED;
  if (!needs_full()) {  // fp32, one shard: backward accumulated into shard_grad directly
    reduction_ = reduce_shard_grad(*ctx_.replicate, layout_, shard_grad_, be.compute_stream(),
                                   trace());
    return;
  }
  // Offloaded, between gradient accumulation boundaries (and at the boundary where nothing
  // is communicated and an accumulator exists: one device-to-host copy and no host add
  // instead of two), the reduced gradient goes into the unit's fp32 accumulator on the device.
  const bool local = layout_.num_shards == 1 && ctx_.replicate->size() == 1;
  if (ctx_.offloaded() && (!boundary || (local && grad_acc_))) {
    const bool fresh = !grad_acc_;
    if (fresh) {
      grad_acc_ = DeviceBuffer::floats(be, layout_.shard_numel, MemCategory::grads);
      be.fill_zero(grad_acc_.view());
    }
    reduction_ = foreach_reduce(be, *ctx_.shard, *ctx_.replicate, layout_, std::move(full_grad_),
                                grad_acc_, fresh, ctx_.mp.reduce_dtype, be.compute_stream(),
                                *ctx_.reduce_stream, trace());
    if (boundary) {  // local: the sum is complete on the compute stream
      const bool norm = shard_unwritten() && ctx_.device_norms;  // the shard will be it exactly
      if (norm) {
        if (!norm_sq_) norm_sq_ = DeviceBuffer(be, DType::f64, 1, MemCategory::other);
        be.fill_zero(norm_sq_.view());
        be.squared_norm(norm_sq_.view(), grad_acc_.view());
      }
      to_host(stage_accumulator());
      if (norm) shard_grad_holds_ = ShardGrad::accumulator;
    }
    return;
  }
  if (ctx_.offloaded() && grad_acc_) to_host(stage_accumulator());  // earlier micro-batches first
  const bool empty = ctx_.offloaded() ? shard_unwritten() : shard_was_empty;
  reduction_ = foreach_reduce(be, *ctx_.shard, *ctx_.replicate, layout_, std::move(full_grad_),
                              shard_grad_, empty, ctx_.mp.reduce_dtype, be.compute_stream(),
                              *ctx_.reduce_stream, trace(), ctx_.offloaded() ? ctx_.sh : nullptr);
  if (reduction_.staged) {
    shard_grad_holds_ = ShardGrad::sum;  // the copy lands, is cast or added: all written
    to_host(std::move(reduction_.staged));
  }
}

// Copies the device accumulator (complete on the compute stream) to the host on the
// reduction stream, freed behind the copy: straight into the gradient shard if that holds
// nothing yet (the accumulator is fp32).
HostStaging FsdpParamGroup::stage_accumulator() {
  void* into = shard_unwritten() ? shard_grad_.data() : nullptr;
  HostStaging s = stage_to_host(*ctx_.be, *ctx_.sh, grad_acc_, &ctx_.be->compute_stream(),
                                *ctx_.reduce_stream, into);
  shard_grad_holds_ = ShardGrad::sum;
  return s;
}

bool FsdpParamGroup::grad_norm_sq(double& value) {
  if (shard_grad_holds_ != ShardGrad::accumulator) return false;
  ctx_.be->copy_to_host(&value, norm_sq_.view());
  return true;
}

void FsdpParamGroup::add_staged(const HostStaging& copy) {
  if (copy.landed) return;
  if (copy.assign) {
    ctx_.sh->cast(shard_grad_.view(), copy.host.view());
  } else {
    ctx_.sh->axpy(shard_grad_.view(), 1.f, copy.host.view());
  }
}

void FsdpParamGroup::wait_reduce_scatter() {
  ReduceResult& r = reduction_;
  if (!r.reduce_scatter) return;
  {
    StepTimer::Scope waiting(ctx_.timer, Phase::comm_wait);
    ProfileRange range(ctx_.profiler, "collective");
    if (range && !r.all_reduce_on_reduce_stream) {  // else already ranged at the hand-off
      describe_collective(range, "reduce_scatter", "wait", index_, name(), *ctx_.shard,
                          layout_.shard_numel, ctx_.mp.reduce_dtype);
    }
    r.reduce_scatter->wait();
  }
  r.reduce_scatter.reset();
}

void FsdpParamGroup::finish_reduction() {
  DeviceRuntime& be = *ctx_.be;
  ReduceResult& r = reduction_;
  if (r.all_reduce) {
    StepTimer::Scope waiting(ctx_.timer, Phase::comm_wait);
    ProfileRange range(ctx_.profiler, "collective");
    if (range) {
      describe_collective(range, "all_reduce", "wait", index_, name(), *ctx_.replicate,
                          layout_.shard_numel, r.reduced ? r.reduced.dtype() : DType::f32);
    }
    r.all_reduce->wait();
    // Issued after the reduction stream: the compute stream waits for its completion.
    if (r.all_reduce_on_reduce_stream) be.compute_stream().wait(*r.all_reduce->done());
    r.all_reduce.reset();
  }
  if (r.reduced) {  // shard_grad is 0 where it held nothing: the sum is then exact
    be.axpy((grad_acc_ ? grad_acc_ : shard_grad_).view(), 1.f, r.reduced.view());
    r.reduced.reset();
  }
  r.all_reduce_on_reduce_stream = false;
}

void FsdpParamGroup::zero_grad() {
  grad_acc_.reset();  // a step that never reached its boundary
  zero_grad_shard();
}

void FsdpParamGroup::zero_grad_shard() {
  ctx_.sh->fill_zero(shard_grad_.view());
  grad_ = GradState::EMPTY;
  shard_grad_holds_ = ShardGrad::zero;
}

void FsdpParamGroup::discard_grad_shard() {
  grad_ = GradState::EMPTY;
  shard_grad_holds_ = ShardGrad::discarded;
}

void FsdpParamGroup::settle_grad() {
  if (shard_grad_holds_ != ShardGrad::discarded) return;
  ctx_.sh->fill_zero(shard_grad_.view());
  shard_grad_holds_ = ShardGrad::zero;
}

void FsdpParamGroup::inject_nonfinite_grad() {
  settle_grad();
  const float inf = std::numeric_limits<float>::infinity();
  ctx_.sh->copy_from_host(shard_grad_.view().slice(0, 1), &inf);
  grad_ = GradState::ACCUMULATED;
  shard_grad_holds_ = ShardGrad::sum;
}

// ---- views ----

TensorView FsdpParamGroup::param(int64_t offset, const Shape& shape) {
  if (!needs_full()) return shard_param_.view().slice(offset, shape.numel()).reshape(shape);
  if (sharded_ != ShardedState::UNSHARDED) {
    throw Error("FSDP: parameter read while its unit is sharded");
  }
  return full_param_.view().slice(offset, shape.numel()).reshape(shape);
}

TensorView FsdpParamGroup::grad(int64_t offset, const Shape& shape) {
  if (training_ != TrainingState::PRE_BACKWARD) {
    throw Error("FSDP: gradient requested outside the unit's backward (unit " +
                std::to_string(index_) + " (" + name() + ") is " + to_string(training_) + ")");
  }
  const DeviceBuffer& buf = needs_full() ? full_grad_ : shard_grad_;
  return buf.view().slice(offset, shape.numel()).reshape(shape);
}

}  // namespace fsdp
