// Float8 layers with the rest of a training loop: weight casts kept across micro-batches when the
// step's first micro-batch is empty (an MoE expert without tokens), under amp's and LibTorch's
// optimizers; a float8 model's resume from a checkpoint; float8 layers on bf16 weights.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <amp/fp8.h>
#include <amp/low_precision.h>
#include <amp/optim.h>

#include "fp8/fp8_helpers.h"

using amp::fp8::WeightCasts;
using Catch::Contains;

namespace {

using MakeOptimizer =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// Three optimizer steps of three micro-batches each; the first micro-batch of every step has no
// rows. With `keep_and_reuse` it keeps the weight casts and the others reuse them.
std::vector<torch::Tensor> accumulate(const Recipe& recipe, const MakeOptimizer& make_optimizer,
                                      bool keep_and_reuse) {
  torch::manual_seed(41);
  Float8Linear layer(Float8LinearOptions(16, 16).recipe(recipe));
  auto optimizer = make_optimizer(layer->parameters());
  for (int step = 0; step < 3; ++step) {
    optimizer->zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      const auto mode = !keep_and_reuse ? WeightCasts::fresh
                        : micro == 0    ? WeightCasts::keep
                                        : WeightCasts::reuse;
      torch::manual_seed(600 + 10 * step + micro);
      const auto x = torch::randn({micro == 0 ? 0 : 16, 16});
      torch::Tensor loss;
      {
        Float8AutocastGuard float8(true, mode);
        loss = layer->forward(x).square().sum();
      }
      loss.backward();
    }
    optimizer->step();
  }
  std::vector<torch::Tensor> state;
  for (const auto& p : layer->parameters()) state.push_back(p.detach().clone());
  for (const auto& b : layer->buffers()) state.push_back(b.clone());
  return state;
}

}  // namespace

TEST_CASE("An empty first micro-batch under WeightCasts::keep still casts this step's weight",
          "[interactions][fp8][optim]") {
  // The later micro-batches' reuse must multiply by the weight as the optimizer left it, not by
  // the casts of the step before: the bits of casting in every micro-batch. (The delayed recipe
  // casts the weight with a scale that depends on how often it was cast, so its bits differ
  // from fresh casts by design; it must train without refusals and record the weight once a step.)
  const std::string recipe_name = GENERATE("tensorwise", "delayed");
  CAPTURE(recipe_name);
  const auto recipe = recipe_name == "delayed"
                          ? Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(8))
                          : Recipe::from_name(recipe_name);
  const std::vector<std::pair<const char*, MakeOptimizer>> optimizers = {
      {"FusedAdamW",
       [](std::vector<torch::Tensor> p) {
         return std::make_unique<amp::optim::FusedAdamW>(p, amp::optim::FusedAdamWOptions(1e-2));
       }},
      {"torch::optim::SGD",
       [](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.05); }},
      {"torch::optim::AdamW", [](std::vector<torch::Tensor> p) {
         return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2));
       }}};
  for (const auto& [name, make] : optimizers) {
    CAPTURE(name);
    std::vector<torch::Tensor> reused;
    REQUIRE_NOTHROW(reused = accumulate(recipe, make, true));
    if (recipe_name == "delayed") {
      // The parameters (weight, bias), then the buffers in registration order (history and
      // scale of the input, of the weight, of grad_output): the weight's history is the fifth.
      const auto weight_history = reused[4];
      REQUIRE(weight_history.numel() == 8);
      CHECK(weight_history.ne(0).sum().item<int64_t>() == 3);  // once in each of 3 steps
      continue;
    }
    const auto fresh = accumulate(recipe, make, false);
    REQUIRE(reused.size() == fresh.size());
    for (size_t i = 0; i < fresh.size(); ++i) {
      INFO("tensor " << i);
      CHECK(same_bytes(reused[i], fresh[i]));
    }
  }
}

