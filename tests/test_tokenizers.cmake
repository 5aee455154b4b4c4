# fsdp_prepare's tokenizers (tests/test_tokenizers.cpp): SentencePiece models trained in the
# test (the C++ trainer of libsentencepiece-dev), llm.c / nanoGPT token files, bad files, the
# HDF5 tokenizer record. Links sentencepiece itself: the reference encoder and the trainer.
fsdp_add_test(test_tokenizers SOURCES test_tokenizers.cpp LIBS fsdp::data PkgConfig::SENTENCEPIECE NP 1)
