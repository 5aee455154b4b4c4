fsdp_add_test(test_comm SOURCES test_comm.cpp LIBS fsdp::comm NP 1 2 4)
