// The FSDP engine's per-unit collectives: unshard (all-gather) and reduce (reduce-scatter /
// all-reduce), see fsdp/fsdp/collectives.hpp.
#include "fsdp/fsdp/collectives.hpp"

#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp {

void describe_collective(ProfileRange& range, const char* op, const char* stage, int unit,
                         const std::string& name, const Communicator& comm, int64_t numel,
                         DType dtype) {
  const std::string o(op);
  const int64_t bytes = numel * static_cast<int64_t>(dtype_size(dtype));
  const int64_t group = comm.size();
  const std::string target = unit < 0 ? name : "unit " + std::to_string(unit) + " (" + name + ")";
  range.name(o + " " + stage + " " + target)
      .arg("unit", unit)
      .arg("unit_name", name)
      .arg("in_bytes", o == "reduce_scatter" ? bytes * group : bytes)
      .arg("out_bytes", o == "all_gather" ? bytes * group : bytes)
      .arg("dtype", std::string(to_string(dtype)))
      .arg("ranks", group);
}

namespace {

void check_shard(const FlatParamLayout& layout, const DeviceBuffer& buf, const char* what) {
  if (buf.dtype() != DType::f32 || buf.numel() != layout.shard_numel) {
    throw Error(std::string("FSDP collectives: ") + what + " of unit " + layout.unit_name +
                " must be fp32 [" + std::to_string(layout.shard_numel) + "], got " +
                std::string(to_string(buf.dtype())) + " [" + std::to_string(buf.numel()) + "]");
  }
}

// A "collective" range around an issue or a wait, named by the trace's describe.
struct Traced {
  Traced(const CollectiveTrace& t, const char* op, const char* stage, const Communicator& comm,
         int64_t numel, DType dtype)
      : range(t.profiler, "collective") {
    if (range && t.describe) t.describe(range, op, stage, comm, numel, dtype);
  }
  ProfileRange range;
};

// CPU offload: once the unit's last collective completes (with none, once `stream` has
// produced the gradient), the reduction stream copies the reduced shard into host staging.
// On a host stream (MPI on the CPU backend) waiting for the collective blocks here.
// An fp32 copy lands in shard_grad when that holds nothing (`empty`); a 16-bit one is then
// written (cast) into it by the host instead of added.
void stage_reduced(DeviceRuntime& be, DeviceRuntime& host, ReduceResult& r, Stream& stream,
                   Stream& reduce_stream, const CollectiveTrace& trace, const Communicator& shard,
                   const Communicator& replicate, DeviceBuffer& shard_grad, bool empty) {
  Work* last = r.all_reduce ? r.all_reduce.get() : r.reduce_scatter.get();
  if (last != nullptr) {
    StepTimer::Scope waiting(trace.timer, Phase::comm_wait);
    Traced wait(trace, r.all_reduce ? "all_reduce" : "reduce_scatter", "wait",
                r.all_reduce ? replicate : shard, r.reduced.numel(), r.reduced.dtype());
    reduce_stream.wait(*last->done());
  }
  const bool land = empty && r.reduced.dtype() == DType::f32;
  r.staged = stage_to_host(be, host, r.reduced, last != nullptr ? nullptr : &stream, reduce_stream,
                           land ? shard_grad.data() : nullptr);
  r.staged.assign = empty && !land;
}

}  // namespace

HostStaging stage_to_host(DeviceRuntime& be, DeviceRuntime& host_runtime, DeviceBuffer& device,
                          Stream* after, Stream& copy_stream, void* into) {
  if (after != nullptr) {
    const std::shared_ptr<Event> produced = be.create_event();
    produced->record(*after);
    copy_stream.wait(*produced);
  }
  HostStaging s;
  s.copied = be.create_event();
  s.landed = into != nullptr;
  if (!s.landed) {
    s.host = DeviceBuffer(host_runtime, device.dtype(), device.numel(), MemCategory::comm_buffers);
    into = s.host.data();
  }
  be.copy_to_host_async(into, device.view(), copy_stream);
  s.copied->record(copy_stream);
  device.reset(s.copied);
  return s;
}

AllGatherResult foreach_all_gather(DeviceRuntime& be, Communicator& shard,
                                   const FlatParamLayout& layout, const DeviceBuffer& shard_param,
                                   DType param_dtype, Stream& stream, const CollectiveTrace& trace,
                                   const HostUpload* upload) {
  // fp32, or (without an upload) already param_dtype: a resident device shard
  const bool resident = upload == nullptr && shard_param.dtype() == param_dtype;
  if (!resident || shard_param.numel() != layout.shard_numel) {
    check_shard(layout, shard_param, "shard_param");
  }
  if (layout.num_shards != shard.size()) {
    throw Error("FSDP collectives: unit " + layout.unit_name + " has " +
                std::to_string(layout.num_shards) + " shards, its shard group " +
                std::to_string(shard.size()) + " ranks");
  }
  const int64_t n = layout.shard_numel;
  AllGatherResult r;
  r.full_param = DeviceBuffer(be, param_dtype, layout.padded_numel, MemCategory::unsharded_params);
  const TensorView slot = r.full_param.view().slice(shard.rank() * n, n);
  const void* send = shard_param.data();
  Stream* after = &stream;
  if (upload != nullptr) {
    // The slot may be memory that work already enqueued on `stream` freed: the copy stream
    // starts after it, then the all-gather after the copy, so both overlap what `stream`
    // does next.
    const std::shared_ptr<Event> freed = be.create_event();
    freed->record(stream);
    upload->stream->wait(*freed);
    be.copy_from_host_async(slot, upload->src, *upload->stream);
    send = slot.data;
    after = upload->stream;
    if (layout.num_shards == 1) {
      r.ready = be.create_event();
      r.ready->record(*upload->stream);
    }
  } else if (shard_param.dtype() != param_dtype) {
    be.cast(slot, shard_param.view());
    send = slot.data;
  } else if (layout.num_shards == 1) {
    be.copy(slot, shard_param.view());
  }
  if (layout.num_shards > 1) {
    Traced issue(trace, "all_gather", "issue", shard, n, param_dtype);
    r.work = shard.all_gather(send, r.full_param.data(), static_cast<std::size_t>(n), param_dtype,
                              *after);
    if (upload != nullptr) r.ready = r.work->done();
  }
  return r;
}

