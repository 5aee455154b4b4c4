fsdp_add_test(test_profiler SOURCES test_profiler.cpp NP 2)
