// GPU tests of amp's fused optimizers: a whole AMP step without a host sync, the same step
// captured in a CUDA graph and replayed against eager steps (lr changes included), and the
// device checks that only a machine with CUDA can reach.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <memory>
#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/cuda_syncs.h"
#include "support/optim_helpers.h"

using amp::GradScaler;
using amp::GradScalerOptions;
using amp_test::syncs_in;

namespace {

const torch::Device kCuda(torch::kCUDA);

struct Net {
  torch::nn::Sequential net{nullptr};
  explicit Net(uint64_t seed) {
    torch::manual_seed(seed);
    net = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 8));
    net->to(kCuda);
  }
  // fp16 autocast without the weight-cast cache: a captured graph must not keep casts made
  // outside it.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    const amp::AutocastGuard autocast(c10::DeviceType::CUDA, torch::kHalf, true, false);
    return torch::mse_loss(net->forward(x).to(torch::kFloat), y);
  }
  std::vector<torch::Tensor> params() { return net->parameters(); }
};

std::pair<torch::Tensor, torch::Tensor> batch(int k) {
  torch::manual_seed(900 + k);
  return {torch::randn({16, 32}, kCuda), torch::randn({16, 8}, kCuda)};
}

}  // namespace

TEST_CASE("A CUDA AMP step with a fused optimizer never synchronises with the host",
          "[optim][cuda]") {
  const bool sgd = GENERATE(false, true);
  const bool unscale_first = GENERATE(false, true);
  INFO((sgd ? "FusedSGD" : "FusedAdamW") << (unscale_first ? " after unscale_" : ""));
  Net model(1);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (sgd) {
    opt = std::make_unique<FusedSGD>(model.params(), FusedSGDOptions(0.01).momentum(0.9));
  } else {
    opt = std::make_unique<FusedAdamW>(model.params(), FusedAdamWOptions(1e-3).amsgrad(true));
  }
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(2));
  // Warm-up outside the counted calls: context, cuBLAS handles, lazy state.
  {
    auto [x, y] = batch(0);
    scaler.scale(model.loss(x, y)).backward();
    scaler.step(*opt);
    scaler.update();
  }
  torch::cuda::synchronize();
  for (int it = 1; it < 6; ++it) {
    INFO("iteration " << it);
    opt->zero_grad();
    auto [x, y] = batch(it);
    const auto loss = model.loss(x, y);
    torch::Tensor scaled;
    CHECK(syncs_in([&] { scaled = scaler.scale(loss); }) == 0);
    scaled.backward();
    if (it == 3) {
      const torch::NoGradGuard no_grad;
      model.params()[0].grad()[0][0] = std::numeric_limits<float>::infinity();
    }
    CHECK(syncs_in([&] {
            if (unscale_first) scaler.unscale_(*opt);
            const auto result = scaler.step(*opt);
            CHECK(result.outcome == amp::StepOutcome::kDecidedOnDevice);
            scaler.update();
          }) == 0);
  }
  // 1024, grown after iterations 0-1, backed off at 3, grown after 4-5: the flags drove it.
  CHECK(scaler.get_scale() == 2048.0);
}

TEST_CASE("A whole AMP step captured in a CUDA graph replays as eager steps do", "[optim][cuda]") {
  Net graphed(2), eager(2);
  FusedAdamW graph_opt(graphed.params(), FusedAdamWOptions(1e-3).capturable(true));
  FusedAdamW eager_opt(eager.params(), FusedAdamWOptions(1e-3).capturable(true));
  GradScaler graph_scaler(GradScalerOptions().init_scale(256.0).growth_interval(2));
  GradScaler eager_scaler(GradScalerOptions().init_scale(256.0).growth_interval(2));
  auto static_x = torch::zeros({16, 32}, kCuda);
  auto static_y = torch::zeros({16, 8}, kCuda);
  const auto whole_step = [](Net& net, torch::optim::Optimizer& opt, GradScaler& scaler,
                             const torch::Tensor& x, const torch::Tensor& y) {
    scaler.scale(net.loss(x, y)).backward();
    scaler.step(opt);
    scaler.update();
  };
  // Warm-up on the capture stream (state, lr tensor, scale and cuBLAS workspaces exist before
  // capture), mirrored on the eager twin so both start from the same state. A pool stream does
  // not order against the default one, so the inputs written there are finished before the side
  // stream reads them, and its step is finished before the next iteration overwrites them.
  const auto side = c10::cuda::getStreamFromPool();
  for (int k = 0; k < 2; ++k) {
    auto [x, y] = batch(k);
    static_x.copy_(x);
    static_y.copy_(y);
    torch::cuda::synchronize();
    {
      const c10::cuda::CUDAStreamGuard guard(side);
      whole_step(graphed, graph_opt, graph_scaler, static_x, static_y);
    }
    torch::cuda::synchronize();
    whole_step(eager, eager_opt, eager_scaler, x, y);
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    graph_opt.zero_grad(/*set_to_none=*/true);
    graph.capture_begin();
    whole_step(graphed, graph_opt, graph_scaler, static_x, static_y);
    graph.capture_end();
  }
  torch::cuda::synchronize();

  for (int replay = 0; replay < 6; ++replay) {
    INFO("replay " << replay);
    auto [x, y] = batch(10 + replay);
    if (replay == 2) y.fill_(std::numeric_limits<float>::infinity());  // an overflowing step
    if (replay == 4 || replay == 5) {
      // An lr change reaches the replays through sync_capturable_lr (no host code replays):
      // 0 for replay 4, the original 1e-3 again from replay 5 on.
      const double lr = replay == 4 ? 0.0 : 1e-3;
      graph_opt.param_groups()[0].options().set_lr(lr);
      graph_opt.sync_capturable_lr();
      eager_opt.param_groups()[0].options().set_lr(lr);
    }
    static_x.copy_(x);
    static_y.copy_(y);
    const auto before = graphed.params()[0].detach().clone();
    graph.replay();
    eager_opt.zero_grad();
    whole_step(eager, eager_opt, eager_scaler, x, y);
    torch::cuda::synchronize();
    CHECK(same_bits(graph_scaler.scale_tensor(), eager_scaler.scale_tensor()));
    CHECK(torch::equal(graph_scaler.growth_tracker_tensor(), eager_scaler.growth_tracker_tensor()));
    for (size_t i = 0; i < graphed.params().size(); ++i) {
      CHECK(torch::allclose(graphed.params()[i], eager.params()[i], 1e-6, 1e-7));
      const auto& g = static_cast<const FusedAdamParamState&>(
          *graph_opt.state().at(graphed.params()[i].unsafeGetTensorImpl()));
      const auto& e = static_cast<const FusedAdamParamState&>(
          *eager_opt.state().at(eager.params()[i].unsafeGetTensorImpl()));
      CHECK(same_bits(g.step(), e.step()));
    }
    if (replay == 2 || replay == 4) {
      // Skipped, and lr 0: the parameters did not move.
      CHECK(same_bits(graphed.params()[0].detach(), before));
    } else {
      CHECK_FALSE(same_bits(graphed.params()[0].detach(), before));
    }
  }
}

