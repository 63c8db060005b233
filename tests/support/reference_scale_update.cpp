// Reference extended scale update in plain tensor ops, and the random-update check against it
// (see reference_scale_update.h).
#include "support/reference_scale_update.h"

#include <limits>

#include <ATen/ATen.h>
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "support/bits.h"

namespace amp_test {

void reference_update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                                      at::Tensor& hysteresis_remaining, at::Tensor& counters,
                                      const at::Tensor& found_inf, const UpdateOptions& params) {
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor clean = found.logical_not();

  // An overflow spends one unit of the allowance; only an exhausted allowance backs off.
  const at::Tensor remaining =
      at::where(found, hysteresis_remaining - 1, hysteresis_remaining).clamp_min(0);
  const at::Tensor back_off = found.logical_and(remaining.le(0));

  // Products are formed in double and rounded once to float32, exactly as ATen's update does,
  // so hysteresis 1 without bounds reproduces torch.amp bit for bit.
  const at::Tensor scale64 = scale.to(at::kDouble);
  // amp stops backing off at float32's smallest normal value (ATen goes on to 0).
  at::Tensor backed =
      (scale64 * params.backoff_factor).to(at::kFloat).clamp_min(std::numeric_limits<float>::min());
  if (params.min_scale > 0) backed = backed.clamp_min(params.min_scale);

  const at::Tensor successful = growth_tracker + 1;
  // `eq`, not `ge`, as in ATen: lowering growth_interval below the tracker stalls growth.
  const at::Tensor grow = clean.logical_and(successful.eq(params.growth_interval));
  at::Tensor candidate = (scale64 * params.growth_factor).to(at::kFloat);
  const at::Tensor finite = candidate.isfinite();
  if (params.max_scale < std::numeric_limits<double>::infinity()) {
    candidate = candidate.clamp_max(params.max_scale);
  }
  const at::Tensor grown = at::where(finite, candidate, scale);

  const at::Tensor new_scale = at::where(back_off, backed, at::where(grow, grown, scale));
  const at::Tensor new_tracker =
      at::where(found.logical_or(grow), at::zeros_like(successful), successful);
  const at::Tensor refill = params.consecutive_hysteresis ? clean : grow;
  const at::Tensor new_remaining =
      at::where(refill, at::full_like(remaining, params.hysteresis), remaining);

  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
  hysteresis_remaining.copy_(new_remaining);
  if (counters.defined()) {
    const at::Tensor skipped = found_inf.ne(0).to(at::kLong);
    counters.select(0, 0).add_(1 - skipped);
    counters.select(0, 1).add_(skipped);
    counters.select(0, 2).add_(1).mul_(skipped);
  }
}

void require_random_updates_match_reference(const UpdateOptions& o, int steps, c10::Device device) {
  const auto on = [&](torch::ScalarType dtype) {
    return torch::TensorOptions().dtype(dtype).device(device);
  };
  auto s1 = torch::full({}, 64.0f, on(torch::kFloat)), s2 = s1.clone();
  auto t1 = torch::zeros({}, on(torch::kInt)), t2 = t1.clone();
  auto h1 = torch::full({}, static_cast<int>(o.hysteresis), on(torch::kInt)), h2 = h1.clone();
  auto c1 = torch::zeros({3}, on(torch::kLong)), c2 = c1.clone();
  for (int step = 0; step < steps; ++step) {
    const auto found =
        torch::full({}, torch::rand({1}).item<float>() < 0.4f ? 1.0f : 0.0f, on(torch::kFloat));
    update_scale_extended_(s1, t1, h1, c1, found, o);
    reference_update_scale_extended_(s2, t2, h2, c2, found, o);
    INFO("step " << step);
    REQUIRE(same_bits(s1, s2));
    REQUIRE(torch::equal(t1, t2));
    REQUIRE(torch::equal(h1, h2));
    REQUIRE(torch::equal(c1, c2));
  }
}

namespace {

struct SaturationStep {
  const char* what;
  int32_t tracker;   // before the update
  float found;       // the flag
  int64_t interval;  // growth_interval
  int32_t expected;  // amp's tracker after it
  bool aten_wraps;   // whether ATen's tracker differs (wrapped to -2^31)
};

}  // namespace

void require_tracker_saturates(PlainUpdate update, c10::Device device) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int64_t kNeverGrows = int64_t{1} << 40;
  const SaturationStep steps[] = {
      {"a clean step reaches 2^31-1 as in ATen", kMax - 1, 0.0f, kNeverGrows, kMax, false},
      {"a clean step at 2^31-1 keeps it (ATen wraps)", kMax, 0.0f, kNeverGrows, kMax, true},
      {"an overflow at 2^31-1 resets it and backs off", kMax, 1.0f, kNeverGrows, 0, false},
      {"an interval of 2^31-1 is reached and grows", kMax - 1, 0.0f, kMax, 0, false},
      {"a tracker at 2^31-1 above the interval does not grow", kMax, 0.0f, 3, kMax, true},
      {"a tracker above the interval stalls growth", 7, 0.0f, 3, 8, false},
      {"a tracker equal to the interval stalls growth", 3, 0.0f, 3, 4, false},
  };
  for (const SaturationStep& step : steps) {
    INFO(step.what);
    const auto on = at::TensorOptions().device(device);
    at::Tensor scale = at::full({}, 1024.0f, on.dtype(at::kFloat));
    at::Tensor tracker = at::full({}, step.tracker, on.dtype(at::kInt));
    update(scale, tracker, at::full({}, step.found, on.dtype(at::kFloat)), step.interval);
    at::Tensor aten_scale = at::full({}, 1024.0f),
               aten_tracker = at::full({}, step.tracker, at::kInt);
    at::_amp_update_scale_(aten_scale, aten_tracker, at::full({}, step.found), 2.0, 0.5,
                           step.interval);
    CHECK(same_bits(scale.cpu(), aten_scale));
    CHECK(tracker.item<int64_t>() == step.expected);
    const int64_t aten_value = aten_tracker.item<int64_t>();
    CHECK(aten_value == (step.aten_wraps ? std::numeric_limits<int32_t>::min() : step.expected));
  }
}

void require_counters_saturate(c10::Device device) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const auto on = at::TensorOptions().device(device);
  UpdateOptions o;
  o.growth_interval = 1000;
  for (const float found : {0.0f, 1.0f}) {
    INFO((found != 0.0f ? "an overflow" : "a clean step") << " at the counters' maximum");
    at::Tensor scale = at::full({}, 1024.0f, on.dtype(at::kFloat));
    at::Tensor tracker = at::zeros({}, on.dtype(at::kInt));
    at::Tensor counters =
        at::tensor({kMax, kMax, found != 0.0f ? kMax : int64_t{5}}, at::kLong).to(device);
    at::Tensor allowance = at::ones({}, on.dtype(at::kInt));
    update_scale_extended_(scale, tracker, allowance, counters,
                           at::full({}, found, on.dtype(at::kFloat)), o);
    const at::Tensor host = counters.cpu();
    CHECK(host[0].item<int64_t>() == kMax);
    CHECK(host[1].item<int64_t>() == kMax);
    CHECK(host[2].item<int64_t>() == (found != 0.0f ? kMax : 0));
  }
}

}  // namespace amp_test
