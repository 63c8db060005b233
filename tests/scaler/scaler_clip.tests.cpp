// GradScaler::unscale_and_clip_: the fused unscale + clip against unscale_ followed by
// torch::nn::utils::clip_grad_norm_, its place in the state machine, and its argument checks.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include <amp/grad_scaler.h>

#include "support/scaler_helpers.h"

namespace {

// Two parameters with scaled gradients (scale 1024) whose unscaled norm is 5 * sqrt(2) * 3.
struct TwoParams {
  torch::Tensor weight = torch::ones({3, 4}).requires_grad_(true);
  torch::Tensor bias = torch::ones({4}).requires_grad_(true);

  explicit TwoParams(float grad_value = 3.0f) {
    torch::manual_seed(0);
    amp_test::set_grad(weight, torch::randn({3, 4}) * 1024.0f);
    amp_test::set_grad(bias, torch::full({4}, grad_value * 1024.0f));
  }
  std::vector<torch::Tensor> params() const { return {weight, bias}; }
};

// A scaler whose scale is 1024 (set through update(double) after the lazy init).
amp::GradScaler scaler_at_1024() {
  auto scaler = amp_test::cpu_scaler();
  (void)scaler.scale(torch::ones({}));
  scaler.update(1024.0);
  return scaler;
}

}  // namespace

TEST_CASE("unscale_and_clip_ equals unscale_ then clip_grad_norm_ to float32 rounding",
          "[scaler][clip]") {
  const double max_norm = GENERATE(0.5, 1.0, 1000.0);  // clipping, clipping, no clipping
  TwoParams fused, reference;
  torch::optim::SGD fused_opt(fused.params(), 0.1);
  torch::optim::SGD reference_opt(reference.params(), 0.1);
  auto fused_scaler = scaler_at_1024();
  auto reference_scaler = scaler_at_1024();

  const torch::Tensor norm = fused_scaler.unscale_and_clip_(fused_opt, max_norm);
  reference_scaler.unscale_(reference_opt);
  const double reference_norm = torch::nn::utils::clip_grad_norm_(reference.params(), max_norm);

  CHECK(norm.dim() == 0);
  CHECK(norm.scalar_type() == torch::kFloat);
  CHECK(norm.item<double>() == Approx(reference_norm).epsilon(1e-6));
  CHECK(torch::allclose(fused.weight.grad(), reference.weight.grad(), 1e-6, 0.0));
  CHECK(torch::allclose(fused.bias.grad(), reference.bias.grad(), 1e-6, 0.0));
  if (max_norm == 1000.0) {
    // No clipping: the only multiply is the unscale, so the results are bit-identical.
    CHECK(torch::equal(fused.weight.grad(), reference.weight.grad()));
  }
  // The step that follows is taken, exactly as after unscale_.
  CHECK(fused_scaler.step(fused_opt).read_taken());
  fused_scaler.update();
}

TEST_CASE("unscale_and_clip_ records an overflow so that step() skips and update() backs off",
          "[scaler][clip]") {
  TwoParams params;
  params.bias.mutable_grad()[2] = std::numeric_limits<float>::infinity();
  torch::optim::SGD opt(params.params(), 0.1);
  auto scaler = scaler_at_1024();
  const torch::Tensor before = params.weight.detach().clone();

  const torch::Tensor norm = scaler.unscale_and_clip_(opt, 1.0);
  CHECK_FALSE(std::isfinite(norm.item<double>()));
  CHECK_FALSE(scaler.step(opt).read_taken());
  CHECK(torch::equal(params.weight.detach(), before));  // parameters untouched by a skipped step
  scaler.update();
  CHECK(scaler.get_scale() == 512.0);
}

TEST_CASE("unscale_and_clip_ counts as unscale_ in the state machine", "[scaler][clip]") {
  TwoParams params;
  torch::optim::SGD opt(params.params(), 0.1);
  auto scaler = scaler_at_1024();
  scaler.unscale_and_clip_(opt, 1.0);
  CHECK_THROWS_WITH(scaler.unscale_(opt),
                    Catch::Contains("unscale_() has already been called on "
                                    "this optimizer since the last update()."));
  CHECK_THROWS_WITH(scaler.unscale_and_clip_(opt, 1.0),
                    Catch::Contains("unscale_() has already been called"));
  scaler.step(opt);
  CHECK_THROWS_WITH(scaler.unscale_and_clip_(opt, 1.0),
                    Catch::Contains("unscale_() is being called after step()."));
}

TEST_CASE("unscale_and_clip_ refuses a bad max_norm or eps with the value and a fix",
          "[scaler][clip]") {
  TwoParams params;
  torch::optim::SGD opt(params.params(), 0.1);
  auto scaler = scaler_at_1024();
  CHECK_THROWS_WITH(scaler.unscale_and_clip_(opt, 0.0),
                    Catch::Contains("max_norm must be finite and > 0. Got max_norm=0"));
  CHECK_THROWS_WITH(scaler.unscale_and_clip_(opt, std::numeric_limits<double>::infinity()),
                    Catch::Contains("max_norm must be finite and > 0. Got max_norm=inf"));
  CHECK_THROWS_WITH(scaler.unscale_and_clip_(opt, 1.0, -1.0),
                    Catch::Contains("eps must be finite and >= 0. Got eps=-1"));
  // A refused call changes nothing: unscale_ is still allowed afterwards.
  CHECK_NOTHROW(scaler.unscale_(opt));
}

TEST_CASE("A disabled scaler's unscale_and_clip_ only clips", "[scaler][clip]") {
  TwoParams clipped, reference;
  torch::optim::SGD opt(clipped.params(), 0.1);
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().enabled(false));
  const torch::Tensor norm = scaler.unscale_and_clip_(opt, 1.0);
  const double reference_norm = torch::nn::utils::clip_grad_norm_(reference.params(), 1.0);
  CHECK(norm.item<double>() == Approx(reference_norm).epsilon(1e-6));
  CHECK(torch::allclose(clipped.bias.grad(), reference.bias.grad(), 1e-6, 0.0));
}

TEST_CASE("unscale_and_clip_ refuses sparse gradients and names the alternative",
          "[scaler][clip]") {
  auto param = torch::ones({4, 2}).requires_grad_(true);
  param.mutable_grad() = torch::eye(4).narrow(1, 0, 2).to_sparse();
  torch::optim::SGD opt(std::vector<torch::Tensor>{param}, 0.1);
  auto scaler = scaler_at_1024();
  CHECK_THROWS_WITH(scaler.unscale_and_clip_(opt, 1.0),
                    Catch::Contains("does not support sparse gradients; use unscale_(optimizer) "
                                    "followed by torch::nn::utils::clip_grad_norm_"));
}
