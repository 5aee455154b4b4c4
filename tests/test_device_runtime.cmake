fsdp_add_test(test_device_runtime SOURCES test_device_runtime.cpp LIBS fsdp::backend NP 1)
