# BLAS_CORETYPES Haswell: the chunked head's tolerances under the kernels whose sums depend on
# the rows in the call, whatever CI runs on (tests/CMakeLists.txt, fsdp_add_test).
fsdp_add_test(test_fused_linear_ce SOURCES test_fused_linear_ce.cpp NP 1 2 BLAS_CORETYPES Haswell)
