fsdp_add_test(test_guards SOURCES test_guards.cpp NP 1 2)
