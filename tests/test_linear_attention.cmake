# Gated DeltaNet's kernels on the CPU backend (tests/test_linear_attention.cpp): against
# double-precision references of Hugging Face's formulas, and finite differences.
fsdp_add_test(test_linear_attention SOURCES test_linear_attention.cpp LIBS fsdp::backend NP 1)
