fsdp_add_test(test_model SOURCES test_model.cpp NP 1 3)
