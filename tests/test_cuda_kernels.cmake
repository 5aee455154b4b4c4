fsdp_add_gpu_test(test_cuda_kernels SOURCES test_cuda_kernels.cpp LIBS fsdp::backend NP 1)