TEST_CASE("A fused optimizer's step moves the weight's version, so reuse after it is refused",
          "[interactions][fp8][optim]") {
  // As Python's foreach optimizers (its fused kernels leave the counter): forgetting `keep`
  // after a step is caught, by FusedAdamW (ATen's kernel) and FusedLion (amp's engine).
  torch::manual_seed(42);
  for (const bool lion : {false, true}) {
    CAPTURE(lion);
    Float8Linear layer(Float8LinearOptions(16, 16));
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (lion) {
      opt = std::make_unique<amp::optim::FusedLion>(layer->parameters());
    } else {
      opt = std::make_unique<amp::optim::FusedAdamW>(layer->parameters());
    }
    const auto x = torch::randn({16, 16});
    {
      Float8AutocastGuard float8(true, WeightCasts::keep);
      layer->forward(x).sum().backward();
    }
    const auto version = layer->weight._version();
    opt->step();
    CHECK(layer->weight._version() > version);
    Float8AutocastGuard float8(true, WeightCasts::reuse);
    CHECK_THROWS_WITH(layer->forward(x), Contains("the weight changed since its casts were kept"));
  }
}

TEST_CASE("A float8 model resumed from a checkpoint continues with the uninterrupted run's bits",
          "[interactions][fp8][save_load][optim]") {
  // The delayed recipe's histories and scales, the parameters and FusedAdamW's state all travel
  // through torch::save; the module is converted before torch::load, as the GUIDE says.
  const auto recipe = Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(8));
  const auto make = [&] {
    torch::manual_seed(43);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                torch::nn::Linear(32, 16));
    amp::fp8::convert_to_float8_training(*model, recipe);
    return model;
  };
  const auto train = [](torch::nn::Sequential& model, amp::optim::FusedAdamW& opt, int from,
                        int to) {
    for (int step = from; step < to; ++step) {
      opt.zero_grad();
      torch::manual_seed(700 + step);
      Float8AutocastGuard float8;
      model->forward(torch::randn({16, 16}) * (1 + step)).square().mean().backward();
      opt.step();
    }
  };
  auto whole = make();
  amp::optim::FusedAdamW whole_opt(whole->parameters(), amp::optim::FusedAdamWOptions(1e-2));
  train(whole, whole_opt, 0, 6);

  auto first = make();
  amp::optim::FusedAdamW first_opt(first->parameters(), amp::optim::FusedAdamWOptions(1e-2));
  train(first, first_opt, 0, 3);
  std::stringstream model_file, optimizer_file;
  torch::save(first, model_file);
  torch::save(first_opt, optimizer_file);
  auto resumed = make();
  amp::optim::FusedAdamW resumed_opt(resumed->parameters(), amp::optim::FusedAdamWOptions(1e-2));
  torch::load(resumed, model_file);
  torch::load(resumed_opt, optimizer_file);
  train(resumed, resumed_opt, 3, 6);

  const auto p = whole->parameters(), q = resumed->parameters();
  const auto b = whole->buffers(), c = resumed->buffers();
  REQUIRE(p.size() == q.size());
  REQUIRE(b.size() == c.size());
  for (size_t i = 0; i < p.size(); ++i) CHECK(same_bytes(p[i], q[i]));
  for (size_t i = 0; i < b.size(); ++i) CHECK(same_bytes(b[i], c[i]));
}

TEST_CASE("Float8 layers on bf16 weights keep their delayed-scaling buffers float32 and train",
          "[interactions][fp8][low_precision]") {
  // amp::to_low_precision casts the weights; the float8 layers declare their histories and
  // scales float32 (their amaxes and scales lose too much in bf16).
  torch::manual_seed(44);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::GELU(),
                              torch::nn::Linear(32, 16));
  amp::fp8::convert_to_float8_training(*model, Recipe::delayed());
  amp::to_low_precision(*model, torch::kBFloat16);
  for (const auto& p : model->parameters()) CHECK(p.scalar_type() == torch::kBFloat16);
  for (const auto& b : model->named_buffers()) {
    INFO(b.key());
    CHECK(b.value().scalar_type() == torch::kFloat);
  }
  amp::optim::FusedAdamW opt(model->parameters(),
                             amp::optim::FusedAdamWOptions(1e-2).kahan_summation(true));
  const auto first = model->parameters()[0].detach().clone();
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Float8AutocastGuard float8;
    model->forward(torch::randn({16, 16}, torch::kBFloat16))
        .to(torch::kFloat)
        .square()
        .mean()
        .backward();
    opt.step();
  }
  CHECK_FALSE(same_bytes(model->parameters()[0], first));
  CHECK(torch::isfinite(model->parameters()[0].to(torch::kFloat)).all().item<bool>());
  for (const auto& b : model->buffers()) CHECK(b.scalar_type() == torch::kFloat);
}
