# tests/test_progress.cmake: the progress line of fsdp_prepare and fsdp_merge. Included by
# tests/CMakeLists.txt after test_cli.cmake (alphabetical glob), whose fsdp_cli_tests it uses.
# test_progress: the formatter and the meter (fake clock, string stream).
fsdp_add_test(test_progress SOURCES test_progress.cpp LIBS fsdp NP 1)
# tests/cli/progress.sh: under a pseudo-terminal (`script`) the tools draw the line; piped
# they print exactly what they printed before.
fsdp_cli_tests(progress cli_progress 2 prepare_tty merge_tty ENV FSDP_MERGE=$<TARGET_FILE:fsdp_merge>)
