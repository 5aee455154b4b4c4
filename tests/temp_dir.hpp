// tests/temp_dir.hpp: a fresh folder under the build dir (test_tmp/<tag>_<pid>_<n>), removed
// when the object goes. Needs FSDP_BINARY_DIR (every fsdp_add_test target defines it).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace test_util {

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::path(FSDP_BINARY_DIR) / "test_tmp" /
            (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace test_util
