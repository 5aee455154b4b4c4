# fsdp::OutputLock: one writer of a named output at a time (fsdp_prepare -o).
fsdp_add_test(test_output_lock SOURCES test_output_lock.cpp LIBS fsdp::core NP 1)
