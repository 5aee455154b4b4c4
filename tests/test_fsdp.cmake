fsdp_add_test(test_fsdp SOURCES test_fsdp.cpp NP 1 2 4)
