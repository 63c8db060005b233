// GradScaler with optimizers that support scaling: the scale and the flag handed over on the
// device, skipped steps that touch nothing (step counts rolled back), unscale_ + clip first,
// StepResult that does not claim to know, and no host read in scale/step/update.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/host_reads.h"
#include "support/optim_helpers.h"

using amp::GradScaler;
using amp::GradScalerOptions;
using amp::StepOutcome;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Net {
  torch::nn::Sequential net{nullptr};
  explicit Net(uint64_t seed) {
    torch::manual_seed(seed);
    net =
        torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  }
  torch::Tensor loss(int k) {
    torch::manual_seed(500 + k);
    const auto x = torch::randn({4, 6});
    const auto y = torch::randn({4, 3});
    return torch::mse_loss(net->forward(x), y);
  }
  std::vector<torch::Tensor> params() { return net->parameters(); }
  std::vector<torch::Tensor> snapshot() {
    std::vector<torch::Tensor> out;
    for (const auto& p : params()) out.push_back(p.detach().clone());
    return out;
  }
};

GradScaler cpu_scaler(double init_scale = 1024.0) {
  return GradScaler(c10::DeviceType::CPU,
                    GradScalerOptions().init_scale(init_scale).growth_interval(2));
}

// A user's optimizer that implements the protocol by hand: it records what it was handed.
class RecordingOptimizer : public torch::optim::Optimizer, public amp::optim::SupportsAmpScaling {
 public:
  explicit RecordingOptimizer(std::vector<torch::Tensor> params)
      : torch::optim::Optimizer(std::move(params),
                                std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    seen_scale = grad_scale().defined() ? grad_scale().clone() : torch::Tensor();
    seen_found_inf = found_inf().defined() ? found_inf().clone() : torch::Tensor();
    ++steps;
    return {};
  }
  torch::Tensor seen_scale, seen_found_inf;
  int steps = 0;
};

}  // namespace

TEST_CASE("A fused step with GradScaler equals unscaling by hand and stepping without it",
          "[optim][scaler]") {
  const bool sgd = GENERATE(false, true);
  INFO((sgd ? "FusedSGD" : "FusedAdamW"));
  Net scaled(1), manual(1);
  auto make = [&](Net& n) -> std::unique_ptr<torch::optim::Optimizer> {
    if (sgd) return std::make_unique<FusedSGD>(n.params(), FusedSGDOptions(0.1).momentum(0.9));
    return std::make_unique<FusedAdamW>(n.params(), FusedAdamWOptions(0.01));
  };
  auto opt = make(scaled);
  auto ref = make(manual);
  auto scaler = cpu_scaler(1024.0);
  for (int k = 0; k < 4; ++k) {
    opt->zero_grad();
    ref->zero_grad();
    scaler.scale(scaled.loss(k)).backward();
    manual.loss(k).backward();
    const amp::StepResult result = scaler.step(*opt);
    CHECK(result.outcome == StepOutcome::kDecidedOnDevice);
    CHECK(result.found_inf.item<float>() == 0.0f);
    CHECK(result.read_taken());
    CHECK_THROWS_WITH(static_cast<bool>(result), Contains("call read_taken() (one sync)"));
    scaler.update();
    // The reference: gradients times 1024 (exact, a power of two) then divided back.
    for (auto& p : manual.params()) p.mutable_grad() = p.grad() * 1024.0f / 1024.0f;
    ref->step();
    // The kernel leaves the unscaled gradients behind, as Python's does.
    CHECK(all_same_bits(scaled.params(), manual.params()));
    CHECK(same_bits(scaled.params()[0].grad(), manual.params()[0].grad()));
  }
}

TEST_CASE("A skipped fused step changes no parameter or state and takes the step count back",
          "[optim][scaler]") {
  Net net(2);
  FusedAdamW opt(net.params(), FusedAdamWOptions(0.01).amsgrad(true));
  auto scaler = cpu_scaler(256.0);
  // One clean step so that the state exists.
  scaler.scale(net.loss(0)).backward();
  scaler.step(opt);
  scaler.update();
  const auto params_before = net.snapshot();
  const auto& state = static_cast<const FusedAdamParamState&>(
      *opt.state().at(net.params()[0].unsafeGetTensorImpl()));
  const auto exp_avg = state.exp_avg().clone();
  const auto exp_avg_sq = state.exp_avg_sq().clone();
  const auto max_sq = state.max_exp_avg_sq().clone();
  CHECK(state.step().item<float>() == 1.0f);

  opt.zero_grad();
  scaler.scale(net.loss(1)).backward();
  {
    torch::NoGradGuard no_grad;
    net.params()[2].grad()[0][0] = kInf;
  }
  const auto result = scaler.step(opt);
  scaler.update();
  CHECK(result.found_inf.item<float>() == 1.0f);
  CHECK_FALSE(result.read_taken());
  CHECK(all_same_bits(net.snapshot(), params_before));
  CHECK(same_bits(state.exp_avg(), exp_avg));
  CHECK(same_bits(state.exp_avg_sq(), exp_avg_sq));
  CHECK(same_bits(state.max_exp_avg_sq(), max_sq));
  CHECK(state.step().item<float>() == 1.0f);  // incremented, then taken back on the device
  CHECK(scaler.get_scale() == 128.0);         // backed off, as after any skipped step
}