TEST_CASE("A fused step under MinScalePolicy::kThrow is refused inside a CUDA graph capture",
          "[optim][cuda]") {
  Net net(3);
  FusedAdamW opt(net.params(), FusedAdamWOptions(1e-3).capturable(true));
  GradScaler scaler(GradScalerOptions().init_scale(256.0).min_scale(1.0).at_min_scale(
      amp::MinScalePolicy::kThrow));
  auto [x, y] = batch(0);
  // Eagerly the policy works (one host read per step).
  scaler.scale(net.loss(x, y)).backward();
  CHECK(scaler.step(opt).outcome == amp::StepOutcome::kDecidedOnDevice);
  scaler.update();
  opt.zero_grad();
  const auto side = c10::cuda::getStreamFromPool();
  torch::cuda::synchronize();
  const auto before = net.params()[0].detach().clone();
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    scaler.scale(net.loss(x, y)).backward();
    side.synchronize();
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    auto captured = torch::ones({4}, kCuda).mul_(2);  // the graph is not empty either way
    // Refused before any work is captured, instead of CUDA failing the capture at the read.
    CHECK_THROWS_WITH(scaler.step(opt),
                      Contains("MinScalePolicy::kThrow reads the inf/NaN flag on the host") &&
                          Contains("Capture with MinScalePolicy::kSkip"));
    graph.capture_end();
  }
  torch::cuda::synchronize();
  CHECK(same_bits(net.params()[0].detach(), before));
  // Outside the capture the same scaler steps again.
  CHECK(scaler.step(opt).outcome == amp::StepOutcome::kDecidedOnDevice);
  scaler.update();
  torch::cuda::synchronize();
  CHECK_FALSE(same_bits(net.params()[0].detach(), before));
}

TEST_CASE("CUDA-only checks of the fused optimizers: devices within a group, capturable state",
          "[optim][cuda]") {
  std::vector<torch::Tensor> mixed{torch::ones({3}, kCuda).requires_grad_(true),
                                   torch::ones({3}).requires_grad_(true)};
  FusedAdamW opt(mixed, FusedAdamWOptions());
  for (auto& p : mixed) p.mutable_grad() = torch::ones_like(p);
  CHECK_THROWS_WITH(opt.step(), Contains("parameter 1 of group 0 is on cpu but parameter 0 of "
                                         "group 0 is on cuda:0"));
  CHECK(opt.state().empty());

  // Capturable: the step count and the lr live on the parameters' GPU.
  auto p = torch::ones({4}, kCuda).requires_grad_(true);
  FusedAdamW capturable({p}, FusedAdamWOptions(0.1).capturable(true));
  p.mutable_grad() = torch::ones_like(p);
  capturable.step();
  const auto& state =
      static_cast<const FusedAdamParamState&>(*capturable.state().at(p.unsafeGetTensorImpl()));
  CHECK(state.step().device() == p.device());
  CHECK(state.step().item<float>() == 1.0f);
  // A capturable step equals a non-capturable one (lr in float32 vs double: 0.1 rounds once).
  auto q = torch::ones({4}, kCuda).requires_grad_(true);
  FusedAdamW plain({q}, FusedAdamWOptions(0.1));
  q.mutable_grad() = torch::ones_like(q);
  plain.step();
  CHECK(torch::allclose(p, q, 1e-6, 1e-7));
}
