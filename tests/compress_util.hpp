// tests/compress_util.hpp: gzip, zstd and xz files written in a test (zlib, libzstd,
// liblzma), as the `gzip`, `zstd` and `xz` commands write them; a test calling them links
// ZLIB::ZLIB, PkgConfig::ZSTD and (xz) PkgConfig::LZMA.
#pragma once

#include <gtest/gtest.h>
#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <string>

// One gzip member (RFC 1952) of `text`, as `gzip` writes it.
inline std::string gzip(const std::string& text, int level = 6) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// One zstd frame (RFC 8878) of `text`; with its content checksum as the `zstd` command writes.
inline std::string zstd(const std::string& text, bool checksum = true) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const std::size_t n = ZSTD_compress2(c, out.data(), out.size(), text.data(), text.size());
  EXPECT_EQ(ZSTD_isError(n), 0u);
  ZSTD_freeCCtx(c);
  out.resize(n);
  return out;
}

// A skippable frame (magic 0x184D2A5A, 4-byte little-endian length, payload), as pzstd and
// seekable-format writers put between frames.
inline std::string skippable_frame(const std::string& payload) {
  std::string f = {'\x5A', '\x2A', '\x4D', '\x18'};
  const auto n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) f.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return f + payload;
}

// One xz stream (the .xz container, CRC-64 check, preset 6) of `text`, as `xz` writes it.
inline std::string xz(const std::string& text) {
  std::string out(lzma_stream_buffer_bound(text.size()), '\0');
  std::size_t pos = 0;
  EXPECT_EQ(lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, nullptr,
                                    reinterpret_cast<const uint8_t*>(text.data()), text.size(),
                                    reinterpret_cast<uint8_t*>(out.data()), &pos, out.size()),
            LZMA_OK);
  out.resize(pos);
  return out;
}
