fsdp_add_test(test_signals SOURCES test_signals.cpp NP 1 2)
