fsdp_add_test(test_cpu_threads SOURCES test_cpu_threads.cpp LIBS fsdp::backend NP 1)
target_link_libraries(test_cpu_threads PRIVATE OpenMP::OpenMP_CXX)
