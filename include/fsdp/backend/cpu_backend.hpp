// fsdp/backend/cpu_backend.hpp: the CPU backend (fp32, OpenBLAS GEMMs, OpenMP loops).
// The numerical reference the CUDA backend is tested against, and what CI runs.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "fsdp/backend/backend.hpp"

namespace fsdp {

// Where the backend's memory comes from: blocks of at least 256-byte alignment, or nullptr
// when out of memory (the caching allocator then empties its cache and retries, then
// throws). Both functions are given, or neither (aligned_host_allocator()).
struct HostAllocator {
  std::function<void*(std::size_t bytes)> allocate;
  std::function<void(void*)> free;
};

// aligned_alloc (256 bytes, the size rounded up to it; nullptr on overflow) and free: the
// CPU backend's default, and the fallback of fsdp.cpu_offload's page-locked memory on CUDA.
HostAllocator aligned_host_allocator();

// num_threads: threads of the backend's one OpenMP pool (>= 1; OpenBLAS runs single-threaded
// inside its regions). Cores are not bound here: the Runtime binds them first
// (setup_cpu_threads, fsdp/backend/cpu_threads.hpp). `allocator` (optional): its memory, e.g.
// page-locked host memory for fsdp.cpu_offload on CUDA (cuda::pinned_host_allocator). Throws
// fsdp::Error if num_threads < 1.
std::unique_ptr<Backend> make_cpu_backend(int num_threads, HostAllocator allocator = {});

}  // namespace fsdp
