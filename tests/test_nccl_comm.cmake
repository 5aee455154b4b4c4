fsdp_add_gpu_test(test_nccl_comm SOURCES test_nccl_comm.cpp LIBS fsdp::comm NP 1 2)
