fsdp_add_test(test_reshard SOURCES test_reshard.cpp NP 1 2 4)
