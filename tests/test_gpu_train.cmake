fsdp_add_gpu_test(test_gpu_train SOURCES test_gpu_train.cpp NP 1 2 4)
