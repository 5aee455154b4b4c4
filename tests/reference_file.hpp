// tests/reference_file.hpp: the text fixtures of the PyTorch references (tools/t5_reference.py
// model, tools/gpt2_reference.py), read once for test_t5 and test_model. One line per record,
// its first word the kind:
//   config <JSON>                     the rest of the line
//   param <name> <n> <n floats>       float32 values (parsed as float)
//   grad <name> <n> <n numbers>       float64 values
//   anything else <words>             kept as numbers ("batch", "inputs", "tokens", "loss", ...)
// A path ending in ".xz" is read through `xz -dc` (tests/data/llama's fixtures are stored
// compressed: 26 MB of text made the working tree too large to travel with the GPU bundle).
// Header-only, like train_util.hpp.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace test_util {

struct ReferenceFile {
  std::string config_json;
  std::map<std::string, std::vector<float>> params;   // name -> float32 values
  std::map<std::string, std::vector<double>> grads;   // name -> float64 values
  std::map<std::string, std::vector<double>> values;  // other kinds -> their numbers

  // The numbers of record `kind` (empty if absent), as T.
  template <class T>
  std::vector<T> as(const std::string& kind) const {
    std::vector<T> out;
    if (auto it = values.find(kind); it != values.end()) {
      for (double v : it->second) out.push_back(static_cast<T>(v));
    }
    return out;
  }
  double scalar(const std::string& kind) const {
    const auto it = values.find(kind);
    return it == values.end() || it->second.empty() ? 0.0 : it->second.front();
  }
};

// Reads `path` into *out; a missing file or a param/grad record with the wrong count is a
// fatal gtest failure naming `how` (the command that makes the fixture). Callers check
// HasFatalFailure().
inline void read_reference(const std::string& path, const std::string& how, ReferenceFile* out) {
  std::ifstream file(path);
  ASSERT_TRUE(file) << path << " missing (" << how << ")";
  std::stringstream text;
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".xz") == 0) {
    const std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(("xz -dc '" + path + "'").c_str(), "r"),
                                                     pclose);
    ASSERT_TRUE(pipe) << "xz -dc " << path;
    char buf[1 << 16];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe.get())) > 0;) text.write(buf, n);
  } else {
    text << file.rdbuf();
  }
  ASSERT_FALSE(text.str().empty()) << path << " is empty (or xz could not read it; " << how << ")";
  std::istream& in = text;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "config") {
      std::getline(s, out->config_json);
    } else if (kind == "param" || kind == "grad") {
      std::string name;
      int64_t n = 0;
      s >> name >> n;
      std::size_t got = 0;
      for (std::string tok; s >> tok; ++got) {
        if (kind == "param") out->params[name].push_back(std::strtof(tok.c_str(), nullptr));
        else out->grads[name].push_back(std::strtod(tok.c_str(), nullptr));
      }
      ASSERT_EQ(static_cast<int64_t>(got), n) << path << ": " << kind << " " << name;
    } else if (!kind.empty()) {
      auto& v = out->values[kind];
      for (std::string tok; s >> tok;) v.push_back(std::strtod(tok.c_str(), nullptr));
    }
  }
}

}  // namespace test_util
