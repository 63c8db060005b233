// Catch2 runner for amp's tests: runs the selected tests, and reports as skipped (exit 77,
// CTest's SKIP_RETURN_CODE) a run that selects only [cuda] tests on a machine without a usable
// GPU, or only [no-gpu] tests (the paths taken when CUDA is missing) on a machine with one; a
// filter that selects no test fails.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "support/devices.h"

namespace {

bool has_tag(const Catch::TestCase& test, const std::string& tag) {
  const auto& tags = test.getTestCaseInfo().tags;
  return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

bool all_have_tag(const std::vector<Catch::TestCase>& tests, const std::string& tag) {
  return !tests.empty() && std::all_of(tests.begin(), tests.end(),
                                       [&](const Catch::TestCase& t) { return has_tag(t, tag); });
}

}  // namespace

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;

  const auto& config = session.config();
  if (!config.listTestNamesOnly() && !config.listTests() && !config.listTags()) {
    const auto selected =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    // A filter that selects nothing is an error, not a pass: CTest cuts a test name at ';'
    // (its list separator), and the cut name used to select no test and exit 0.
    if (config.testSpec().hasFilters() && selected.empty()) {
      std::cerr << "no test case matches the filter given; check the test's name\n";
      return 2;
    }
    if (!amp_test::cuda_usable() && all_have_tag(selected, "cuda")) {
      std::cout << "skipped: the selected tests need a CUDA GPU and none is usable here\n";
      return amp_test::kSkipReturnCode;
    }
    if (amp_test::cuda_present() && all_have_tag(selected, "no-gpu")) {
      std::cout << "skipped: the selected tests check behaviour without a GPU, and one is here\n";
      return amp_test::kSkipReturnCode;
    }
  }
  return session.run();
}
