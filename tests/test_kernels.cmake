fsdp_add_test(test_kernels SOURCES test_kernels.cpp LIBS fsdp::backend NP 1)
