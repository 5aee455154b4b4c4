// fsdp/cuda/staged_communicator.hpp: device buffers through a host communicator (MPI), for
// ranks that share one GPU, where NCCL refuses two ranks of a communicator on one device
// (tests and debugging at np > GPUs; the engine and trainer run unchanged on it).
//
// Each collective, ordered after `stream` (a CudaStream):
//   1. the communicator's copy stream waits on an event recorded on `stream`, copies the
//      input device -> pinned host (cudaMallocHost, cached and grown, owned here) and the
//      host waits for it (so the input `stream` produced is complete);
//   2. the host communicator runs the collective on the pinned buffer, in place, and the
//      host waits for it (MPI, blocking);
//   3. the result is copied host -> device on the copy stream and a completion CudaEvent is
//      recorded after it: Work::wait() makes `stream` wait on it (no host block), done() is
//      that event, a Work destroyed without wait() synchronizes it.
// Semantics are the wrapped communicator's (MpiCommunicator: bf16/fp16 sums rounded per
// step, avg = sum then divide by size()), in place included; avg on integer dtypes throws
// fsdp::Error before anything is issued; count 0 issues nothing; a group of one copies
// device to device on `stream` without staging.
//
// Cost: every collective blocks the host until `stream`'s work so far is done, moves its
// whole buffer over PCIe twice (all_gather: count elements down, size * count back;
// reduce_scatter: size * count down, count back) and runs a blocking host collective, so
// nothing overlaps: communication time adds to compute time. Pinned memory held: the largest
// buffer a collective has staged (all_gather / reduce_scatter: size * count elements). No
// timeout of its own: a hang is an MPI hang. Not for performance runs.
#pragma once

#include <cstddef>
#include <memory>

#include "fsdp/comm/communicator.hpp"
#include "fsdp/cuda/stream.hpp"

namespace fsdp::cuda {

class StagedCommunicator final : public Communicator {
 public:
  // Collective over `host` (must carry host memory: Device::cpu, else fsdp::Error): wraps a
  // duplicate of it, host.split(0, host.rank()). Streams and buffers on the current device.
  static std::unique_ptr<StagedCommunicator> create(Communicator& host);
  // Adopts `host` (a host-memory communicator not used elsewhere).
  explicit StagedCommunicator(std::unique_ptr<Communicator> host);
  ~StagedCommunicator() override;  // frees the pinned buffer; never throws
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* kind() const override { return "StagedCommunicator"; }
  Device device() const override { return Device::cuda; }
  Stream& default_stream() override { return *default_stream_; }
  Communicator& host() const { return *host_; }

  void barrier() override;  // the host communicator's barrier
  // StagedCommunicators over host().split(color, key) / split_node().
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_node() override;

 protected:
  std::unique_ptr<Work> all_gather_impl(const void* send, void* recv, std::size_t count,
                                        DType dtype, Stream& stream) override;
  std::unique_ptr<Work> reduce_scatter_impl(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, Stream& stream) override;
  std::unique_ptr<Work> all_reduce_impl(const void* send, void* recv, std::size_t count,
                                        DType dtype, ReduceOp op, Stream& stream) override;
  std::unique_ptr<Work> broadcast_impl(void* buf, std::size_t count, DType dtype, int root,
                                       Stream& stream) override;
  // Count 0: a complete Work. A group of one: dst = src device to device on `stream`.
  std::unique_ptr<Work> local_impl(const char* what, const void* send, void* recv,
                                   std::size_t count, DType dtype, Stream& stream) override;

 private:
  // Pinned host memory of at least `bytes`, idle (no copy in flight from or to it).
  char* pinned(std::size_t bytes);
  // Step 1: waits for `after`, then copies device src[bytes] to host dst (bytes may be 0).
  void download(cudaStream_t after, char* dst, const void* src, std::size_t bytes);
  // Step 3: host src[bytes] -> device dst on the copy stream; the Work for `after`.
  std::unique_ptr<Work> upload(cudaStream_t after, void* dst, const char* src, std::size_t bytes);

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<CudaStream> default_stream_, copy_stream_;
  std::unique_ptr<CudaEvent> ready_;
  void* pinned_ = nullptr;  // cudaMallocHost
  std::size_t pinned_bytes_ = 0;
};

}  // namespace fsdp::cuda
