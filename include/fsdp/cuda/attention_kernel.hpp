// fsdp/cuda/attention_kernel.hpp: the choice between the CUDA backend's two tensor-core
// attention implementations. Standalone (no other project header), so that the .cu files,
// compiled as C++17, can include it.
#pragma once

namespace fsdp::cuda {

// Which tensor-core kernels run attention with 16-bit storage, head dim 64 or 128 and
// 16-byte-aligned rows (other cases take the wmma or SIMT kernels whatever this says):
//  - mma (default): src/cuda/kernels_flash_mma.cuh, FlashAttention-2 (Dao 2023) on
//    mma.sync.m16n8k16 with S, P, O, dQ, dK, dV in registers and cp.async double buffering;
//  - wmma: the first tensor-core kernels (kernels_flash.cu), S/P/O staged in shared memory.
// Both give the same results to rounding (tests/test_cuda_kernels.cpp runs both). Process-wide;
// the initial value comes from the environment variable FSDP_ATTENTION_KERNEL (mma | wmma;
// anything else throws fsdp::Error at the first attention call), so benchmarks can compare.
enum class AttentionKernel { mma, wmma };
AttentionKernel attention_kernel();
void set_attention_kernel(AttentionKernel k);

}  // namespace fsdp::cuda
