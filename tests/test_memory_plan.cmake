fsdp_add_test(test_memory_plan SOURCES test_memory_plan.cpp NP 1 2 4)
