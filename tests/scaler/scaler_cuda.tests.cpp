// GPU tests of amp::GradScaler: clipping against unscale_ + clip_grad_norm_ on CUDA, and the host
// synchronisations of an iteration counted with CUDA's sync-debug mode.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>

#include "support/bits.h"
#include "support/cuda_syncs.h"

namespace {

const torch::Device kCuda(torch::kCUDA);

using amp_test::raw_bits;
using amp_test::syncs_in;

struct Model {
  torch::nn::Sequential net{torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8)};
  Model() { net->to(kCuda); }
  /// fp16-autocast forward and an fp32 loss, as a training step computes them.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    const amp::AutocastGuard autocast(c10::DeviceType::CUDA, torch::kHalf);
    return torch::mse_loss(net->forward(x).to(torch::kFloat), y);
  }
};

}  // namespace

TEST_CASE("A CUDA GradScaler synchronises with the host once per iteration, in step()",
          "[scaler][cuda]") {
  torch::manual_seed(31);
  // 0: step() unscales; 1: unscale_() first; 2: unscale_and_clip_() first.
  const int unscale_kind = GENERATE(0, 1, 2);
  Model model;
  torch::optim::SGD opt(model.net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1024.0).growth_interval(2));
  // Warm-up outside the counted calls: CUDA context, cuBLAS handles, the autocast weight casts.
  model.loss(torch::randn({16, 32}, kCuda), torch::randn({16, 8}, kCuda)).backward();
  opt.zero_grad();
  torch::cuda::synchronize();

  std::vector<float> found_per_iteration;
  for (int it = 0; it < 6; ++it) {
    const bool overflow = it == 3;
    INFO("iteration " << it << " unscale kind " << unscale_kind);
    opt.zero_grad();
    const auto loss = model.loss(torch::randn({16, 32}, kCuda), torch::randn({16, 8}, kCuda));
    torch::Tensor scaled;
    CHECK(syncs_in([&] { scaled = scaler.scale(loss); }) == 0);  // the first one creates the scale
    scaled.backward();
    if (overflow) {
      const torch::NoGradGuard no_grad;
      model.net->parameters()[0].grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
    }
    if (unscale_kind == 1) CHECK(syncs_in([&] { scaler.unscale_(opt); }) == 0);
    if (unscale_kind == 2) CHECK(syncs_in([&] { scaler.unscale_and_clip_(opt, 1.0); }) == 0);
    amp::StepResult result;
    CHECK(syncs_in([&] { result = scaler.step(opt); }) == 1);
    CHECK(result.read_taken() == !overflow);
    CHECK(syncs_in([&] { scaler.update(); }) == 0);
    found_per_iteration.push_back(overflow ? 1.0f : 0.0f);
  }
  // The scale moved as ATen's CUDA update moves it over the same flags.
  auto scale = torch::full({}, 1024.0f, kCuda);
  auto tracker = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt).device(kCuda));
  for (float f : found_per_iteration) {
    at::_amp_update_scale_(scale, tracker, torch::full({}, f, kCuda), 2.0, 0.5, 2);
  }
  CHECK(scaler.get_scale() == scale.item<float>());
  CHECK(scaler.get_growth_tracker() == tracker.item<int>());
}

TEST_CASE("A CUDA GradScaler with the extensions also synchronises only in step()",
          "[scaler][cuda]") {
  torch::manual_seed(32);
  const auto policy = GENERATE(amp::MinScalePolicy::kSkip, amp::MinScalePolicy::kThrow);
  Model model;
  torch::optim::SGD opt(model.net->parameters(), torch::optim::SGDOptions(0.01));
  amp::GradScaler scaler(amp::GradScalerOptions()
                             .init_scale(1024.0)
                             .growth_interval(2)
                             .hysteresis(2)
                             .min_scale(1.0)
                             .max_scale(4096.0)
                             .at_min_scale(policy)
                             .track_counters(true));
  model.loss(torch::randn({16, 32}, kCuda), torch::randn({16, 8}, kCuda)).backward();
  opt.zero_grad();
  torch::cuda::synchronize();

  int taken = 0, skipped = 0;
  for (int it = 0; it < 6; ++it) {
    const bool overflow = it == 3;
    INFO("iteration " << it);
    opt.zero_grad();
    const auto loss = model.loss(torch::randn({16, 32}, kCuda), torch::randn({16, 8}, kCuda));
    torch::Tensor scaled;
    CHECK(syncs_in([&] { scaled = scaler.scale(loss); }) == 0);
    scaled.backward();
    if (overflow) {
      const torch::NoGradGuard no_grad;
      model.net->parameters()[2].grad()[1][1] = std::numeric_limits<float>::infinity();
    }
    CHECK(syncs_in([&] { scaler.unscale_(opt); }) == 0);
    amp::StepResult result;
    CHECK(syncs_in([&] { result = scaler.step(opt); }) == 1);
    CHECK(result.read_taken() == !overflow);
    CHECK(syncs_in([&] { scaler.update(); }) == 0);
    (overflow ? skipped : taken) += 1;
  }
  const auto counters = scaler.counters();
  CHECK(counters.steps_taken == taken);
  CHECK(counters.steps_skipped == skipped);
  CHECK(counters.consecutive_skips == 0);
}

