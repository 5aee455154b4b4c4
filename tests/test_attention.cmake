fsdp_add_test(test_attention SOURCES test_attention.cpp LIBS fsdp::backend NP 1)
