// Runs one of the tests' Python reference scripts in the project's venv and returns what it
// printed, a row per line, split at tabs (the scripts print their reference values this way), and
// forms a tensor's row as those scripts print it.
#pragma once

#include <ATen/core/Tensor.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace amp_test {

/// `python script args` (paths quoted by the caller inside `args`); requires exit status 0.
inline std::vector<std::vector<std::string>> python_rows(const std::string& python,
                                                         const std::string& script,
                                                         const std::string& args) {
  const std::string command = "\"" + python + "\" \"" + script + "\" " + args;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  INFO(command);
  REQUIRE(::pclose(pipe) == 0);
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::istringstream parts(line);
    for (std::string field; std::getline(parts, field, '\t');) fields.push_back(field);
    rows.push_back(fields);
  }
  return rows;
}

/// Python's name of `type` ("float32", "bfloat16", "float8_e4m3fn"), for the dtypes the scripts
/// print; c10's name otherwise.
inline std::string python_dtype(c10::ScalarType type) {
  const std::pair<c10::ScalarType, const char*> kNames[] = {
      {at::kFloat, "float32"},          {at::kBFloat16, "bfloat16"},
      {at::kHalf, "float16"},           {at::kLong, "int64"},
      {at::kComplexFloat, "complex64"}, {at::kFloat8_e4m3fn, "float8_e4m3fn"},
      {at::kFloat8_e5m2, "float8_e5m2"}};
  for (const auto& [t, name] : kNames) {
    if (t == type) return name;
  }
  return c10::toString(type);
}

/// A tensor's row as the scripts print one: key, dtype, shape ("8x4"; "" for 0-dim), and its
/// bytes (C-contiguous) in hex.
inline std::vector<std::string> tensor_row(const std::string& key, const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().contiguous();
  std::string shape;
  for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? "x" : "") + std::to_string(t.size(d));
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  for (std::size_t k = 0; k < static_cast<std::size_t>(t.numel()) * t.element_size(); ++k) {
    hex += kHex[bytes[k] >> 4];
    hex += kHex[bytes[k] & 15];
  }
  return {key, python_dtype(t.scalar_type()), shape, hex};
}

}  // namespace amp_test
