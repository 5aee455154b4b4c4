# tests/test_lr_schedule.cmake: fsdp::learning_rate, each optim.lr_scheduler_type at chosen
# steps against values worked out by hand. Included by tests/CMakeLists.txt (alphabetical glob).
fsdp_add_test(test_lr_schedule SOURCES test_lr_schedule.cpp LIBS fsdp NP 1)
