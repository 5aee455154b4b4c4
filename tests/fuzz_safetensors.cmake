# Fuzzing the safetensors reader: tests/fuzz_safetensors.sh compiles tests/fuzz_safetensors.cpp
# with clang++ -fsanitize=fuzzer,address,undefined (whatever compiler builds the rest) and
# fuzzes for FSDP_FUZZ_SECONDS; any crash, sanitizer report, hang or unexpected exception fails.
set(FSDP_FUZZ_CXX /usr/bin/clang++ CACHE FILEPATH "clang++ with libFuzzer, for the fuzz_safetensors test")
set(FSDP_FUZZ_SECONDS 15 CACHE STRING "Seconds the fuzz_safetensors test fuzzes")
add_test(NAME fuzz_safetensors
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.sh ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors ${FSDP_FUZZ_SECONDS})
set_tests_properties(fuzz_safetensors PROPERTIES LABELS cpu TIMEOUT 600
                     ENVIRONMENT "FSDP_FUZZ_CXX=${FSDP_FUZZ_CXX}")
