fsdp_add_test(test_t5_fsdp SOURCES test_t5_fsdp.cpp NP 1 2 4)
