// GradScaler's opt-in extensions: hysteresis, min/max scale, the min-scale policy, counters.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <amp/grad_scaler.h>

#include "support/host_reads.h"
#include "support/scaler_helpers.h"

namespace {

// Runs one iteration with a finite (clean) or infinite gradient; returns whether it stepped.
struct Loop {
  explicit Loop(GradScalerOptions options)
      : scaler(cpu_scaler(std::move(options))), param(make_param(1)), optimizer({param}, 0.0) {
    scaler.scale(torch::ones({}));
  }
  bool iterate(bool overflow) {
    set_grad(param, torch::full({1}, overflow ? INFINITY : 1.0f));
    const bool taken = scaler.step(optimizer).read_taken();
    scaler.update();
    return taken;
  }
  GradScaler scaler;
  torch::Tensor param;
  torch::optim::SGD optimizer;
};

}  // namespace

TEST_CASE("Extensions that never bind follow torch.amp's trajectory exactly", "[scaler]") {
  // A cap that is never reached and counters put the update on its extension arguments; the
  // scale and tracker must still be ATen's _amp_update_scale_ (what Python's GradScaler runs),
  // applied here directly to the same flags.
  const auto options = GradScalerOptions().init_scale(3.0).growth_interval(2).backoff_factor(0.3);
  Loop extended(GradScalerOptions(options).max_scale(1e30).track_counters(true));
  auto scale = torch::full({}, 3.0f);
  auto tracker = torch::zeros({}, torch::kInt);
  for (bool overflow : {false, false, true, false, true, true, false, false, false}) {
    CHECK(extended.iterate(overflow) == !overflow);
    at::_amp_update_scale_(scale, tracker, torch::full({}, overflow ? 1.0f : 0.0f), 2.0, 0.3, 2);
    CHECK(extended.scaler.scale_tensor().item<float>() == scale.item<float>());
    CHECK(extended.scaler.get_growth_tracker() == tracker.item<int>());
  }
  CHECK(extended.scaler.counters().steps_skipped == 3);
}

TEST_CASE(
    "Hysteresis backs off only after N overflows and refills after growth_interval clean "
    "steps",
    "[scaler]") {
  Loop loop(GradScalerOptions().init_scale(64.0).hysteresis(2).growth_interval(3));
  CHECK_FALSE(loop.iterate(true));
  CHECK(loop.scaler.get_scale() == 64.0);  // first overflow spends the allowance
  CHECK(loop.scaler.hysteresis_remaining() == 1);
  CHECK(loop.scaler.get_growth_tracker() == 0);
  loop.iterate(true);
  CHECK(loop.scaler.get_scale() == 32.0);  // second one backs off
  loop.iterate(true);
  CHECK(loop.scaler.get_scale() == 16.0);  // still exhausted: every overflow backs off
  loop.iterate(false);
  loop.iterate(false);
  CHECK(loop.scaler.hysteresis_remaining() == 0);  // not refilled before growth
  loop.iterate(false);
  CHECK(loop.scaler.get_scale() == 32.0);
  CHECK(loop.scaler.hysteresis_remaining() == 2);  // refilled with the growth
}

TEST_CASE("Consecutive hysteresis refills after every clean step", "[scaler]") {
  Loop loop(GradScalerOptions().init_scale(64.0).hysteresis(2).consecutive_hysteresis(true));
  loop.iterate(true);
  CHECK(loop.scaler.hysteresis_remaining() == 1);
  loop.iterate(false);
  CHECK(loop.scaler.hysteresis_remaining() == 2);
  loop.iterate(true);
  CHECK(loop.scaler.get_scale() == 64.0);
}

TEST_CASE("min_scale and max_scale bound the scale", "[scaler]") {
  Loop low(GradScalerOptions().init_scale(4.0).min_scale(2.0));
  low.iterate(true);
  low.iterate(true);
  low.iterate(true);
  CHECK(low.scaler.get_scale() == 2.0);
  Loop high(GradScalerOptions().init_scale(4.0).max_scale(6.0).growth_interval(1));
  high.iterate(false);
  CHECK(high.scaler.get_scale() == 6.0);
  high.iterate(false);
  CHECK(high.scaler.get_scale() == 6.0);
}

TEST_CASE("Bounds float32 cannot hold are applied as float32, and every state reached reloads",
          "[scaler]") {
  // 0.7 rounds down to float32 0.69999999, 1e5 + 0.2 up to 100000.203125: a scale at either
  // bound lies outside it in double, so the bounds are compared as the float32 scale is kept.
  const auto options = GradScalerOptions().init_scale(0.7).min_scale(0.7).max_scale(1e5 + 0.2);
  Loop loop(options);
  CHECK(loop.scaler.get_scale() == static_cast<double>(0.7f));
  loop.iterate(true);  // backs off to the floor: float32(0.7)
  CHECK(loop.scaler.get_scale() == static_cast<double>(0.7f));
  auto twin = cpu_scaler(options);
  REQUIRE_NOTHROW(twin.load_state_dict(loop.scaler.state_dict()));
  loop.scaler.update(1e5 + 0.2);  // stored as 100000.203125 > 1e5 + 0.2, still the bound
  CHECK(loop.scaler.get_scale() == static_cast<double>(static_cast<float>(1e5 + 0.2)));
  REQUIRE_NOTHROW(twin.load_state_dict(loop.scaler.state_dict()));
}

