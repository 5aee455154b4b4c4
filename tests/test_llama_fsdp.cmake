fsdp_add_test(test_llama_fsdp SOURCES test_llama_fsdp.cpp NP 1 2 4)
