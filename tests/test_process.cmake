fsdp_add_test(test_process SOURCES test_process.cpp LIBS fsdp::core NP 1 2)
