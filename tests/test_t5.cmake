# BLAS_CORETYPES Haswell: the finite-difference checks under the kernels an AMD CPU gets,
# whatever CI runs on (tests/CMakeLists.txt, fsdp_add_test).
fsdp_add_test(test_t5 SOURCES test_t5.cpp NP 1 2 BLAS_CORETYPES Haswell)
