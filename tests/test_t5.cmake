fsdp_add_test(test_t5 SOURCES test_t5.cpp NP 1 2)
