// GradScaler with float16 weights kept in float32 master copies (the GUIDE's recipe for fp16
// weights): unscale_ and unscale_and_clip_ unscale the float16 gradients into float32 master
// gradients (Apex O2) instead of refusing them, clipping sees the unscaled values, small gradients
// survive, and a step after unscale_ gives the bits of the step that unscales in its kernel.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/optim_helpers.h"

namespace {

enum class Unscale { kInStep, kUnscale, kUnscaleAndClip };

struct Run {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> masters;
  torch::Tensor norm;
};

// Three iterations on two float16 parameters whose scaled gradients are set by hand (the scale
// is 2^16), the second iteration's with an inf; FusedAdamW with master weights.
Run train(Unscale how, double max_norm = 1e9) {
  torch::manual_seed(51);
  std::vector<torch::Tensor> params{torch::randn({16}).to(torch::kHalf).requires_grad_(true),
                                    torch::randn({4, 4}).to(torch::kHalf).requires_grad_(true)};
  FusedAdamW opt(params, FusedAdamWOptions(1e-2).master_weights(true));
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(65536.0));
  scaler.scale(torch::ones({}));
  Run run;
  for (int k = 0; k < 3; ++k) {
    opt.zero_grad();
    torch::manual_seed(60 + k);
    for (auto& p : params) p.mutable_grad() = (torch::randn(p.sizes()) * 65536.0).to(torch::kHalf);
    if (k == 1) params[1].mutable_grad()[2][3] = INFINITY;
    if (how == Unscale::kUnscale) scaler.unscale_(opt);
    if (how == Unscale::kUnscaleAndClip) run.norm = scaler.unscale_and_clip_(opt, max_norm);
    scaler.step(opt);
    scaler.update();
  }
  for (const auto& p : params) {
    run.params.push_back(p.detach().clone());
    run.masters.push_back(
        static_cast<const FusedAdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()))
            .master_weight()
            .clone());
  }
  return run;
}

}  // namespace

TEST_CASE("unscale_ and unscale_and_clip_ take fp16 gradients into float32 master gradients",
          "[interactions][scaler][low_precision]") {
  // With a power-of-two scale, unscaling in float32 before the step gives the bits of the step's
  // own unscaling (the kernel reads the float16 gradient in float32 and divides there).
  const auto in_step = train(Unscale::kInStep);
  for (const auto how : {Unscale::kUnscale, Unscale::kUnscaleAndClip}) {
    CAPTURE(static_cast<int>(how));
    const auto got = train(how);
    CHECK(all_same_bits(got.params, in_step.params));
    CHECK(all_same_bits(got.masters, in_step.masters));
  }
  CHECK(in_step.params[0].scalar_type() == torch::kHalf);
}

TEST_CASE("A float16 gradient too small for float16 once unscaled survives in float32",
          "[interactions][scaler][low_precision]") {
  auto param = torch::zeros({4}, torch::kHalf).requires_grad_(true);
  FusedSGD opt({param}, FusedSGDOptions(1.0).master_weights(true));
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(65536.0));
  scaler.scale(torch::ones({}));
  // 2^-30 scaled by 2^16 is 2^-14, a float16 value; unscaled in float16 it would flush to zero
  // (float16's smallest subnormal is 2^-24).
  param.mutable_grad() = torch::full({4}, std::ldexp(1.0, -14)).to(torch::kHalf);
  scaler.unscale_(opt);
  const auto masters = opt.master_params();
  REQUIRE(masters.size() == 1);
  REQUIRE(masters[0].scalar_type() == torch::kFloat);
  CHECK(masters[0].grad().eq(static_cast<float>(std::ldexp(1.0, -30))).all().item<bool>());
  // The float16 gradient itself is left as it was (scaled).
  CHECK(param.grad().eq(std::ldexp(1.0, -14)).all().item<bool>());
  scaler.step(opt);
  scaler.update();
  // SGD moved the float32 master by -2^-30, which float16 cannot show; the master keeps it.
  const auto& state = static_cast<const amp::optim::FusedSGDParamState&>(
      *opt.state().at(param.unsafeGetTensorImpl()));
  CHECK(state.master_weight().eq(-static_cast<float>(std::ldexp(1.0, -30))).all().item<bool>());
  CHECK_FALSE(state.master_weight().grad().defined());  // let go after the step
}

