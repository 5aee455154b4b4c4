// libFuzzer target for the safetensors reader (fsdp/checkpoint/safetensors.hpp), built and run
// by tests/fuzz_safetensors.sh with clang++ -fsanitize=fuzzer,address,undefined.
//
// Input: one mode byte, then the payload.
//   mode even: the payload is DIR/model.safetensors; opened as SafetensorsFile and as
//              SafetensorsCheckpoint(DIR).
//   mode odd:  the payload split at "\n--\n" into DIR/model.safetensors.index.json,
//              DIR/a.safetensors and DIR/b.safetensors (missing parts: no file);
//              opened as SafetensorsCheckpoint(DIR).
// Every tensor is then read whole and in two ranged halves, which must agree bit for bit.
// Expected outcomes: success, or fsdp::Error with exit code 2 whose message is one line
// starting with a path inside DIR. Anything else aborts (a finding): another exception, a
// crash, a sanitizer report, a hang (-timeout) or excessive memory (-rss_limit_mb).
//
// With FSDP_FUZZ_MAKE_SEEDS=DIR in the environment the binary instead writes a seed corpus
// to DIR (valid files made with the Writer and by hand: F32, BF16/F16/F64/I64, holes,
// metadata, a sharded index) and exits.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/error.hpp"

namespace fs = std::filesystem;
using namespace fsdp::safetensors;

namespace {

const char* const kSep = "\n--\n";

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors: FINDING: %s\n", what.c_str());
  std::abort();
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("cannot write " + p.string());
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Writes a small file with the library's Writer and returns its bytes.
std::string writer_file(const fs::path& dir, const std::vector<TensorInfo>& infos, float start) {
  const fs::path p = dir / "tmp.safetensors";
  {
    Writer w(p.string(), infos, {{"step", "3"}});
    for (const auto& t : infos) {
      std::vector<float> v(static_cast<std::size_t>(t.numel()));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
      w.write_next(v.data(), t.numel());
    }
    w.finish();
  }
  std::string bytes = read_all(p);
  fs::remove(p);
  return bytes;
}

void make_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  const std::string f32 = writer_file(dir, {{"wte.weight", {4, 3}}, {"ln_f.bias", {3}}, {"s", {}}}, 1.0f);
  write_file(dir / "f32", "\x00" + f32);
  const std::string mixed_json =
      "{\"bf\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
      "\"hf\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]},"
      "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[16,24]},"
      "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]},"
      "\"__metadata__\":{\"format\":\"pt\"}}";
  std::string data = "\x80\x3f\x20\xc0\x49\x40\x80\xff" "\x00\x3c\x00\xc0\x01\x00\x00\x7c";
  data += std::string("\x9a\x99\x99\x99\x99\x99\xb9\x3f", 8) + std::string(8, '\x07');
  write_file(dir / "mixed", std::string(1, '\x02') + le64(mixed_json.size()) + mixed_json + data);
  const std::string holes_json =
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20],\"x\":[1]},"
      "\"e\":{\"dtype\":\"U8\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
  write_file(dir / "holes", std::string(1, '\x00') + le64(holes_json.size()) + holes_json + std::string(20, '\x41'));
  write_file(dir / "empty", std::string(1, '\x00') + le64(2) + "{}");
  const std::string a = writer_file(dir, {{"a", {2}}, {"b", {3}}}, 0.0f);
  const std::string b = writer_file(dir, {{"c", {2, 2}}}, 9.0f);
  const std::string index =
      "{\"metadata\":{\"total_size\":36},\"weight_map\":{\"a\":\"a.safetensors\","
      "\"b\":\"a.safetensors\",\"c\":\"b.safetensors\"}}";
  write_file(dir / "sharded", "\x01" + index + kSep + a + kSep + b);
}

// Reads every tensor whole and as two ranged halves; the results must agree.
template <class Reader>
void read_everything(const Reader& r) {
  for (const auto& name : r.names()) {
    const auto& e = r.entry(name);
    if (!dtype_readable_as_float(e.dtype)) {
      try {
        (void)r.read_f32(name);
        fail("read_f32 accepted dtype " + e.dtype);
      } catch (const fsdp::Error& err) {
        if (err.exit_code() != fsdp::kExitInputError) throw;
      }
      continue;
    }
    const std::vector<float> whole = r.read_f32(name);
    if (static_cast<int64_t>(whole.size()) != e.numel) fail("whole read has the wrong size");
    std::vector<float> parts(whole.size());
    const int64_t half = e.numel / 2;
    r.read_f32(name, 0, half, parts.data());
    r.read_f32(name, half, e.numel - half, parts.data() + half);
    if (!whole.empty() && std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)) != 0)
      fail("ranged reads differ from the whole read of " + name);
  }
}

fs::path g_dir;

void cleanup() {
  std::error_code ec;
  if (!g_dir.empty()) fs::remove_all(g_dir, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("FSDP_FUZZ_MAKE_SEEDS")) {
    make_seeds(seeds);
    std::exit(0);
  }
  std::string tmpl = (fs::temp_directory_path() / "fsdp_fuzz_st_XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) fail("mkdtemp failed");
  g_dir = tmpl;
  std::atexit(cleanup);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (const char* f : {"model.safetensors", "model.safetensors.index.json", "a.safetensors", "b.safetensors"})
    fs::remove(g_dir / f);
  const std::string dir = g_dir.string();
  try {
    if (mode % 2 == 0) {
      write_file(g_dir / "model.safetensors", payload);
      try {
        SafetensorsFile f((g_dir / "model.safetensors").string());
        read_everything(f);
        if (f.bytes_read() > f.file_size()) fail("bytes_read larger than the file");
      } catch (const fsdp::Error& e) {
        if (e.exit_code() != fsdp::kExitInputError) throw;
      }
      SafetensorsCheckpoint c(dir);
      read_everything(c);
    } else {
      static const char* names[3] = {"model.safetensors.index.json", "a.safetensors", "b.safetensors"};
      std::size_t pos = 0;
      for (int part = 0; part < 3 && pos <= payload.size(); ++part) {
        std::size_t next = payload.find(kSep, pos);
        if (next == std::string::npos || part == 2) next = payload.size();
        write_file(g_dir / names[part], payload.substr(pos, next - pos));
        pos = next + std::strlen(kSep);
      }
      SafetensorsCheckpoint c(dir);
      read_everything(c);
    }
  } catch (const fsdp::Error& e) {
    const std::string msg = e.what();
    if (e.exit_code() != fsdp::kExitInputError) fail("fsdp::Error with exit code " + std::to_string(e.exit_code()) + ": " + msg);
    if (msg.rfind(dir, 0) != 0) fail("message does not start with the path: " + msg);
    if (msg.find('\n') != std::string::npos) fail("message is not one line: " + msg);
  }
  // Any other exception escapes: libFuzzer reports it as a crash.
  return 0;
}
