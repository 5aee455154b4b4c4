// fsdp/comm/communicator.hpp: the one communication interface (flashlight's DistributedApi
// habit). The FSDP engine talks only to this; MPI (comm/mpi_communicator.hpp) and, with
// the CUDA backend, NCCL implement it, and both pass tests/test_comm.cpp.
//
// Stream semantics (PyTorch ProcessGroupNCCL's): a collective is issued after `stream`, the
// stream whose work produced its input (the compute stream): the communicator records an
// event on `stream`, makes its own communication stream wait on it, and enqueues the
// collective there. Work::wait() makes `stream` wait for the collective (the host does not
// block on a device); Work::done() is an event that completes with it, for freeing buffers
// into the stream-ordered allocator without waiting. Buffers must stay alive and untouched
// until then. A host-memory communicator (MPI over host buffers) runs non-blocking MPI
// collectives: wait() completes the MPI request, and done() is an event whose synchronize()
// does.
//
// Collectives on one communicator must be issued in the same order on every rank of it.
// Counts are elements of `dtype`. Every dtype is supported by every collective; ReduceOp::avg
// only by floating dtypes (sum, then divide by size(), as ncclAvg). The public collectives
// check their arguments here, once for every implementation, before the implementation
// sees them: ReduceOp::avg on an integer dtype and a broadcast root outside [0, size()) throw
// fsdp::Error "<kind()>::<collective>: ..." on the calling rank (nothing is issued).
//
// They also decide the trivial cases here, once: a collective with count 0, or on a group of
// one, exchanges nothing, and every one of them is then recv[count] = send[count] on this
// rank (all_gather and reduce_scatter over one rank, all_reduce with any op, avg included,
// since the average of one value is that value; nothing for count 0 or in place; broadcast is
// always in place). Those calls go to local_impl() instead of the collective's *_impl, which
// therefore only ever see count > 0 and size() > 1. The trivial case is decided from count and
// size() alone, so every rank of a group decides alike.
#pragma once

#include <cstddef>
#include <memory>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/core/stream.hpp"

namespace fsdp {

enum class ReduceOp { sum, max, avg };
template <>
struct EnumNames<ReduceOp> {  // to_string(ReduceOp): fsdp/core/enum_names.hpp
  static constexpr EnumName<ReduceOp> table[] = {
      {ReduceOp::sum, "sum"}, {ReduceOp::max, "max"}, {ReduceOp::avg, "avg"}};
};

class Work {
 public:
  virtual ~Work() = default;  // completes the collective if nobody waited (never throws)
  // Makes the issuing stream wait for the collective; after it, recv may be used on that
  // stream. Idempotent.
  virtual void wait() = 0;
  // An event that completes with the collective, its post-processing (avg division,
  // in-place moves) included.
  virtual std::shared_ptr<Event> done() = 0;
};

// Watches a communicator's blocking host waits (MpiCommunicator::set_wait_hook): the
// Runtime's watchdog (fsdp/train/watchdog.hpp) ends the job when a peer has exited or a wait
// exceeds comm.timeout_s, as PyTorch's ProcessGroupNCCL watchdog does with its `timeout`.
class WaitHook {
 public:
  virtual ~WaitHook() = default;
  // Called by the waiting thread about every kWaitHookInterval_s while collective `what`
  // ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier") has not completed
  // after `waited_s` seconds. It either returns (keep waiting) or ends the process
  // (MPI_Abort); it must not throw, since Work destructors wait too.
  virtual void waiting(const char* what, double waited_s) noexcept = 0;
};
inline constexpr double kWaitHookInterval_s = 0.25;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where buffers live: Device::cpu for host memory.
  virtual Device device() const = 0;
  // The stream collectives issued without one are ordered after (a host stream for MPI).
  virtual Stream& default_stream() = 0;

  // The implementation's name in error messages ("MpiCommunicator", "NcclCommunicator").
  virtual const char* kind() const { return "Communicator"; }