TEST_CASE(
    "FusedSGD: a skipped first step leaves a zero momentum buffer, and the next step is "
    "a first step",
    "[optim][scaler]") {
  Net skipped(3), fresh(3);
  FusedSGD opt(skipped.params(), FusedSGDOptions(0.1).momentum(0.9));
  FusedSGD ref(fresh.params(), FusedSGDOptions(0.1).momentum(0.9));
  auto scaler = cpu_scaler(1024.0);
  scaler.scale(skipped.loss(0)).backward();
  {
    torch::NoGradGuard no_grad;
    skipped.params()[0].grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  }
  scaler.step(opt);
  scaler.update();
  for (const auto& p : skipped.params()) {
    const auto& buf =
        static_cast<const amp::optim::FusedSGDParamState&>(*opt.state().at(p.unsafeGetTensorImpl()))
            .momentum_buffer();
    CHECK(torch::count_nonzero(buf).item<int64_t>() == 0);
  }
  opt.zero_grad();
  scaler.scale(skipped.loss(1)).backward();  // scale 512: exact unscaling again
  scaler.step(opt);
  scaler.update();
  fresh.loss(1).backward();
  ref.step();
  CHECK(all_same_bits(skipped.snapshot(), fresh.snapshot()));
}

TEST_CASE("unscale_ and clipping before a fused step: the optimizer gets no scale",
          "[optim][scaler]") {
  Net net(4), manual(4);
  FusedAdamW opt(net.params(), FusedAdamWOptions(0.01));
  FusedAdamW ref(manual.params(), FusedAdamWOptions(0.01));
  auto scaler = cpu_scaler(2048.0);
  for (int k = 0; k < 3; ++k) {
    opt.zero_grad();
    ref.zero_grad();
    scaler.scale(net.loss(k)).backward();
    scaler.unscale_(opt);
    torch::nn::utils::clip_grad_norm_(net.params(), 0.05);
    scaler.step(opt);
    scaler.update();
    manual.loss(k).backward();
    for (auto& p : manual.params()) p.mutable_grad() = p.grad() * 2048.0f / 2048.0f;
    torch::nn::utils::clip_grad_norm_(manual.params(), 0.05);
    ref.step();
    CHECK(all_same_bits(net.snapshot(), manual.snapshot()));  // unscaled once, not twice
  }
}

TEST_CASE("What GradScaler hands an optimizer that supports scaling, and when", "[optim][scaler]") {
  auto p = torch::ones({3}).requires_grad_(true);
  RecordingOptimizer opt({p});
  auto scaler = cpu_scaler(64.0);
  scaler.scale((p * 2).sum()).backward();
  auto result = scaler.step(opt);
  CHECK(opt.steps == 1);
  REQUIRE(opt.seen_scale.defined());
  CHECK(opt.seen_scale.item<float>() == 64.0f);
  CHECK(opt.seen_found_inf.item<float>() == 0.0f);
  CHECK(same_bits(p.grad(), torch::full({3}, 128.0f)));  // checked, not unscaled
  CHECK_FALSE(opt.grad_scale().defined());               // cleared after the step
  CHECK_FALSE(opt.found_inf().defined());
  CHECK(scaler.stage(opt) == amp::OptimizerStage::kStepped);
  scaler.update();

  // After unscale_: no scale; a preset scale is multiplied in otherwise (Python's product).
  opt.zero_grad();
  scaler.scale((p * 2).sum()).backward();
  scaler.unscale_(opt);
  scaler.step(opt);
  CHECK_FALSE(opt.seen_scale.defined());
  scaler.update();
  opt.zero_grad();
  scaler.scale((p * 2).sum()).backward();
  opt.set_grad_scale(torch::full({}, 3.0f));
  scaler.step(opt);
  CHECK(opt.seen_scale.item<float>() == static_cast<float>(scaler.get_scale() * 3.0));
  scaler.update();

  // Without gradients, as in Python's fused branch: the optimizer steps over nothing with a zero
  // flag, nothing is recorded, and update() then refuses (the non-fused path refuses in step()).
  opt.zero_grad();
  scaler.scale((p * 2).sum());
  const int steps_before = opt.steps;
  const auto empty_step = scaler.step(opt);
  CHECK(opt.steps == steps_before + 1);
  CHECK(empty_step.found_inf.item<float>() == 0.0f);
  CHECK(scaler.stage(opt) == amp::OptimizerStage::kStepped);
  CHECK(scaler.found_inf_per_device(opt).empty());
  CHECK_THROWS_WITH(scaler.update(), Contains("No inf checks were recorded prior to update."));
  CHECK_THROWS_WITH(scaler.step(opt), Contains("step() has already been called"));

  // unscale_ before the gradients existed: the step would apply gradients no check saw, still
  // scaled (Python fails inside its fused optimizer); refused, the optimizer not called.
  scaler.update(64.0);
  opt.zero_grad();
  scaler.scale((p * 2).sum());
  scaler.unscale_(opt);
  scaler.scale((p * 2).sum()).backward();
  const int steps_then = opt.steps;
  CHECK_THROWS_WITH(scaler.step(opt), Contains("unscale_() ran before its gradients existed"));
  CHECK(opt.steps == steps_then);

  // Errors as on the non-fused path.
  scaler.update(64.0);
  opt.zero_grad();
  scaler.scale((p * 2).sum()).backward();
  CHECK_THROWS_WITH(scaler.step(opt, [] { return torch::Tensor(); }),
                    Contains("Closure use is not currently supported"));
}

