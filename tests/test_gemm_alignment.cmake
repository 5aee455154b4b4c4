fsdp_add_test(test_gemm_alignment SOURCES test_gemm_alignment.cpp NP 1)
target_compile_definitions(test_gemm_alignment PRIVATE FSDP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
