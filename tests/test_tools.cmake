# tests/test_tools.cmake: checks of the tools/ scripts that need neither torch nor a GPU (the
# GPU machine is lent rarely; a bug found there costs a session).
# check_py_scopes.py: no function-local import makes a name local before (or around) its
# other uses (issue 19: the former tools/bench_torch_fsdp2.py's UnboundLocalError); its --self-test
# first checks the rules on known-bad and known-good snippets.
add_test(NAME tools_py_scopes
         COMMAND ${FSDP_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_py_scopes.py --self-test
                 ${PROJECT_SOURCE_DIR}/tools ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(tools_py_scopes PROPERTIES LABELS "cpu;tools" TIMEOUT 60)
# check_gtest_suites.py: no GoogleTest suite mixes TEST with TEST_F/TEST_P in a file (issue 19:
# test_nccl_comm's NcclTimeout did, and failed on the GPU only); --self-test first.
add_test(NAME tests_gtest_suites
         COMMAND ${FSDP_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_gtest_suites.py --self-test
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(tests_gtest_suites PROPERTIES LABELS "cpu;tools" TIMEOUT 60)
# check_bench_shapes.py: for each model of tools/bench_torch_gpu.py, fsdp_train --dry-run (CPU)
# of the configuration the script writes builds the parameter count and FLOPs per token the
# script uses for the PyTorch side and the MFU column of tools/bench_gpu.sh.
add_test(NAME tools_bench_shapes
         COMMAND ${FSDP_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_bench_shapes.py
                 --fsdp-train $<TARGET_FILE:fsdp_train> --mpiexec ${MPIEXEC_EXECUTABLE}
                 --work ${CMAKE_CURRENT_BINARY_DIR}/tools_bench_shapes)
set_tests_properties(tools_bench_shapes PROPERTIES ENVIRONMENT "${FSDP_TEST_ENV}"
                     LABELS "cpu;tools" TIMEOUT 300)
# hf_check.py --impl reference: tools/gpu_check.sh's Hugging Face check (GPT-2, T5, Llama trained
# 3 steps on 2 CPU ranks by fsdp_train, merged by fsdp_merge, the validation loss within 1e-5)
# with the project's own float64 readings of transformers (tools/t5_reference.py,
# tools/llama_reference.py, tests/check_merge.py) in its place: everything but transformers
# itself, which only the GPU machine has. Needs torch (python3-torch): else exit 77, not run.
add_test(NAME tools_hf_check_reference
         COMMAND ${FSDP_TEST_PYTHON} ${PROJECT_SOURCE_DIR}/tools/hf_check.py --impl reference
                 --bin-dir $<TARGET_FILE_DIR:fsdp_train> --work ${CMAKE_CURRENT_BINARY_DIR}/tools_hf_check)
set_tests_properties(tools_hf_check_reference PROPERTIES ENVIRONMENT "${FSDP_TEST_ENV}"
                     LABELS "cpu;tools" TIMEOUT 300 SKIP_RETURN_CODE 77)
# gpu_kit_stubbed.sh: tools/gpu_check.sh and tools/gpu_kernel_ab.sh, run as docs/gpu.md's
# next-lease command runs them, against a fake bundle of stubs (fsdp_train, gtest binaries
# with a rank-1 failure, mpirun, nvidia-smi): the summaries name the failures, keep the
# [offload] / cuda_graphs lines, read "NOT RUN: out of budget" for runs that do not fit, and
# stdout ends with the recap; the exit codes. No GPU, MPI run or torch; a few seconds.
add_test(NAME tools_gpu_kit_stubbed
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/gpu_kit_stubbed.sh)
set_tests_properties(tools_gpu_kit_stubbed PROPERTIES
                     ENVIRONMENT "FSDP_TEST_PYTHON=${FSDP_TEST_PYTHON}"
                     LABELS "cpu;tools" TIMEOUT 120)