TEST_CASE("update(new_scale) outside [min_scale, max_scale] is refused and changes nothing",
          "[scaler]") {
  // Accepting it would save a state that load_state_dict refuses.
  Loop loop(GradScalerOptions().init_scale(4.0).min_scale(2.0).max_scale(64.0));
  loop.scaler.scale(torch::ones({}));
  CHECK_THROWS_WITH(loop.scaler.update(1.0),
                    Contains("GradScaler::update: new_scale must lie in [min_scale, max_scale]. "
                             "Got new_scale=1 with min_scale=2 and max_scale=64"));
  CHECK_THROWS_WITH(loop.scaler.update(torch::full({}, 128.0f)),
                    Contains("new_scale must lie in [min_scale, max_scale]"));
  CHECK(loop.scaler.get_scale() == 4.0);
  loop.scaler.update(64.0);
  CHECK(loop.scaler.get_scale() == 64.0);
}

TEST_CASE("With hysteresis 1 the allowance reads 1, also after loading 0", "[scaler]") {
  // Every overflow backs off, so there is no allowance to carry; 0 and 1 behave the same.
  Loop loop(GradScalerOptions().init_scale(64.0).max_scale(1024.0));
  auto dict = loop.scaler.state_dict();
  dict.insert_or_assign("_amp_hysteresis_remaining", int64_t{0});
  loop.scaler.load_state_dict(dict);
  CHECK(loop.scaler.hysteresis_remaining() == 1);
  loop.iterate(true);
  CHECK(loop.scaler.hysteresis_remaining() == 1);
  CHECK(loop.scaler.get_scale() == 32.0);
}

TEST_CASE("The throw policy stops at min_scale with advice, the skip policy keeps skipping",
          "[scaler]") {
  Loop strict(
      GradScalerOptions().init_scale(4.0).min_scale(2.0).at_min_scale(amp::MinScalePolicy::kThrow));
  strict.iterate(true);  // 4 -> 2 is allowed
  CHECK(strict.scaler.get_scale() == 2.0);
  set_grad(strict.param, torch::full({1}, INFINITY));
  CHECK_THROWS_WITH(strict.scaler.step(strict.optimizer),
                    Contains("while the scale is already at min_scale=2") &&
                        Contains("MinScalePolicy::kSkip keeps skipping"));
  Loop lenient(GradScalerOptions().init_scale(4.0).min_scale(2.0));
  for (int i = 0; i < 3; ++i) CHECK_FALSE(lenient.iterate(true));
  CHECK(lenient.scaler.get_scale() == 2.0);
}

TEST_CASE("The throw policy decides with one host read per step, the hysteresis allowance included",
          "[scaler]") {
  // At min_scale with an allowance of 2: the first overflow only spends a unit (no throw), the
  // second would back off below the floor and throws. The flag that skips the step and the
  // min-scale check are read together, so every step reads once, as without the policy.
  Loop loop(GradScalerOptions().init_scale(2.0).min_scale(2.0).hysteresis(2).at_min_scale(
      amp::MinScalePolicy::kThrow));
  const auto step_reads = [&](bool overflow) {
    set_grad(loop.param, torch::full({1}, overflow ? INFINITY : 1.0f));
    amp_test::HostReadRecorder recorder;
    try {
      loop.scaler.step(loop.optimizer);
    } catch (const c10::Error& e) {
      CHECK_THAT(e.what(), Contains("while the scale is already at min_scale=2"));
      return -static_cast<int>(recorder.reads().size());  // negative: it threw
    }
    return static_cast<int>(recorder.reads().size());
  };
  CHECK(step_reads(false) == 1);
  loop.scaler.update();
  CHECK(step_reads(true) == 1);
  loop.scaler.update();
  CHECK(loop.scaler.hysteresis_remaining() == 1);
  CHECK(loop.scaler.get_scale() == 2.0);
  CHECK(step_reads(true) == -1);
}

TEST_CASE("Counters count taken, skipped and consecutive skipped iterations", "[scaler]") {
  Loop loop(GradScalerOptions().track_counters(true));
  for (bool overflow : {false, true, true, false, true}) loop.iterate(overflow);
  const auto counters = loop.scaler.counters();
  CHECK(counters.steps_taken == 2);
  CHECK(counters.steps_skipped == 3);
  CHECK(counters.consecutive_skips == 1);
  auto untracked = cpu_scaler();
  CHECK_THROWS_WITH(untracked.counters(), Contains("track_counters(true)"));
}
