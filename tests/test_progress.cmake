# tests/test_progress.cmake: the progress line of fsdp_prepare and fsdp_merge. Included by
# tests/CMakeLists.txt after test_cli.cmake (alphabetical glob), whose fsdp_cli_tests it uses.
# test_progress: the formatter and the meter (fake clock, string stream).
fsdp_add_test(test_progress SOURCES test_progress.cpp LIBS fsdp NP 1)
# tests/cli/progress.sh: under a pseudo-terminal (`script`) the tools draw the line; piped
# they print exactly what they printed before.
set(FSDP_PROGRESS_CASES prepare_tty merge_tty)
fsdp_cli_tests(progress cli_progress 2 ${FSDP_PROGRESS_CASES})
foreach(case IN LISTS FSDP_PROGRESS_CASES)
  set_tests_properties(cli_progress_${case} PROPERTIES ENVIRONMENT
    "${FSDP_TEST_ENV};FSDP_MERGE=$<TARGET_FILE:fsdp_merge>")
endforeach()