TEST_CASE("GradScaler::unscale_and_clip_ on CUDA equals unscale_ then clip_grad_norm_",
          "[scaler][cuda]") {
  torch::manual_seed(33);
  const double max_norm = GENERATE(0.5, 1.0e9);
  const bool overflow = GENERATE(false, true);
  INFO("max_norm " << max_norm << (overflow ? " with an inf gradient" : ""));
  // Gradients of several sizes, one of them transposed (dense, not contiguous), scaled by 1024.
  const std::vector<torch::Tensor> grads = {
      torch::randn({70000}, kCuda) * 1024, torch::randn({999}, kCuda) * 1024,
      torch::randn({60, 40}, kCuda).t() * 1024, torch::randn({300001}, kCuda) * 1024};
  const auto make_params = [&] {
    std::vector<torch::Tensor> params;
    for (const auto& g : grads) {
      auto p = torch::zeros_like(g, torch::MemoryFormat::Preserve).requires_grad_(true);
      p.mutable_grad() = g.clone();
      params.push_back(p);
    }
    if (overflow) {
      const torch::NoGradGuard no_grad;
      params[1].grad()[7] = std::numeric_limits<float>::infinity();
    }
    return params;
  };
  auto mine = make_params(), ref = make_params();
  torch::optim::SGD opt_mine(mine, torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt_ref(ref, torch::optim::SGDOptions(0.1));
  const auto options = amp::GradScalerOptions().init_scale(1024.0).growth_interval(1);
  amp::GradScaler scaler_mine(c10::DeviceType::CUDA, options);
  amp::GradScaler scaler_ref(c10::DeviceType::CUDA, options);
  scaler_mine.scale(torch::ones({}, kCuda));  // creates the scale on the GPU
  scaler_ref.scale(torch::ones({}, kCuda));

  const auto total = scaler_mine.unscale_and_clip_(opt_mine, max_norm);
  scaler_ref.unscale_(opt_ref);
  const double ref_total = torch::nn::utils::clip_grad_norm_(ref, max_norm);
  CHECK(total.is_cuda());
  if (overflow) {
    CHECK_FALSE(std::isfinite(total.item<float>()));
    CHECK_FALSE(std::isfinite(ref_total));
  } else {
    CHECK(total.item<double>() == Approx(ref_total).epsilon(1e-5));
    REQUIRE(ref_total > 1.0);  // so max_norm 0.5 clips
    for (size_t i = 0; i < grads.size(); ++i) {
      INFO("gradient " << i);
      if (max_norm > 1.0e6) {
        CHECK(torch::equal(raw_bits(mine[i].grad()), raw_bits(ref[i].grad())));
      } else {
        CHECK(torch::allclose(mine[i].grad(), ref[i].grad(), 1e-5, 1e-9));
      }
    }
  }
  const auto step_mine = scaler_mine.step(opt_mine);
  const auto step_ref = scaler_ref.step(opt_ref);
  CHECK(step_mine.read_taken() == !overflow);
  CHECK(step_ref.read_taken() == !overflow);
  scaler_mine.update();
  scaler_ref.update();
  CHECK(scaler_mine.get_scale() == scaler_ref.get_scale());
  CHECK(scaler_mine.get_growth_tracker() == scaler_ref.get_growth_tracker());
  if (!overflow) {
    for (size_t i = 0; i < grads.size(); ++i) {
      CHECK(torch::allclose(mine[i], ref[i], 1e-5, 1e-7));
    }
  }
}
