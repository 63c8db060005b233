// FusedLion: lion-pytorch's names and defaults, the sign step, GradScaler's skip, bf16 weights
// that keep their updates, param groups and checkpoints, and bad input. The bit-for-bit
// comparisons with the lion-pytorch package are in tests/parity/lion_parity.py.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <vector>

#include <amp/grad_scaler.h>
#include <amp/optim/lion.h>

#include "support/optim_helpers.h"

using amp::optim::FusedLion;
using amp::optim::FusedLionOptions;
using amp::optim::FusedLionParamState;

namespace {

const FusedLionParamState& state_of(const FusedLion& opt, const torch::Tensor& param) {
  return static_cast<const FusedLionParamState&>(*opt.state().at(param.unsafeGetTensorImpl()));
}

}  // namespace

TEST_CASE("FusedLion has lion-pytorch's option names and defaults", "[optim][lion]") {
  const FusedLionOptions o;
  CHECK(o.lr() == 1e-4);
  CHECK(o.betas() == std::make_tuple(0.9, 0.99));
  CHECK(o.weight_decay() == 0.0);
  CHECK_FALSE(o.maximize());
  CHECK_FALSE(o.kahan_summation());
  CHECK_FALSE(o.state_dtype().has_value());
  // The options chain across the optimizer's own fields and the low-precision ones.
  const auto chained = FusedLionOptions(3e-4).kahan_summation(true).weight_decay(0.1);
  CHECK(chained.kahan_summation());
  CHECK(chained.weight_decay() == 0.1);
  CHECK(chained == FusedLionOptions(3e-4).weight_decay(0.1).kahan_summation(true));
  CHECK_FALSE(chained == FusedLionOptions(3e-4).weight_decay(0.1));
}

TEST_CASE("Each Lion step moves every weight by lr along the sign, after the decay",
          "[optim][lion]") {
  // Powers of two: every product and sum below is exact in float32.
  auto w = torch::full({64}, 2.0f).requires_grad_(true);
  FusedLion opt({w}, FusedLionOptions(0.25).betas({0.5, 0.75}).weight_decay(0.5));
  torch::Tensor grad = torch::full({64}, 1.0f);
  grad.slice(0, 32) = -1.0f;  // the second half descends the other way
  grad[5] = 0.0f;             // a zero interpolation (first step): no move beyond the decay
  w.mutable_grad() = grad.clone();
  opt.step();
  // decay 1 - 0.25 * 0.5 = 0.875: 2 -> 1.75, then -0.25 * sign(0.5 * g).
  CHECK(w[0].item<float>() == 1.5f);
  CHECK(w[40].item<float>() == 2.0f);
  CHECK(w[5].item<float>() == 1.75f);
  // The momentum: 0.75 * 0 + 0.25 * g.
  CHECK(same_bits(state_of(opt, w).exp_avg(), grad * 0.25f));
  CHECK(state_of(opt, w).step().item<float>() == 1.0f);
  // Second step: interpolation 0.5 * 0.25 g + 0.5 g keeps the sign of g.
  w.mutable_grad() = grad.clone();
  opt.step();
  CHECK(w[0].item<float>() == 1.5f * 0.875f - 0.25f);
  CHECK(w[40].item<float>() == 2.0f * 0.875f + 0.25f);
}

TEST_CASE("A Lion step skipped by GradScaler changes no weight, momentum or count",
          "[optim][lion][scaler]") {
  torch::manual_seed(3);
  auto w = torch::randn({33}).requires_grad_(true);
  FusedLion opt({w}, FusedLionOptions(1e-3).weight_decay(0.1));
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(256.0));
  const auto step = [&](bool poison) {
    opt.zero_grad();
    scaler.scale((w * w).sum()).backward();
    if (poison) {
      torch::NoGradGuard no_grad;
      w.mutable_grad()[7] = std::nan("");
    }
    const auto result = scaler.step(opt);
    scaler.update();
    return result;
  };
  step(false);
  const auto before = w.detach().clone();
  const auto momentum = state_of(opt, w).exp_avg().clone();
  const auto result = step(true);
  CHECK(result.outcome == amp::StepOutcome::kDecidedOnDevice);
  CHECK(result.found_inf.item<float>() == 1.0f);
  CHECK(same_bits(w.detach(), before));
  CHECK(same_bits(state_of(opt, w).exp_avg(), momentum));
  CHECK(state_of(opt, w).step().item<float>() == 1.0f);
  CHECK(scaler.get_scale() == 128.0);
  // The next clean step moves again, with the gradient unscaled in the kernel.
  step(false);
  CHECK_FALSE(same_bits(w.detach(), before));
  CHECK(state_of(opt, w).step().item<float>() == 2.0f);
}

