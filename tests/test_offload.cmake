fsdp_add_test(test_offload SOURCES test_offload.cpp NP 1 2 4)
target_compile_definitions(test_offload PRIVATE FSDP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