TEST_CASE("StepResult on the host path says taken or skipped without a device decision",
          "[optim][scaler]") {
  auto p = torch::ones({2}).requires_grad_(true);
  torch::optim::SGD plain({p}, torch::optim::SGDOptions(0.1));
  auto scaler = cpu_scaler(8.0);
  scaler.scale(p.sum()).backward();
  const auto taken = scaler.step(plain);
  CHECK(taken.outcome == StepOutcome::kTaken);
  CHECK(static_cast<bool>(taken));
  CHECK(taken.found_inf.item<float>() == 0.0f);
  scaler.update();
  plain.zero_grad();
  scaler.scale(p.sum() * kInf).backward();
  const auto skipped = scaler.step(plain);
  CHECK(skipped.outcome == StepOutcome::kSkipped);
  CHECK_FALSE(static_cast<bool>(skipped));
  GradScaler disabled(c10::DeviceType::CPU, GradScalerOptions().enabled(false));
  CHECK(disabled.step(plain).outcome == StepOutcome::kTaken);
}

TEST_CASE("MinScalePolicy::kThrow still throws after a fused step that overflowed at min_scale",
          "[optim][scaler]") {
  Net net(5);
  FusedAdamW opt(net.params(), FusedAdamWOptions(0.01));
  GradScaler scaler(
      c10::DeviceType::CPU,
      GradScalerOptions().init_scale(4.0).min_scale(4.0).at_min_scale(amp::MinScalePolicy::kThrow));
  scaler.scale(net.loss(0) * kInf).backward();
  const auto before = net.snapshot();
  CHECK_THROWS_WITH(scaler.step(opt), Contains("while the scale is already at min_scale=4"));
  CHECK(all_same_bits(net.snapshot(), before));
}

TEST_CASE("scale, step and update read nothing back to the host with a fused optimizer",
          "[optim][scaler]") {
  // FusedAdamW, FusedSGD, FusedAdamW after unscale_, FusedLion (amp's step engine)
  const int kind = GENERATE(0, 1, 2, 3);
  INFO("kind " << kind);
  Net net(6);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == 1) {
    opt = std::make_unique<FusedSGD>(net.params(), FusedSGDOptions(0.1).momentum(0.9));
  } else if (kind == 3) {
    opt = std::make_unique<amp::optim::FusedLion>(
        net.params(), amp::optim::FusedLionOptions(1e-3).weight_decay(0.1));
  } else {
    opt = std::make_unique<FusedAdamW>(net.params(), FusedAdamWOptions(0.01).amsgrad(true));
  }
  GradScaler scaler(
      c10::DeviceType::CPU,
      GradScalerOptions().init_scale(1024.0).growth_interval(2).hysteresis(2).track_counters(true));
  for (int k = 0; k < 5; ++k) {
    opt->zero_grad();
    const auto loss = net.loss(k);
    amp_test::HostReadRecorder recorder;
    auto scaled = scaler.scale(loss);
    scaled.backward();
    if (k == 2) {
      torch::NoGradGuard no_grad;
      net.params()[0].grad()[0][0] = kInf;
    }
    if (kind == 2) scaler.unscale_(*opt);
    scaler.step(*opt);
    scaler.update();
    INFO("iteration " << k << ": " << (recorder.reads().empty() ? "" : recorder.reads().front()));
    CHECK(recorder.reads().empty());
  }
  CHECK(scaler.counters().steps_skipped == 1);

  // The recorder does see the read that a non-fused optimizer's step needs.
  torch::optim::SGD plain(net.params(), torch::optim::SGDOptions(0.1));
  plain.zero_grad();
  scaler.scale(net.loss(9)).backward();
  amp_test::HostReadRecorder recorder;
  scaler.step(plain);
  CHECK(recorder.reads().size() == 1);
}
