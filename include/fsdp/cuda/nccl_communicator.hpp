// fsdp/cuda/nccl_communicator.hpp: Communicator over NCCL, for buffers in CUDA device memory
// (device() == Device::cuda), one device per rank.
//
// Creation (llm.c / nccl-tests habit): rank 0 of a host bootstrap communicator (an
// MpiCommunicator) calls ncclGetUniqueId and broadcasts the id over it; every rank then calls
// ncclCommInitRankConfig on `device` with a non-blocking config (blocking = 0), so that a
// peer that never arrives makes init time out (and the communicator be aborted) instead of
// hanging. The ranks then agree over the bootstrap communicator whether every init succeeded,
// so a failure on one rank (e.g. NCCL's "duplicate GPU": two ranks of one communicator on one
// device, which NCCL refuses) is reported on every rank.
//
// The communicator keeps a duplicate of the bootstrap communicator: split() and split_node()
// split it (MPI_Comm_split semantics, collective over this communicator's ranks) and run the
// same creation over each result, i.e. every sub-group gets a fresh ncclUniqueId and
// ncclCommInitRankConfig (not ncclCommSplit, which has no split_node). A group of one makes
// no NCCL communicator (nothing would call it; its init and destruction cost ~0.5 s): its
// collectives are plain cudaMemcpyAsync copies on the communication stream, with the same
// flights, watchdog, timeouts and abort as every other group.
//
// Streams (PyTorch ProcessGroupNCCL's scheme): a collective issued after `stream` records an
// event on it, makes the communicator's own communication stream (a CudaStream of the
// highest priority) wait on it, runs the NCCL call there and records a completion CudaEvent.
// Work::wait() makes `stream` wait on that event (cudaStreamWaitEvent: the host never
// blocks); Work::done() is that CudaEvent itself (so CudaStream::wait on it stays on the
// device). `stream` must be a CudaStream. Collectives of one communicator run in issue order
// on its communication stream. A Work destroyed without wait() blocks the host until its
// collective completes (bounded, as below).
//
// Dtypes and ops: ncclFloat, ncclDouble, ncclBfloat16, ncclHalf, ncclInt32, ncclInt64,
// ncclUint8; sum, max, and avg = ncclAvg (floating dtypes only: fsdp::Error for integer
// dtypes, thrown before anything is issued). In place as ncclAllGather / ncclReduceScatter
// define it (send == recv + rank * count, recv == send + rank * count). Count 0 issues
// nothing on the device.
//
// Timeouts (`timeout_s`, counted from the moment a collective is issued): NCCL cannot time
// a collective out by itself, so
//   - every host wait of this communicator (a Work destroyed without wait(), barrier(),
//     non-blocking NCCL calls settling, init) polls cudaEventQuery and
//     ncclCommGetAsyncError until done or the deadline, and
//   - a watchdog thread per communicator (it makes no MPI call) polls the same for every
//     collective in flight, which covers host waits outside the communicator (a stream or
//     event synchronize in the trainer).
// On a timeout or an asynchronous NCCL error the communicator is aborted (ncclCommAbort:
// NCCL kernels in flight exit, so a host blocked in a synchronize returns, with garbage in
// the buffers) and the failure is kept: the host wait that saw it throws, and every later
// call on the communicator or its Works (issue, wait, barrier, split) throws the same
// fsdp::Error (exit code 1):
//   NCCL collective all_reduce did not finish within 600 s on rank 3 on gpu-node-2;
//   communicator aborted
// (rank = MPI world rank). The watchdog also prints that line to stderr when it is the one
// that detects the failure, since the main thread may be blocked elsewhere.
//
// Thread safety: one thread issues (the MPI-funnelled main thread); the communicator's own
// mutex serialises its NCCL calls with the watchdog's. The destructor never throws: it stops
// the watchdog, then ncclCommFinalize (waiting, bounded by timeout_s, for every rank to
// quiesce) and ncclCommDestroy, or ncclCommAbort if that fails or times out or the
// communicator was already aborted. Works and done() events may outlive the communicator.
#pragma once

#include <memory>
#include <thread>

#include "fsdp/comm/communicator.hpp"
#include "fsdp/cuda/stream.hpp"

namespace fsdp::cuda {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (a host communicator: Device::cpu, else fsdp::Error). The
  // NCCL communicator has bootstrap's ranks and size; `device` becomes the calling thread's
  // current device. timeout_s > 0 bounds init and every collective (see above).
  static std::unique_ptr<NcclCommunicator> create(Communicator& bootstrap, int device,
                                                  double timeout_s);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "NcclCommunicator"; }
  Device device() const override { return Device::cuda; }
  // A CudaStream owned by the communicator (normal priority), for collectives issued without
  // one; not the communication stream.
  Stream& default_stream() override { return *default_stream_; }
  int cuda_device() const { return device_; }
  double timeout_s() const { return timeout_s_; }

  // An all-reduce of one int on the communication stream and a bounded host wait for it:
  // returns once every rank has reached it and this communicator's earlier collectives are
  // complete.
  void barrier() override;
  // New NCCL communicators over bootstrap().split(color, key) / split_node(), same device
  // and timeout. Collective over this communicator.
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_node() override;

  // ncclCommAbort now (idempotent): collectives in flight stop; every later call throws.
  void abort() noexcept;
  bool aborted() const noexcept;

  // The host communicator this one was bootstrapped over (a duplicate owned here).
  Communicator& bootstrap() const { return *bootstrap_; }

  struct State;  // shared with Works and the watchdog (src/cuda/nccl_communicator.cpp)

 protected:
  std::unique_ptr<Work> all_gather_impl(const void* send, void* recv, std::size_t count,
                                        DType dtype, Stream& stream) override;
  std::unique_ptr<Work> reduce_scatter_impl(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, Stream& stream) override;
  std::unique_ptr<Work> all_reduce_impl(const void* send, void* recv, std::size_t count,
                                        DType dtype, ReduceOp op, Stream& stream) override;
  std::unique_ptr<Work> broadcast_impl(void* buf, std::size_t count, DType dtype, int root,
                                       Stream& stream) override;
  // Count 0 or a group of one: a cudaMemcpyAsync (send != recv) issued as a collective.
  std::unique_ptr<Work> local_impl(const char* what, const void* send, void* recv,
                                   std::size_t count, DType dtype, Stream& stream) override;

 private:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, int device, double timeout_s);
  static std::unique_ptr<NcclCommunicator> create_owned(std::unique_ptr<Communicator> bootstrap,
                                                        int device, double timeout_s);
  void init();  // unique-id exchange, ncclCommInitRankConfig, agreement, watchdog start
               // (a group of one: the watchdog only)
  void shutdown() noexcept;
  template <class Enqueue>
  std::unique_ptr<Work> issue(const char* name, cudaStream_t after, Enqueue&& enqueue);

  std::unique_ptr<Communicator> bootstrap_;
  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_s_ = 0;
  std::unique_ptr<CudaStream> default_stream_, comm_stream_;
  std::unique_ptr<CudaEvent> ready_;  // re-recorded on the issuing stream per collective
  void* scratch_ = nullptr;           // one int32 on the device, for barrier()
  std::shared_ptr<State> state_;
  std::thread watchdog_;
};

}  // namespace fsdp::cuda
