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
