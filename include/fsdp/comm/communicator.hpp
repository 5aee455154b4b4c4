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
#pragma once

#include <cstddef>
#include <memory>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/stream.hpp"

namespace fsdp {

enum class ReduceOp { sum, max, avg };
const char* to_string(ReduceOp op);

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
    return all_gather_impl(send, recv, count, dtype, stream);
  }
  // recv[count] = op over ranks of send[rank * count : (rank+1) * count]; send is
  // [size * count]. recv may alias send + rank * count (in place, as ncclReduceScatter);
  // then the rest of send is unspecified afterwards (out of place, send is untouched).
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DType dtype, ReduceOp op, Stream& stream) {
    check_op(dtype, op, "reduce_scatter");
    return reduce_scatter_impl(send, recv, count, dtype, op, stream);
  }
  // recv[count] = op over ranks of send[count]; send == recv means in place.
  std::unique_ptr<Work> all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                   ReduceOp op, Stream& stream) {
    check_op(dtype, op, "all_reduce");
    return all_reduce_impl(send, recv, count, dtype, op, stream);
  }
  // buf[count] on every rank = root's buf.
  std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                  Stream& stream) {
    check_root(root);
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
  virtual std::unique_ptr<Work> all_gather_impl(const void* send, void* recv, std::size_t count,
                                                DType dtype, Stream& stream) = 0;
  virtual std::unique_ptr<Work> reduce_scatter_impl(const void* send, void* recv,
                                                    std::size_t count, DType dtype, ReduceOp op,
                                                    Stream& stream) = 0;
  virtual std::unique_ptr<Work> all_reduce_impl(const void* send, void* recv, std::size_t count,
                                                DType dtype, ReduceOp op, Stream& stream) = 0;
  virtual std::unique_ptr<Work> broadcast_impl(void* buf, std::size_t count, DType dtype,
                                               int root, Stream& stream) = 0;

 private:
  // The opening checks of the collectives (see the header); throw fsdp::Error.
  void check_op(DType dtype, ReduceOp op, const char* what) const;
  void check_root(int root) const;
};

}  // namespace fsdp
