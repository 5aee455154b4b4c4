// fsdp/cuda/check.hpp: the checks around every CUDA runtime, cuBLAS(Lt) and NCCL call
// (nccl-tests' CUDACHECK/NCCLCHECK habit). A failure throws fsdp::Error (exit code 1) whose
// one line names the call, file:line, the world rank and the host (fsdp::where(),
// fsdp/core/process.hpp), and the library's own
// message, e.g.
//   CUDA error in cudaMalloc(&p, bytes) at src/cuda/cuda_backend.cu:88 (rank 3 on gpu-node-2):
//   out of memory
// Only code under src/cuda/ includes this (it needs the CUDA headers).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

namespace fsdp::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t code, const char* call, const char* file,
                                     int line);
[[noreturn]] void throw_nccl_error(ncclResult_t code, const char* call, const char* file,
                                   int line);
}  // namespace fsdp::cuda::detail

#define FSDP_CHECK_CUDA(call)                                                                 \
  do {                                                                                        \
    cudaError_t fsdp_cuda_rc_ = (call);                                                       \
    if (fsdp_cuda_rc_ != cudaSuccess)                                                         \
      ::fsdp::cuda::detail::throw_cuda_error(fsdp_cuda_rc_, #call, __FILE__, __LINE__);       \
  } while (0)

#define FSDP_CHECK_CUBLAS(call)                                                               \
  do {                                                                                        \
    cublasStatus_t fsdp_cublas_rc_ = (call);                                                  \
    if (fsdp_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::fsdp::cuda::detail::throw_cublas_error(fsdp_cublas_rc_, #call, __FILE__, __LINE__);   \
  } while (0)

#define FSDP_CHECK_NCCL(call)                                                                 \
  do {                                                                                        \
    ncclResult_t fsdp_nccl_rc_ = (call);                                                      \
    if (fsdp_nccl_rc_ != ncclSuccess && fsdp_nccl_rc_ != ncclInProgress)                      \
      ::fsdp::cuda::detail::throw_nccl_error(fsdp_nccl_rc_, #call, __FILE__, __LINE__);       \
  } while (0)
