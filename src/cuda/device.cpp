// CUDA device discovery and selection (see fsdp/cuda/device.hpp).
#include "fsdp/cuda/device.hpp"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

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

namespace {
constexpr std::size_t kRegisterFrom = std::size_t{64} << 20;  // bytes

// The blocks pinned by cudaHostRegister, with their mapped length (for munmap).
struct Registered {
  std::mutex mu;
  std::unordered_map<void*, std::size_t> bytes;
};
Registered& registered() {
  static Registered* r = new Registered;  // leaked: frees may run during static destruction
  return *r;
}

// Writes one byte of every page of [p, p + bytes) from `threads` threads (the first touch
// that maps it); one thread if no more can be started.
void touch_pages(char* p, std::size_t bytes, int threads) {
  constexpr std::size_t kPage = 4096;
  const std::size_t pages = (bytes + kPage - 1) / kPage;
  const auto n = static_cast<std::size_t>(std::clamp<std::size_t>(
      static_cast<std::size_t>(std::max(threads, 1)), 1, std::max<std::size_t>(pages / 4096, 1)));
  run_parts(static_cast<int64_t>(n), [&](int64_t t) {
    const auto u = static_cast<std::size_t>(t);
    for (std::size_t i = pages * u / n; i < pages * (u + 1) / n; ++i) p[i * kPage] = 0;
  });
}
}  // namespace

void* pinned_host_alloc(std::size_t bytes, int threads) noexcept {
  if (bytes == 0) return nullptr;
  if (bytes >= kRegisterFrom) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    touch_pages(static_cast<char*>(p), bytes, threads);
    if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
      cudaGetLastError();  // not sticky: leave no error for the next call to report
      munmap(p, bytes);
      return nullptr;
    }
    try {
      std::lock_guard<std::mutex> lock(registered().mu);
      registered().bytes.emplace(p, bytes);
    } catch (...) {  // no memory for the entry: give the block back
      cudaHostUnregister(p);
      munmap(p, bytes);
      return nullptr;
    }
    return p;
  }
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void pinned_host_free(void* ptr) noexcept {
  if (!ptr) return;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(registered().mu);
    const auto it = registered().bytes.find(ptr);
    if (it != registered().bytes.end()) {
      bytes = it->second;
      registered().bytes.erase(it);
    }
  }
  if (bytes) {
    cudaHostUnregister(ptr);
    munmap(ptr, bytes);
    return;
  }
  cudaFreeHost(ptr);
}

}  // namespace fsdp::cuda
