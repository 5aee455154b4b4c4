fsdp_add_test(test_step_timing SOURCES test_step_timing.cpp NP 1 2)
