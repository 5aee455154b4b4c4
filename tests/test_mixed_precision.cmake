fsdp_add_test(test_mixed_precision SOURCES test_mixed_precision.cpp NP 1 2 4)
