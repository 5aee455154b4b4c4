// fsdp/fsdp/collectives.hpp: the FSDP engine's two per-unit collectives, unshard
// (all-gather of a FlatParameter) and reduce (reduce-scatter / all-reduce of its gradient),
// as free functions that return the buffer they fill and the Work that completes it, as
// PyTorch FSDP2's foreach_all_gather / foreach_reduce do
// (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). FSDP2 runs "foreach" over the
// parameters of an FSDPParamGroup; here a unit's parameters are already one FlatParameter
// (fsdp/fsdp/flat_param.hpp), so each function moves one flat buffer.
//
// The engine (fsdp/fsdp/engine.hpp) decides when to call them and owns the results; these
// functions only allocate, cast and issue. Nothing here blocks the host except where a
// host-memory communicator (MPI) completes a collective on a host stream's wait.
//
// Layout: a unit's FlatParameter has padded_numel = num_shards * shard_numel elements; shard
// s is elements [s * shard_numel, (s+1) * shard_numel). Counts passed to the communicator are
// shard_numel. Shards and gradient shards are fp32; the full buffers use the
// mixed-precision param_dtype, the reduction buffers reduce_dtype
// (torch.distributed.fsdp.MixedPrecisionPolicy).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/core/profiler.hpp"
#include "fsdp/fsdp/flat_param.hpp"
#include "fsdp/fsdp/step_timer.hpp"

