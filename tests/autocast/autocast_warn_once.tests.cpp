// CUDA autocast requested without CUDA warns once per process. This suite has its own
// executable: the warning is process-wide, so no other test may request CUDA autocast first.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <string>
#include <vector>

#include <amp/autocast.h>

#include "support/autocast_helpers.h"
#include "support/devices.h"
#include "support/warnings.h"

using amp_test::WarningCollector;

TEST_CASE("CUDA autocast without CUDA warns once per process and runs disabled",
          "[autocast][no-gpu]") {
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  {
    amp::AutocastGuard first(torch::kCUDA);
    CHECK_FALSE(first.enabled());
    CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCUDA));
  }
  REQUIRE(collector.messages.size() == 1);
  CHECK_THAT(collector.messages[0],
             Catch::Contains("CUDA autocast was requested but CUDA is not available") &&
                 Catch::Contains("Disabling autocast"));
  {
    amp::AutocastGuard second(torch::kCUDA, torch::kBFloat16);
    CHECK_FALSE(second.enabled());
  }
  CHECK(collector.messages.size() == 1);
}

TEST_CASE(
    "aten::_convolution under CPU autocast (a traced module not prepared) warns once and "
    "runs in float32 as before",
    "[autocast][script]") {
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  const at::Tensor x = torch::randn({1, 2, 5});
  const at::Tensor w = torch::randn({3, 2, 2});
  const at::Tensor b = torch::randn({3});
  const auto traced_convolution = [&] {
    return at::_convolution(x, w, b, {1}, {0}, {1}, false, {0}, 1, false, false, true, true);
  };
  at::Tensor eager, first, second;
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    eager = at::conv1d(x, w, b);  // cast by autocast, below which _convolution runs unwarned
    CHECK(collector.messages.empty());
    first = traced_convolution();
    second = traced_convolution();
  }
  CHECK(eager.scalar_type() == torch::kBFloat16);
  // What autocast does with it is unchanged (Python's too): float32, the same values.
  CHECK(first.scalar_type() == torch::kFloat);
  CHECK(torch::equal(first, traced_convolution()));
  REQUIRE(collector.messages.size() == 1);
  CHECK_THAT(collector.messages[0],
             Catch::Contains("aten::_convolution runs under CPU autocast in its inputs' dtype") &&
                 Catch::Contains("amp::prepare_for_autocast(module)"));
  (void)second;
}
