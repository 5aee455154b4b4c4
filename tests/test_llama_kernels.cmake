fsdp_add_test(test_llama_kernels SOURCES test_llama_kernels.cpp LIBS fsdp::backend NP 1)
