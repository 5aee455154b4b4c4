fsdp_add_test(test_data SOURCES test_data.cpp LIBS fsdp::data fsdp::model NP 1)
