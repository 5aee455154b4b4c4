fsdp_add_test(test_offload_streams SOURCES test_offload_streams.cpp LIBS fsdp::fsdp fsdp::optim fsdp::model fsdp::data NP 1 2)
