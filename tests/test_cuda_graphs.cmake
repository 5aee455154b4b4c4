fsdp_add_test(test_cuda_graphs SOURCES test_cuda_graphs.cpp NP 1 2 4)
