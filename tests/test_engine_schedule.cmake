fsdp_add_test(test_engine_schedule SOURCES test_engine_schedule.cpp LIBS fsdp::fsdp fsdp::model NP 1)
