# Layering rules checked from the includes (tests/check_layering.sh).
add_test(NAME test_layering COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(test_layering PROPERTIES LABELS "cpu")
