# Checkpoint layer: shard files, step-directory protocol, safetensors, merge to Hugging Face.
fsdp_add_test(test_checkpoint SOURCES test_checkpoint.cpp LIBS fsdp::checkpoint NP 1)

# fsdp_merge from the command line: test_checkpoint leaves a tiny GPT-2 and a tiny T5
# checkpoint and their library merges in ${PROJECT_BINARY_DIR}/test_checkpoint_fixture;
# check_merge.py runs the tool on them (exit codes, missing shard file) and parses the
# output independently (numpy).
# Needs a Python 3 with numpy (Debian's /usr/bin/python3 by default).
set(FSDP_TEST_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 with numpy for script tests")
set_tests_properties(test_checkpoint_np1 PROPERTIES FIXTURES_SETUP ckpt_merge_fixture)
add_test(NAME fsdp_merge_cli
         COMMAND ${FSDP_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_merge.py
                 --merge $<TARGET_FILE:fsdp_merge>
                 --step-dir ${PROJECT_BINARY_DIR}/test_checkpoint_fixture/step_00001234
                 --expected ${PROJECT_BINARY_DIR}/test_checkpoint_fixture/hf_expected
                 --t5-step-dir ${PROJECT_BINARY_DIR}/test_checkpoint_fixture/t5_step_00001234
                 --t5-expected ${PROJECT_BINARY_DIR}/test_checkpoint_fixture/t5_hf_expected
                 --work ${CMAKE_CURRENT_BINARY_DIR}/fsdp_merge_cli_work)
set_tests_properties(fsdp_merge_cli PROPERTIES FIXTURES_REQUIRED ckpt_merge_fixture
                     LABELS cpu TIMEOUT 120)