TEST_CASE("Clipping after unscale_ acts on the float32 master gradients of fp16 weights",
          "[interactions][scaler][low_precision]") {
  // unscale_ then torch::nn::utils::clip_grad_norm_ over master_params() (Apex's recipe), and
  // unscale_and_clip_, both leave the step's gradients at the clipping norm.
  torch::manual_seed(52);
  auto weight = torch::randn({8, 8}).to(torch::kHalf).requires_grad_(true);
  auto norm_weight = torch::ones({8}).requires_grad_(true);  // float32, as a kept norm layer
  for (const bool fused_clip : {false, true}) {
    CAPTURE(fused_clip);
    FusedAdamW opt({weight, norm_weight}, FusedAdamWOptions(1e-3).master_weights(true));
    amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(1024.0));
    scaler.scale(torch::ones({}));
    weight.mutable_grad() = (torch::randn({8, 8}) * 1024.0 * 10.0).to(torch::kHalf);
    norm_weight.mutable_grad() = torch::randn({8}) * 1024.0 * 10.0;
    torch::Tensor total;
    if (fused_clip) {
      total = scaler.unscale_and_clip_(opt, 1.0);
    } else {
      scaler.unscale_(opt);
      total = torch::tensor(torch::nn::utils::clip_grad_norm_(opt.master_params(), 1.0));
    }
    CHECK(total.item<double>() > 1.0);
    const auto targets = opt.master_params();
    REQUIRE(targets.size() == 2);
    CHECK(targets[0].scalar_type() == torch::kFloat);  // the master copy of the fp16 weight
    CHECK(targets[1].is_same(norm_weight));            // a float32 parameter is its own
    const double clipped = std::hypot(targets[0].grad().norm().item<double>(),
                                      targets[1].grad().norm().item<double>());
    CHECK(clipped == Approx(1.0).epsilon(1e-4));
    scaler.step(opt);
    scaler.update();
    CHECK(torch::isfinite(weight.to(torch::kFloat)).all().item<bool>());
  }
}

TEST_CASE("fp16 gradients without float32 master copies are still refused, changing nothing",
          "[interactions][scaler][low_precision]") {
  auto master = torch::zeros({4}, torch::kHalf).requires_grad_(true);
  auto plain = torch::zeros({4}, torch::kHalf).requires_grad_(true);
  // One group with master weights, one without: the refusal attaches no master gradient.
  FusedAdamW opt(
      {torch::optim::OptimizerParamGroup({master}),
       torch::optim::OptimizerParamGroup({plain}, std::make_unique<FusedAdamWOptions>(
                                                      FusedAdamWOptions().master_weights(false)))},
      FusedAdamWOptions(1e-3).master_weights(true));
  amp::GradScaler scaler(c10::DeviceType::CPU);
  scaler.scale(torch::ones({}));
  master.mutable_grad() = torch::ones({4}, torch::kHalf);
  plain.mutable_grad() = torch::ones({4}, torch::kHalf);
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("Attempting to unscale FP16 gradients.") &&
                                              Contains("master_weights(true)"));
  CHECK(opt.state().empty());
  // An unscale_ whose step never ran leaves nothing for a later step: once the float16 gradient
  // is replaced (zero_grad and another backward), its float32 copy is stale and ignored.
  FusedSGD sgd({master}, FusedSGDOptions(0.5).master_weights(true));
  amp::GradScaler other(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(2.0));
  other.scale(torch::ones({}));
  other.unscale_(sgd);
  REQUIRE(sgd.master_params()[0].scalar_type() == torch::kFloat);
  sgd.zero_grad();
  sgd.step();  // no gradient: nothing stepped, and the float32 copy must not survive for later
  master.mutable_grad() = torch::full({4}, 2.0).to(torch::kHalf);  // a new gradient, unscaled
  CHECK(sgd.master_params()[0].is_same(master));
  sgd.step();  // reads the new float16 gradient: 0 - 0.5 * 2 = -1, not the stale 0.5
  CHECK(master.eq(-1.0).all().item<bool>());
}