namespace fsdp {

// How the caller observes the collectives issued here (all optional).
struct CollectiveTrace {
  // Host ranges "collective" around each issue and each host-side ordering wait.
  Profiler* profiler = nullptr;
  // A host-side ordering wait (foreach_reduce's RS -> AR hand-off) is a Phase::comm_wait.
  StepTimer* timer = nullptr;
  // Names a recording range: op "all_gather" / "reduce_scatter" / "all_reduce", stage
  // "issue" / "wait", the group, the count passed to the collective and its dtype.
  std::function<void(ProfileRange&, const char* op, const char* stage, const Communicator&,
                     int64_t numel, DType dtype)>
      describe;
};

// Names a recording range "<op> <stage> unit U (name)" (for unit < 0, "<op> <stage> name",
// e.g. "all_gather issue grad_norm") with the args unit, unit_name, in_bytes and out_bytes
// (this rank's input and output buffers of the collective), dtype and ranks (the group's
// size). `numel`: the count passed to the collective (a unit's shard_numel).
void describe_collective(ProfileRange& range, const char* op, const char* stage, int unit,
                         const std::string& name, const Communicator& comm, int64_t numel,
                         DType dtype);

// ---- unshard ----

// FSDP2's AllGatherResult: the unsharded buffer and the collective filling it.
struct AllGatherResult {
  DeviceBuffer full_param;     // param_dtype [layout.padded_numel], MemCategory::unsharded_params
  std::unique_ptr<Work> work;  // the all-gather into full_param; null when nothing is gathered
  // With a HostUpload: completes when full_param is filled (the all-gather's done(), or the
  // copy's with one shard). The reading stream must wait on it (after work->wait(), which
  // orders only the copy stream the all-gather was issued after).
  std::shared_ptr<Event> ready;
};

// CPU offload's source for this rank's slot: the shard already in param_dtype in host memory
// (the engine casts it once per optimizer step), page-locked on CUDA so that the copy
// overlaps the compute stream.
struct HostUpload {
  const void* src = nullptr;  // param_dtype [layout.shard_numel], host memory
  Stream* stream = nullptr;   // the copy stream (the backend's): the copy, then the all-gather
};

// Unshards a FlatParameter (FSDP2 foreach_all_gather + the copy-out of wait_for_unshard,
// which here is none: the gather lands in place). Allocates full_param, casts this rank's
// fp32 shard_param [layout.shard_numel] to param_dtype into its slot
// [rank * shard_numel, (rank+1) * shard_numel) on the backend's compute stream (skipped for
// fp32: the shard is sent as is), then all-gathers over `shard` (issued after `stream`) into
// full_param, in place. With one shard (layout.num_shards == 1) nothing is issued: work is
// null and full_param holds the cast shard. full_param may be read on `stream` after
// work->wait(); it must outlive work. shard_param may also be the shard already in
// param_dtype (fsdp.offload_optimizer's device-resident copy): it is then sent (or, at one
// shard, copied) as is. Throws fsdp::Error if layout.num_shards differs from shard.size() or
// shard_param is not fp32 or param_dtype [shard_numel]; a communicator's errors propagate.
// `upload` (CPU offload: shard_param is in host memory, only checked for its size here):
// the slot is filled from upload->src by a copy on upload->stream (be.copy_from_host_async)
// that starts once `stream`'s work so far is done (the slot may reuse memory it freed), and
// the all-gather is issued after that copy, not after `stream`: both overlap what `stream`
// runs meanwhile (a unit prefetched during the previous unit's compute). full_param may be
// read on `stream` after work->wait() and stream.wait(*ready); upload->src must stay
// unchanged until `ready` completes.
AllGatherResult foreach_all_gather(DeviceRuntime& be, Communicator& shard,
                                   const FlatParamLayout& layout, const DeviceBuffer& shard_param,
                                   DType param_dtype, Stream& stream,
                                   const CollectiveTrace& trace = {},
                                   const HostUpload* upload = nullptr);

// ---- reduce ----

// A device buffer's copy in host memory (CPU offload's gradient staging), complete once
// `copied` completes. Either it went into new host memory (`host`) that the caller then adds
// into (or, `assign`, writes into: the destination held nothing) the destination, or it
// `landed` in the destination itself (`host` empty): the copy is the result, nothing to add.
struct HostStaging {
  DeviceBuffer host;
  std::shared_ptr<Event> copied;
  bool landed = false;  // the copy went straight into the destination
  bool assign = false;  // !landed: the destination holds nothing; write it instead of adding
  explicit operator bool() const { return copied != nullptr; }
};

// Enqueues on `copy_stream`, after the work enqueued on `after` so far (null: after only what
// copy_stream already waits for), a copy of `device` into `into` (host memory of at least
// device.numel() elements of device.dtype(), e.g. a page-locked gradient shard: the result is
// `landed`) or, with `into` null, into new host memory of `host_runtime` (same dtype and size,
// MemCategory::comm_buffers), and frees `device` behind the copy (the allocator reuses it once
// the copy has read it). Nothing blocks the host on a device stream.
HostStaging stage_to_host(DeviceRuntime& be, DeviceRuntime& host_runtime, DeviceBuffer& device,
                          Stream* after, Stream& copy_stream, void* into = nullptr);

// FSDP2's foreach_reduce result: where the reduced gradient shard lands and the collectives
// producing it. The caller waits for the works (reduce_scatter first), then adds `reduced`
// into the fp32 gradient shard (if reduced is empty, the result is already in it).
struct ReduceResult {
  DeviceBuffer reduced;                  // reduce_dtype [shard_numel], MemCategory::comm_buffers;
                                         // empty when the result lands in shard_grad itself
  std::unique_ptr<Work> reduce_scatter;  // over the shard group, issued after `stream`
  std::unique_ptr<Work> all_reduce;      // over the replicate group (see below)
  // True when the all-reduce was issued on the reduction stream after reduce_scatter's
  // completion (HSDP): all_reduce->wait() orders that stream, so the caller's stream must
  // wait on all_reduce->done().
  bool all_reduce_on_reduce_stream = false;
  // CPU offload: the reduced shard copied to the host (reduce_dtype [shard_numel]) on the
  // reduction stream; `reduced` is then empty (freed once the copy has read it). The caller
  // waits for the works, then staged.copied->synchronize(), then adds staged.host into the
  // shard (writes it, staged.assign), or nothing if the copy landed in the shard.
  HostStaging staged;
};

// Reduces a unit's unsharded gradient (PyTorch FSDP2 foreach_reduce; FSDP1's
// _post_backward_hook / _reduce_grad): full_grad (param_dtype [layout.padded_numel], moved in
// and freed here with the completion event of the collective reading it) is cast to
// reduce_dtype on the compute stream when the dtypes differ, then
//  - num_shards > 1: reduce-scattered with ReduceOp::avg over `shard` (issued after
//    `stream`) into `reduced`, or straight into shard_grad when reduce_dtype is fp32 and
//    shard_grad holds nothing (`shard_grad_empty`, so it is 0 and overwriting it is the
//    sum). If replicate.size() > 1 (HYBRID_SHARD / HSDP) the replica all-reduce (avg, in
//    place on the reduce-scatter's output) follows at once on `reduce_stream`: that stream
//    first waits for the reduce-scatter's completion event, then the all-reduce is issued
//    after it, as PyTorch orders HSDP's all-reduce after the reduce-scatter on its
//    reduce-scatter / all-reduce stream. On a device stream nothing blocks the host and the
//    compute stream is not held; on a host stream (MPI) the host waits for the
//    reduce-scatter here.
//  - num_shards == 1: the cast gradient is the shard (`reduced`); if replicate.size() > 1 it
//    is all-reduced (avg) over `replicate` after `stream`.
//  - num_shards == 1 and replicate.size() == 1 (world size 1): nothing to communicate; the
//    gradient is added into shard_grad on the compute stream at once (a 16-bit reduce_dtype
//    other than full_grad's dtype is cast first, keeping its rounding) and the result is
//    empty.
// `host` (CPU offload): shard_grad lives in that runtime's (host) memory. A reduce-scatter
// then never lands in it: once the last collective of the unit completes, the reduction stream
// copies the reduced shard to the host (`staged`) and the device buffer is freed behind that
// copy, so the copy overlaps the rest of backward on CUDA; at world size 1 the gradient (or
// its 16-bit reduce_dtype cast, as above) is staged the same way once `stream` has produced
// it. With shard_grad_empty, an fp32 copy lands in shard_grad itself (its 0 + x is exact, as
// the reduce-scatter's above) and a 16-bit one is marked `assign`. The caller waits for the
// works, then staged.copied->synchronize(), and adds (assign: casts) staged.host into
// shard_grad unless the copy landed there.
// Every rank of a group must call this for the same units in the same order (the
// collectives' order). Throws fsdp::Error on mismatched sizes (full_grad not
// [padded_numel], shard_grad not fp32 [shard_numel]); a communicator's errors propagate.
ReduceResult foreach_reduce(DeviceRuntime& be, Communicator& shard, Communicator& replicate,
                            const FlatParamLayout& layout, DeviceBuffer full_grad,
                            DeviceBuffer& shard_grad, bool shard_grad_empty, DType reduce_dtype,
                            Stream& stream, Stream& reduce_stream,
                            const CollectiveTrace& trace = {}, DeviceRuntime* host = nullptr);

// The fp32 path without a full gradient (one shard, param_dtype fp32: backward accumulated
// into shard_grad [shard_numel] directly): all-reduces shard_grad in place (avg) over
// `replicate` after `stream` when replicate.size() > 1 (NO_SHARD, PyTorch DDP's all-reduce),
// else returns an empty result. Throws fsdp::Error if shard_grad is not fp32 [shard_numel].
ReduceResult reduce_shard_grad(Communicator& replicate, const FlatParamLayout& layout,
                               DeviceBuffer& shard_grad, Stream& stream,
                               const CollectiveTrace& trace = {});

}  // namespace fsdp
