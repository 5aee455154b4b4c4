fsdp_add_test(test_fused_linear_ce SOURCES test_fused_linear_ce.cpp NP 1 2)
