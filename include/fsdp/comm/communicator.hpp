// fsdp/comm/communicator.hpp: the one communication interface (flashlight's DistributedApi
// habit). The FSDP engine talks only to this; MPI (comm/mpi_communicator.hpp) and, with
// the CUDA backend, NCCL implement it.
//
// Collectives are asynchronous: each returns a Work handle and the buffers must stay alive
// and untouched until Work::wait() returns. For NCCL, the collective is enqueued on the
// communicator's stream and wait() makes the compute stream wait on its event (the host
// does not block); for MPI, wait() completes the non-blocking MPI request. Collectives on
// one communicator must be issued in the same order on every rank of it.
#pragma once

#include <cstddef>
#include <memory>

#include "fsdp/core/dtype.hpp"

namespace fsdp {

enum class ReduceOp { sum, max };

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;  // idempotent
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[size * count] = concatenation over ranks r of rank r's send[count] (in rank order).
  // send may alias recv + rank * count (in-place, as ncclAllGather allows).
  virtual std::unique_ptr<Work> all_gather(const void* send, void* recv, std::size_t count,
                                           DType dtype) = 0;
  // recv[count] = op over ranks of send[rank * count : (rank+1) * count]; send is
  // [size * count]. recv must not alias send.
  virtual std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                               DType dtype, ReduceOp op) = 0;
  // recv[count] = op over ranks of send[count]; send == recv means in place.
  virtual std::unique_ptr<Work> all_reduce(const void* send, void* recv, std::size_t count,
                                           DType dtype, ReduceOp op) = 0;
  // buf[count] on every rank = root's buf. Blocking.
  virtual void broadcast(void* buf, std::size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace fsdp
