fsdp_add_gpu_test(test_cuda_device_runtime SOURCES test_cuda_device_runtime.cpp LIBS fsdp::backend NP 1)
