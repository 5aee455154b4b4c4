// CUDA device discovery and selection (see fsdp/cuda/device.hpp).
#include "fsdp/cuda/device.hpp"

#include <cuda_runtime.h>

#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/cuda/check.hpp"

namespace fsdp::cuda {

int visible_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error so later calls do not report it
    return 0;
  }
  return count > 0 ? count : 0;
}

int select_device(int local_rank) {
  const int count = visible_device_count();
  if (count == 0) {
    throw Error(std::string("no CUDA device visible (") + fsdp::where() +
                "): check the driver and CUDA_VISIBLE_DEVICES, or run the CPU backend");
  }
  if (local_rank < 0) {
    throw Error("select_device: local rank " + std::to_string(local_rank) + " is negative");
  }
  const int device = local_rank % count;
  FSDP_CHECK_CUDA(cudaSetDevice(device));
  return device;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  FSDP_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

DeviceMemory device_memory(int device) {
  FSDP_CHECK_CUDA(cudaSetDevice(device));
  std::size_t free = 0, total = 0;
  FSDP_CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return {static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

void* pinned_host_alloc(std::size_t bytes) noexcept {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no error for the next call to report
    return nullptr;
  }
  return p;
}

void pinned_host_free(void* ptr) noexcept {
  if (ptr) cudaFreeHost(ptr);
}

}  // namespace fsdp::cuda
