# safetensors reader: header validation (one test per rejection), F32/BF16/F16/F64 reads,
# ranged reads touching only their bytes, sharded index directories.
fsdp_add_test(test_safetensors SOURCES test_safetensors.cpp LIBS fsdp::checkpoint NP 1)
