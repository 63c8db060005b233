// Catch2 runner for amp's tests: runs the selected tests, and reports a run that selects only
// [cuda] tests on a machine without a usable GPU as skipped (exit 77, CTest's SKIP_RETURN_CODE).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <iostream>

#include "support/devices.h"

namespace {

bool needs_cuda(const Catch::TestCase& test) {
  const auto& tags = test.getTestCaseInfo().tags;
  return std::find(tags.begin(), tags.end(), "cuda") != tags.end();
}

}  // namespace

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;

  const auto& config = session.config();
  if (!config.listTestNamesOnly() && !config.listTests() && !config.listTags() &&
      !amp_test::cuda_usable()) {
    const auto selected =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    if (!selected.empty() && std::all_of(selected.begin(), selected.end(), needs_cuda)) {
      std::cout << "skipped: the selected tests need a CUDA GPU and none is usable here\n";
      return amp_test::kSkipReturnCode;
    }
  }
  return session.run();
}
