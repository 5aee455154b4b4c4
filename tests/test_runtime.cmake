fsdp_add_test(test_runtime SOURCES test_runtime.cpp NP 1 2 4)
