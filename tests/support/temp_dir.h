// A fresh, empty temporary folder for a test of the examples' helpers, removed when it goes.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "support/remove_tree.h"

namespace amp_test {

class TempDir {
 public:
  /// Creates <temp>/amp_<name>_<pid>_<n>, unique within the process and across processes.
  explicit TempDir(const std::string& name) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("amp_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    remove_tree(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace amp_test
