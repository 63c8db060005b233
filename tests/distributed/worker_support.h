// What the worker's scenarios share (worker.cpp, zero_worker.cpp): printing "key value" lines
// with float bits in hex, the group options, raw input files, and a parity scenario's settings.
#pragma once

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <amp/distributed.h>

namespace amp_worker {

namespace dist = amp::distributed;

/// The float32 bits of every value, as comma-separated 8-digit hex.
inline std::string hex(const at::Tensor& values) {
  const at::Tensor host = values.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  std::string text;
  char word[16];
  for (int64_t i = 0; i < host.numel(); ++i) {
    uint32_t bits = 0;
    const float value = host.data_ptr<float>()[i];
    std::memcpy(&bits, &value, sizeof bits);
    std::snprintf(word, sizeof word, "%s%08" PRIx32, i > 0 ? "," : "", bits);
    text += word;
  }
  return text;
}

/// One "key value" line on stdout, flushed.
inline void print(const std::string& key, const std::string& value) {
  std::printf("%s %s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
}

/// Gloo on the loopback, with AMP_TEST_TIMEOUT_MS (default 60 s) as the timeout.
inline dist::GroupOptions group_options() {
  const char* timeout = std::getenv("AMP_TEST_TIMEOUT_MS");
  return dist::GroupOptions()
      .timeout(std::chrono::milliseconds(timeout ? std::atoll(timeout) : 60000))
      .gloo_hostname("127.0.0.1");
}

// Reads `count` float32 (or int64) values written raw by ddp_parity.py.
inline at::Tensor read_raw(const std::string& path, std::vector<int64_t> shape,
                           at::ScalarType dtype) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  const size_t got = std::fread(t.data_ptr(), 1, bytes, file);
  std::fclose(file);
  if (got != bytes) throw std::runtime_error("short read of " + path);
  return t;
}

/// A parity scenario's settings, from "key=value" arguments.
struct ParityConfig {
  std::map<std::string, std::string> values;
  const std::string& at(const std::string& key) const {
    const auto found = values.find(key);
    if (found == values.end()) throw std::runtime_error("missing argument " + key + "=");
    return found->second;
  }
  int64_t integer(const std::string& key) const { return std::atoll(at(key).c_str()); }
  double real(const std::string& key) const { return std::atof(at(key).c_str()); }
};

/// The "key=value" arguments among `args` from index `first` on.
inline ParityConfig parse_config(const std::vector<std::string>& args, size_t first) {
  ParityConfig config;
  for (size_t i = first; i < args.size(); ++i) {
    const size_t eq = args[i].find('=');
    if (eq != std::string::npos) config.values[args[i].substr(0, eq)] = args[i].substr(eq + 1);
  }
  return config;
}

}  // namespace amp_worker
