# model.init_from: load merged Hugging Face weights into every rank's shards (GPT-2, T5).
fsdp_add_test(test_init_from SOURCES test_init_from.cpp NP 1 2 4)
