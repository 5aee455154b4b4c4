# The layering declared in CMakeLists.txt (each fsdp_layer's fsdp::* links) against every
# cross-layer #include of src/ and include/fsdp/, plus its own self-test on probe trees
# (tests/check_layering.sh).
add_test(NAME test_layering COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(test_layering PROPERTIES LABELS "cpu")
