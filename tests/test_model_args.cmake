# Every model family's keys, declared once (fsdp/model/model_args.hpp): config.json round trip,
# docs and ranges, and a scan of src/ for a key spelled outside the families' tables.
fsdp_add_test(test_model_args SOURCES test_model_args.cpp LIBS fsdp::model NP 1)
target_compile_definitions(test_model_args PRIVATE FSDP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
