# fsdp_prepare's tokenizer.json reader (tests/test_bpe_tokenizer.cpp): small byte-level BPE
# tokenizers built in the test, one rule each; real vocabularies against tiktoken in
# tests/cli/tokenizers.sh hf_bpe_*.
fsdp_add_test(test_bpe_tokenizer SOURCES test_bpe_tokenizer.cpp LIBS fsdp::data nlohmann_json::nlohmann_json
              ZLIB::ZLIB PkgConfig::ZSTD NP 1)  # compressed JSON Lines (tests/compress_util.hpp)
