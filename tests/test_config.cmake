fsdp_add_test(test_config SOURCES test_config.cpp LIBS fsdp::model NP 1)
target_compile_definitions(test_config PRIVATE FSDP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