TEST_CASE("bf16 weights under Lion: round to nearest loses the steps, the write-backs keep them",
          "[optim][lion][low_precision]") {
  // 500 steps of lr = 2^-13 (below half of bf16's step of 2^-7 at 1.0) with gradient -1: float32
  // moves from 1.0 to 1 + 500 * 2^-13 = 1.06103515625.
  const double lr = std::ldexp(1.0, -13);
  const auto run = [&](torch::Dtype dtype, FusedLionOptions options) {
    auto w = torch::ones({4096}, torch::dtype(dtype)).requires_grad_(true);
    FusedLion opt({w}, options.betas({0.9, 0.99}));
    for (int k = 0; k < 500; ++k) {
      w.mutable_grad() = torch::full({4096}, -1.0, torch::dtype(dtype));
      opt.step();
    }
    return w.detach().to(torch::kFloat);
  };
  const double fp32 = run(torch::kFloat, FusedLionOptions(lr))[0].item<double>();
  CHECK(fp32 == 1.0 + 500.0 * lr);
  CHECK(run(torch::kBFloat16, FusedLionOptions(lr)).eq(1.0f).all().item<bool>());
  const double half_step = std::ldexp(1.0, -8);
  CHECK((run(torch::kBFloat16, FusedLionOptions(lr).master_weights(true)) - fp32)
            .abs()
            .max()
            .item<double>() <= half_step);
  CHECK((run(torch::kBFloat16, FusedLionOptions(lr).kahan_summation(true)) - fp32)
            .abs()
            .max()
            .item<double>() <= half_step);
  const double sr =
      run(torch::kBFloat16, FusedLionOptions(lr).stochastic_rounding(true)).mean().item<double>();
  CHECK(std::abs(sr - fp32) <= 0.01 * (fp32 - 1.0));
}

TEST_CASE("FusedLion's checkpoint resumes bit for bit and a foreign one is refused",
          "[optim][lion]") {
  const auto make = [] {
    torch::manual_seed(9);
    return std::vector<torch::Tensor>{torch::randn({5, 3}).requires_grad_(true),
                                      torch::randn({7}).to(torch::kBFloat16).requires_grad_(true)};
  };
  const auto grads = [](std::vector<torch::Tensor>& params, int k) {
    torch::manual_seed(100 + k);
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes()).to(p.scalar_type());
  };
  const auto options = FusedLionOptions(1e-2).weight_decay(0.05).kahan_summation(true);
  auto straight = make();
  FusedLion uninterrupted(straight, options);
  auto resumed = make();
  auto first = std::make_unique<FusedLion>(resumed, options);
  std::stringstream saved;
  for (int k = 0; k < 6; ++k) {
    grads(straight, k);
    uninterrupted.step();
    grads(resumed, k);
    first->step();
    if (k == 2) {
      torch::save(*first, saved);
      first = std::make_unique<FusedLion>(resumed, FusedLionOptions());
      torch::load(*first, saved);
      CHECK(static_cast<const FusedLionOptions&>(first->param_groups()[0].options()) == options);
    }
  }
  CHECK(all_same_bits(resumed, straight));
  // A checkpoint of another model (other shapes) is refused, and the optimizer is unchanged.
  auto other =
      std::vector<torch::Tensor>{torch::randn({4, 3}).requires_grad_(true),
                                 torch::randn({7}).to(torch::kBFloat16).requires_grad_(true)};
  FusedLion foreign(other, options);
  grads(other, 0);
  foreign.step();
  std::stringstream foreign_saved;
  torch::save(foreign, foreign_saved);
  const auto momentum = state_of(*first, resumed[0]).exp_avg().clone();
  CHECK_THROWS_WITH(torch::load(*first, foreign_saved),
                    Contains("FusedLion::load") && Contains("The optimizer is unchanged."));
  CHECK(same_bits(state_of(*first, resumed[0]).exp_avg(), momentum));
}

TEST_CASE("FusedLion refuses bad options and parameters with a sentence", "[optim][lion]") {
  auto w = torch::zeros({3}, torch::requires_grad());
  CHECK_THROWS_WITH(FusedLion({w}, FusedLionOptions(-1.0)),
                    Contains("FusedLion: lr must be finite and >= 0. Got lr=-1"));
  CHECK_THROWS_WITH(FusedLion({w}, FusedLionOptions().betas({0.9, 1.5})),
                    Contains("betas[1] must be in [0, 1]. Got betas[1]=1.5"));
  CHECK_THROWS_WITH(FusedLion({w}, FusedLionOptions().weight_decay(-0.1)),
                    Contains("weight_decay must be finite and >= 0"));
  auto f64 = torch::zeros({3}, torch::dtype(torch::kDouble).requires_grad(true));
  CHECK_THROWS_WITH(FusedLion({f64}), Contains("FusedLion (param group 0): FusedLion updates "
                                               "float32, bfloat16 and float16 parameters, and "
                                               "this group has Double ones"));
  CHECK_THROWS_WITH(FusedLion({w}, FusedLionOptions().kahan_summation(true)),
                    Contains("none of the optimizer's parameters is one (they are Float)"));
}