ReduceResult foreach_reduce(DeviceRuntime& be, Communicator& shard, Communicator& replicate,
                            const FlatParamLayout& layout, DeviceBuffer full_grad,
                            DeviceBuffer& shard_grad, bool shard_grad_empty, DType reduce_dtype,
                            Stream& stream, Stream& reduce_stream,
                            const CollectiveTrace& trace, DeviceRuntime* host) {
  check_shard(layout, shard_grad, "shard_grad");
  if (full_grad.numel() != layout.padded_numel) {
    throw Error("FSDP collectives: the gradient of unit " + layout.unit_name + " has " +
                std::to_string(full_grad.numel()) + " elements, its FlatParameter " +
                std::to_string(layout.padded_numel));
  }
  const int64_t n = layout.shard_numel;
  const DType rd = reduce_dtype;
  ReduceResult r;
  DeviceBuffer src = std::move(full_grad);
  if (layout.num_shards == 1 && replicate.size() == 1) {
    // Nothing sharded and nobody to reduce with (world size 1): accumulate into the fp32
    // shard now instead of staging a reduce_dtype copy until end_step. axpy reads src's
    // dtype; an fp32 or param_dtype reduce_dtype adds exactly what the staged copy held.
    DeviceBuffer cast;  // another 16-bit reduce_dtype: keep its rounding, one unit at a time
    const DeviceBuffer* add = &src;
    if (rd != DType::f32 && rd != src.dtype()) {
      cast = DeviceBuffer(be, rd, src.numel(), MemCategory::comm_buffers);
      be.cast(cast.view(), src.view());
      add = &cast;
    }
    if (host == nullptr) {
      be.axpy(shard_grad.view(), 1.f, add->view());
    } else {  // offload: staged to the host, where the caller adds it with the same axpy
      r.reduced = add == &src ? std::move(src) : std::move(cast);
      stage_reduced(be, *host, r, stream, reduce_stream, trace, shard, replicate, shard_grad,
                    shard_grad_empty);
    }
    return r;
  }
  if (rd != src.dtype()) {
    DeviceBuffer cast(be, rd, src.numel(), MemCategory::comm_buffers);
    be.cast(cast.view(), src.view());
    src = std::move(cast);
  }
  if (layout.num_shards == 1) {  // mixed precision without sharding: the grad is the shard
    r.reduced = std::move(src);
    if (replicate.size() > 1) {
      Traced issue(trace, "all_reduce", "issue", replicate, n, rd);
      r.all_reduce = replicate.all_reduce(r.reduced.data(), r.reduced.data(),
                                          static_cast<std::size_t>(n), rd, ReduceOp::avg, stream);
    }
    if (host != nullptr) {
      stage_reduced(be, *host, r, stream, reduce_stream, trace, shard, replicate, shard_grad,
                    shard_grad_empty);
    }
    return r;
  }
  void* recv = nullptr;
  if (rd == DType::f32 && shard_grad_empty && host == nullptr) {
    recv = shard_grad.data();
  } else {
    r.reduced = DeviceBuffer(be, rd, n, MemCategory::comm_buffers);
    recv = r.reduced.data();
  }
  {
    Traced issue(trace, "reduce_scatter", "issue", shard, n, rd);
    r.reduce_scatter = shard.reduce_scatter(src.data(), recv, static_cast<std::size_t>(n), rd,
                                            ReduceOp::avg, stream);
  }
  // The unsharded gradient goes back to the stream-ordered allocator with the collective's
  // completion event: it is reused only once the reduce-scatter has read it.
  src.reset(r.reduce_scatter->done());
  if (replicate.size() > 1) {
    // HSDP: the replica all-reduce of this shard follows its reduce-scatter at once, on the
    // reduction stream, so the inter-replica traffic overlaps the rest of backward.
    {
      StepTimer::Scope waiting(trace.timer, Phase::comm_wait);
      Traced wait(trace, "reduce_scatter", "wait", shard, n, rd);
      reduce_stream.wait(*r.reduce_scatter->done());
    }
    Traced issue(trace, "all_reduce", "issue", replicate, n, rd);
    r.all_reduce = replicate.all_reduce(recv, recv, static_cast<std::size_t>(n), rd, ReduceOp::avg,
                                        reduce_stream);
    r.all_reduce_on_reduce_stream = true;
  }
  if (host != nullptr) {
    stage_reduced(be, *host, r, stream, reduce_stream, trace, shard, replicate, shard_grad,
                  shard_grad_empty);
  }
  return r;
}

ReduceResult reduce_shard_grad(Communicator& replicate, const FlatParamLayout& layout,
                               DeviceBuffer& shard_grad, Stream& stream,
                               const CollectiveTrace& trace) {
  check_shard(layout, shard_grad, "shard_grad");
  ReduceResult r;
  if (replicate.size() > 1) {
    const int64_t n = layout.shard_numel;
    Traced issue(trace, "all_reduce", "issue", replicate, n, DType::f32);
    r.all_reduce = replicate.all_reduce(shard_grad.data(), shard_grad.data(),
                                        static_cast<std::size_t>(n), DType::f32, ReduceOp::avg,
                                        stream);
  }
  return r;
}

}  // namespace fsdp
