// fsdp/cuda/device.hpp: which CUDA device a rank uses. One device per rank where there are
// enough of them: rank `local_rank` of a node takes device local_rank % count, so ranks
// share devices round-robin when a node runs more ranks than it has GPUs (then NCCL cannot
// be used between the ranks that share one: see fsdp/cuda/staged_communicator.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp::cuda {

// CUDA devices visible to this process (after CUDA_VISIBLE_DEVICES); 0 when there is no
// driver, no device or any other error. Never throws.
int visible_device_count() noexcept;

// cudaSetDevice(local_rank % visible_device_count()) on the calling thread; returns that
// device. Throws fsdp::Error when no device is visible or local_rank < 0.
int select_device(int local_rank);

// The device's product name ("NVIDIA H100 80GB HBM3"), for the start-up banner. Throws
// fsdp::Error for an invalid device.
std::string device_name(int device);

// Free and total memory of `device` in bytes (cudaMemGetInfo, after cudaSetDevice(device));
// what the trainer compares with its memory plan. Throws fsdp::Error for an invalid device.
struct DeviceMemory {
  int64_t free = 0;
  int64_t total = 0;
};
DeviceMemory device_memory(int device);

// Page-locked host memory (portable across devices), for fsdp.cpu_offload's shards: copies
// between it and the device run at the link's full speed. Below 64 MiB, cudaHostAlloc.
// From 64 MiB (a 7B's shards, gradients and AdamW state: ~112 GB in ~1 GB blocks), the
// pages are mapped (mmap), first touched by `threads` threads in parallel, then pinned
// with one cudaHostRegister: cudaHostAlloc faults and pins every page on the calling thread,
// which dominates a 7B's start-up. PyTorch's CachingHostAllocator does the same with
// PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:N.
// The contents are unspecified (zero pages in practice). Returns nullptr (and clears the
// CUDA error) when the driver cannot pin `bytes` more; never throws.
// pinned_host_free(nullptr) does nothing; it frees either kind the way it was allocated.
void* pinned_host_alloc(std::size_t bytes, int threads = 1) noexcept;
void pinned_host_free(void* ptr) noexcept;

}  // namespace fsdp::cuda
