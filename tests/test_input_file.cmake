# zlib and libzstd write the compressed files the reader is tested on.
fsdp_add_test(test_input_file SOURCES test_input_file.cpp LIBS fsdp::data ZLIB::ZLIB PkgConfig::ZSTD
              PkgConfig::LZMA NP 1)
