fsdp_add_test(test_vocab_pad SOURCES test_vocab_pad.cpp NP 1 2)
