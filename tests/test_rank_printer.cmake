# Multi-rank test output: rank-prefixed failures from every rank (tests/test_rank_printer.sh).
add_executable(rank_printer_probe rank_printer_probe.cpp)
target_link_libraries(rank_printer_probe PRIVATE fsdp_test_main)
add_test(NAME test_rank_printer
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_rank_printer.sh ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:rank_printer_probe>)
set_tests_properties(test_rank_printer PROPERTIES ENVIRONMENT "${FSDP_TEST_ENV}" LABELS "cpu"
                     TIMEOUT 120 PROCESSORS 2)
