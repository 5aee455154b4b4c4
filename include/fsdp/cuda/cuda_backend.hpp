// fsdp/cuda/cuda_backend.hpp: the CUDA backend (every Backend kernel of
// fsdp/backend/backend.hpp on one NVIDIA GPU). The CPU backend (fsdp/backend/cpu_backend.hpp)
// is its numerical reference: same formulas, fp32 compute over fp32/bf16/fp16 storage, and
// tests/test_cuda_kernels.cpp runs every kernel on both and compares.
//
// What the backend owns (all released by its destructor, which never throws):
//  - the compute stream (a CudaStream of default priority) every kernel is enqueued on;
//    create_stream() makes streams of the highest priority (communication);
//  - a cuBLAS handle (strided-batched attention GEMMs) and a cuBLASLt handle (gemm), both
//    bound to the compute stream, and one 32 MiB GEMM workspace shared by them;
//  - a stream-ordered CachingAllocator over cudaMalloc/cudaFree reporting to its
//    MemoryTracker. Kernel scratch (attention scores, reduction partials, the fp32 copy of a
//    16-bit embedding gradient) comes from it as MemCategory::activations, for the duration
//    of one call: a steady-state step makes no cudaMalloc;
//  - a device error word: token and target indices live in device memory, so an index out
//    of range is recorded by the kernel (which skips it) and reported as fsdp::Error by the
//    next synchronize() or copy_to_host(), naming the kernel, the position and the value.
//
// The environment, read once by the constructor (A/Bs in one binary):
//  - FSDP_GEMM_EPILOGUES=0: cuBLASLt's fused bias / GELU epilogues off (unfused kernels);
//  - FSDP_SMALL_READS=kernel|copy (default copy): with `kernel`, copy_to_host of at most
//    4096 bytes (a step's loss, norms, clip coefficient, overflow flag) and the error word
//    are read by one kernel storing into mapped page-locked memory instead of
//    cudaMemcpyAsync, so they cannot queue behind another stream's bulk device-to-host
//    copies in a copy engine (offload's gradients). Another value throws fsdp::Error.
//
// Determinism: no kernel uses floating-point atomics; every reduction (bias and LayerNorm
// parameter gradients, embedding gradients, squared norms, losses) has a fixed order that
// depends on the shapes only, so a step's results are bitwise repeatable on one GPU model.
//
// Only fsdp::cuda code and the Runtime include this.
#pragma once

#include <memory>

#include "fsdp/backend/backend.hpp"

namespace fsdp::cuda {

// The backend on device `device_ordinal` (cudaSetDevice on the calling thread, which must
// be the thread that drives the backend). Throws fsdp::Error if the device cannot be used
// or FSDP_SMALL_READS holds neither kernel nor copy.
std::unique_ptr<Backend> make_cuda_backend(int device_ordinal);

}  // namespace fsdp::cuda