  // recv[size * count] = concatenation over ranks r of rank r's send[count] (in rank order).
  // send may alias recv + rank * count (in place, as ncclAllGather allows).
  std::unique_ptr<Work> all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                   Stream& stream) {
    if (trivial(count)) return local_impl("all_gather", send, recv, count, dtype, stream);
    return all_gather_impl(send, recv, count, dtype, stream);
  }
  // recv[count] = op over ranks of send[rank * count : (rank+1) * count]; send is
  // [size * count]. recv may alias send + rank * count (in place, as ncclReduceScatter);
  // then the rest of send is unspecified afterwards (out of place, send is untouched).
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DType dtype, ReduceOp op, Stream& stream) {
    check_op(dtype, op, "reduce_scatter");
    if (trivial(count)) return local_impl("reduce_scatter", send, recv, count, dtype, stream);
    return reduce_scatter_impl(send, recv, count, dtype, op, stream);
  }
  // recv[count] = op over ranks of send[count]; send == recv means in place.
  std::unique_ptr<Work> all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                   ReduceOp op, Stream& stream) {
    check_op(dtype, op, "all_reduce");
    if (trivial(count)) return local_impl("all_reduce", send, recv, count, dtype, stream);
    return all_reduce_impl(send, recv, count, dtype, op, stream);
  }
  // buf[count] on every rank = root's buf.
  std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                  Stream& stream) {
    check_root(root);
    if (trivial(count)) return local_impl("broadcast", buf, buf, count, dtype, stream);
    return broadcast_impl(buf, count, dtype, root, stream);
  }
  // The same, ordered after default_stream().
  std::unique_ptr<Work> all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
    return all_gather(send, recv, count, dtype, default_stream());
  }
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DType dtype, ReduceOp op) {
    return reduce_scatter(send, recv, count, dtype, op, default_stream());
  }
  std::unique_ptr<Work> all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                   ReduceOp op) {
    return all_reduce(send, recv, count, dtype, op, default_stream());
  }
  std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DType dtype, int root) {
    return broadcast(buf, count, dtype, root, default_stream());
  }
  virtual void barrier() = 0;

  // New communicators (collective over this one, MPI_Comm_split semantics): ranks passing
  // the same color form a group, ordered by key then by rank here.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The ranks of this communicator on this rank's node (MPI_COMM_TYPE_SHARED).
  virtual std::unique_ptr<Communicator> split_node() = 0;

 protected:
  // The collectives proper, called by the public ones above after their checks, only with
  // count > 0 on a group of size() > 1.
  virtual std::unique_ptr<Work> all_gather_impl(const void* send, void* recv, std::size_t count,
                                                DType dtype, Stream& stream) = 0;
  virtual std::unique_ptr<Work> reduce_scatter_impl(const void* send, void* recv,
                                                    std::size_t count, DType dtype, ReduceOp op,
                                                    Stream& stream) = 0;
  virtual std::unique_ptr<Work> all_reduce_impl(const void* send, void* recv, std::size_t count,
                                                DType dtype, ReduceOp op, Stream& stream) = 0;
  virtual std::unique_ptr<Work> broadcast_impl(void* buf, std::size_t count, DType dtype,
                                               int root, Stream& stream) = 0;
  // A collective that exchanges nothing (count 0, or a group of one): recv[count] =
  // send[count], nothing to do when count == 0 or send == recv (broadcast passes its buffer as
  // both), ordered after `stream` as collective `what` ("all_gather", "reduce_scatter",
  // "all_reduce", "broadcast") would be, returning its Work. Implementations give it their
  // own stream and Work semantics (MpiCommunicator checks and synchronizes the stream as its
  // collectives do; NcclCommunicator enqueues the copy on its communication stream under
  // its watchdog; StagedCommunicator copies device to device on `stream`).
  // The default serves host-memory communicators (device() == Device::cpu) with nothing to
  // order against: it copies at once, without synchronizing `stream`, and returns a complete
  // Work whose done() is a HostEvent; for device memory it throws fsdp::Error (such a
  // communicator must override it).
  virtual std::unique_ptr<Work> local_impl(const char* what, const void* send, void* recv,
                                           std::size_t count, DType dtype, Stream& stream);

 private:
  // Whether a collective of `count` elements exchanges nothing.
  bool trivial(std::size_t count) const { return count == 0 || size() == 1; }
  // The opening checks of the collectives (see the header); throw fsdp::Error.
  void check_op(DType dtype, ReduceOp op, const char* what) const;
  void check_root(int root) const;
};

}  // namespace fsdp
