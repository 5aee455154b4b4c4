// Device buffers through a host communicator, staged in pinned host memory (see
// fsdp/cuda/staged_communicator.hpp).
#include "fsdp/cuda/staged_communicator.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/check.hpp"

namespace fsdp::cuda {
namespace {

class StagedWork final : public Work {
 public:
  StagedWork(std::shared_ptr<CudaEvent> done, cudaStream_t issuing)
      : done_(std::move(done)), issuing_(issuing) {}
  ~StagedWork() override {
    if (!waited_) cudaEventSynchronize(done_->handle());  // errors: nothing to do here
  }
  void wait() override {
    if (waited_) return;
    FSDP_CHECK_CUDA(cudaStreamWaitEvent(issuing_, done_->handle(), 0));
    waited_ = true;
  }
  std::shared_ptr<Event> done() override { return done_; }

 private:
  std::shared_ptr<CudaEvent> done_;
  cudaStream_t issuing_;
  bool waited_ = false;
};

// An event that was never recorded: complete, and a no-op to wait on.
std::unique_ptr<Work> finished_work(cudaStream_t issuing) {
  return std::make_unique<StagedWork>(std::make_shared<CudaEvent>(), issuing);
}

}  // namespace

std::unique_ptr<StagedCommunicator> StagedCommunicator::create(Communicator& host) {
  if (host.device() != Device::cpu) {
    throw Error("StagedCommunicator::create: the wrapped communicator must carry host memory "
                "(an MPI communicator); it carries device memory");
  }
  return std::make_unique<StagedCommunicator>(host.split(0, host.rank()));
}

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> host)
    : host_(std::move(host)) {
  if (!host_ || host_->device() != Device::cpu) {
    throw Error("StagedCommunicator: the wrapped communicator must carry host memory");
  }
  default_stream_ = std::make_unique<CudaStream>();
  copy_stream_ = std::make_unique<CudaStream>();
  ready_ = std::make_unique<CudaEvent>();
}

StagedCommunicator::~StagedCommunicator() {
  if (pinned_) {
    cudaStreamSynchronize(copy_stream_->handle());  // an upload may still read it
    cudaFreeHost(pinned_);
  }
}

char* StagedCommunicator::pinned(std::size_t bytes) {
  if (bytes > pinned_bytes_) {
    constexpr std::size_t kMiB = std::size_t{1} << 20;
    const std::size_t want = std::max(bytes, pinned_bytes_ + pinned_bytes_ / 2);
    const std::size_t rounded = (want + kMiB - 1) / kMiB * kMiB;
    FSDP_CHECK_CUDA(cudaStreamSynchronize(copy_stream_->handle()));
    if (pinned_) FSDP_CHECK_CUDA(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    FSDP_CHECK_CUDA(cudaMallocHost(&pinned_, rounded));
    pinned_bytes_ = rounded;
  }
  return static_cast<char*>(pinned_);
}

void StagedCommunicator::download(cudaStream_t after, char* dst, const void* src,
                                  std::size_t bytes) {
  const cudaStream_t cs = copy_stream_->handle();
  FSDP_CHECK_CUDA(cudaEventRecord(ready_->handle(), after));
  FSDP_CHECK_CUDA(cudaStreamWaitEvent(cs, ready_->handle(), 0));
  if (bytes > 0) FSDP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs));
  // Also completes the previous collective's upload from the pinned buffer, which the host
  // collective is about to overwrite.
  FSDP_CHECK_CUDA(cudaStreamSynchronize(cs));
}

std::unique_ptr<Work> StagedCommunicator::upload(cudaStream_t after, void* dst, const char* src,
                                                 std::size_t bytes) {
  const cudaStream_t cs = copy_stream_->handle();
  if (bytes > 0) FSDP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs));
  auto done = std::make_shared<CudaEvent>();
  FSDP_CHECK_CUDA(cudaEventRecord(done->handle(), cs));
  return std::make_unique<StagedWork>(std::move(done), after);
}

// Count 0: a Work that is already complete (nothing was issued). A group of one: recv = send
// on `stream` itself (no staging, no host wait), and an event recorded after the copy.
std::unique_ptr<Work> StagedCommunicator::local_impl(const char*, const void* send, void* recv,
                                                     std::size_t count, DType dtype,
                                                     Stream& stream) {
  const cudaStream_t after = native(stream);
  if (count == 0) return finished_work(after);
  if (recv != send) {
    FSDP_CHECK_CUDA(cudaMemcpyAsync(recv, send, count * dtype_size(dtype),
                                    cudaMemcpyDeviceToDevice, after));
  }
  auto done = std::make_shared<CudaEvent>();
  FSDP_CHECK_CUDA(cudaEventRecord(done->handle(), after));
  return std::make_unique<StagedWork>(std::move(done), after);
}

std::unique_ptr<Work> StagedCommunicator::all_gather_impl(const void* send, void* recv,
                                                          std::size_t count, DType dtype,
                                                          Stream& stream) {
  const cudaStream_t after = native(stream);
  const std::size_t bytes = count * dtype_size(dtype);
  // Host layout = recv; this rank's part goes to its slot, then an in-place all-gather.
  char* h = pinned(bytes * size());
  char* mine = h + bytes * rank();
  download(after, mine, send, bytes);
  host_->all_gather(mine, h, count, dtype)->wait();
  return upload(after, recv, h, bytes * size());
}

std::unique_ptr<Work> StagedCommunicator::reduce_scatter_impl(const void* send, void* recv,
                                                              std::size_t count, DType dtype,
                                                              ReduceOp op, Stream& stream) {
  const cudaStream_t after = native(stream);
  const std::size_t bytes = count * dtype_size(dtype);
  // Host layout = send; an in-place reduce-scatter leaves this rank's part in its slot.
  char* h = pinned(bytes * size());
  char* mine = h + bytes * rank();
  download(after, h, send, bytes * size());
  host_->reduce_scatter(h, mine, count, dtype, op)->wait();
  return upload(after, recv, mine, bytes);
}

std::unique_ptr<Work> StagedCommunicator::all_reduce_impl(const void* send, void* recv,
                                                          std::size_t count, DType dtype,
                                                          ReduceOp op, Stream& stream) {
  const cudaStream_t after = native(stream);
  const std::size_t bytes = count * dtype_size(dtype);
  char* h = pinned(bytes);
  download(after, h, send, bytes);
  host_->all_reduce(h, h, count, dtype, op)->wait();
  return upload(after, recv, h, bytes);
}

std::unique_ptr<Work> StagedCommunicator::broadcast_impl(void* buf, std::size_t count,
                                                         DType dtype, int root,
                                                         Stream& stream) {
  const cudaStream_t after = native(stream);
  const std::size_t bytes = count * dtype_size(dtype);
  char* h = pinned(bytes);
  const bool is_root = rank() == root;
  download(after, h, buf, is_root ? bytes : 0);
  host_->broadcast(h, count, dtype, root)->wait();
  return upload(after, buf, h, is_root ? 0 : bytes);
}

void StagedCommunicator::barrier() { host_->barrier(); }

std::unique_ptr<Communicator> StagedCommunicator::split(int color, int key) {
  return std::make_unique<StagedCommunicator>(host_->split(color, key));
}

std::unique_ptr<Communicator> StagedCommunicator::split_node() {
  return std::make_unique<StagedCommunicator>(host_->split_node());
}

}  // namespace fsdp::cuda
