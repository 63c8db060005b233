// Runs one of the tests' Python reference scripts in the project's venv and returns what it
// printed, a row per line, split at tabs (the scripts print their reference values this way).
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <sstream>
#include <string>
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

}  // namespace amp_test
