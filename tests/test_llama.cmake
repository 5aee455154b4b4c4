fsdp_add_test(test_llama SOURCES test_llama.cpp NP 1 3)
