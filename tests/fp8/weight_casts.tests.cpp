// WeightCasts (amp/fp8.h) on the CPU: gradient accumulation whose later micro-batches reuse the
// weight casts of the first gives the bits of casting every time, for every recipe, eager and
// fused; reuse really takes the kept casts; the refusals; the delayed recipe's weight history
// once per step; checkpoint recomputation under keep and reuse.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <amp/checkpoint.h>
#include <amp/fp8.h>

#include "fp8_helpers.h"

using amp::fp8::WeightCasts;
using Catch::Matchers::Contains;

namespace {

Recipe named(const std::string& name, bool fused) {
  auto recipe = Recipe::from_name(name);
  recipe.fused_casts = fused;
  return recipe;
}

torch::nn::Sequential two_layers(const Recipe& recipe) {
  torch::manual_seed(21);
  return torch::nn::Sequential(Float8Linear(Float8LinearOptions(16, 32).recipe(recipe)),
                               torch::nn::ReLU(),
                               Float8Linear(Float8LinearOptions(32, 16).recipe(recipe)));
}

torch::Tensor micro_batch(int step, int micro) {
  torch::manual_seed(500 + 10 * step + micro);
  return torch::randn({16, 16}) * (1.0 + micro);
}

// Two SGD steps of three micro-batches; with `keep_and_reuse` the first micro-batch of a step
// keeps the weight casts and the others reuse them. Returns the parameters and buffers.
std::vector<torch::Tensor> accumulate(torch::nn::Sequential& model, bool keep_and_reuse,
                                      bool checkpointed = false) {
  torch::optim::SGD opt(model->parameters(), 0.05);
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      const auto mode = !keep_and_reuse ? WeightCasts::fresh
                        : micro == 0    ? WeightCasts::keep
                                        : WeightCasts::reuse;
      torch::Tensor loss;
      {
        Float8AutocastGuard float8(true, mode);
        const auto x = micro_batch(step, micro).requires_grad_(checkpointed);
        auto y = checkpointed
                     ? amp::checkpoint([&](const torch::Tensor& t) { return model->forward(t); }, x)
                     : model->forward(x);
        loss = y.square().mean();
      }
      loss.backward();
    }
    opt.step();
  }
  std::vector<torch::Tensor> state;
  for (const auto& p : model->parameters()) state.push_back(p.detach().clone());
  for (const auto& b : model->buffers()) state.push_back(b.clone());
  return state;
}

void check_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(same_bytes(a[i], b[i]));
  }
}

}  // namespace

TEST_CASE("Weight casts kept and reused across micro-batches give the bits of fresh casts",
          "[fp8]") {
  const auto name = GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp");
  const bool fused = GENERATE(false, true);
  CAPTURE(name, fused);
  if (name != "tensorwise" && !amp_test::cpu_takes_rowwise_scales()) {
    WARN("this LibTorch's CPU float8 GEMM takes no rowwise scales: " << name << " skipped");
    return;
  }
  auto fresh = two_layers(named(name, fused));
  auto reused = two_layers(named(name, fused));
  const auto expected = accumulate(fresh, false);
  const auto got = accumulate(reused, true);
  check_same(expected, got);
  // The steps did train.
  CHECK_FALSE(same_bytes(got[0], two_layers(named(name, fused))->parameters()[0]));
}

TEST_CASE("WeightCasts::reuse takes the kept casts, not the weight", "[fp8]") {
  const bool fused = GENERATE(false, true);
  CAPTURE(fused);
  torch::manual_seed(4);
  Float8Linear layer(Float8LinearOptions(16, 16).recipe(named("tensorwise", fused)));
  const auto x = torch::randn({16, 16});
  torch::Tensor kept_output;
  {
    Float8AutocastGuard float8(true, WeightCasts::keep);
    kept_output = layer(x).detach();
  }
  // A change autograd does not see (.data() has its own version counter): reuse ignores it, as
  // promised, and a fresh cast sees it.
  layer->weight.data().mul_(2);
  {
    Float8AutocastGuard float8(true, WeightCasts::reuse);
    CHECK(same_bytes(layer(x).detach(), kept_output));
  }
  {
    Float8AutocastGuard float8(true, WeightCasts::fresh);
    CHECK_FALSE(same_bytes(layer(x).detach(), kept_output));
  }
}

TEST_CASE("WeightCasts::reuse refuses a layer with nothing kept or a changed weight", "[fp8]") {
  torch::manual_seed(4);
  Float8Linear layer(Float8LinearOptions(16, 16).recipe(Recipe::tensorwise()));
  layer->set_qualified_name("encoder.proj");
  const auto x = torch::randn({16, 16});
  const auto reuse = [&](Float8Linear& l) {
    Float8AutocastGuard float8(true, WeightCasts::reuse);
    return l(x);
  };
  CHECK_THROWS_WITH(reuse(layer), Contains("'encoder.proj'") &&
                                      Contains("WeightCasts::reuse found no kept weight casts") &&
                                      Contains("with WeightCasts::keep"));
  {
    Float8AutocastGuard float8(true, WeightCasts::keep);
    layer(x);
  }
  CHECK_NOTHROW(reuse(layer));
  // A clone keeps nothing of its original.
  auto copy = std::dynamic_pointer_cast<amp::fp8::Float8LinearImpl>(layer->clone());
  Float8Linear clone(copy);
  CHECK_THROWS_WITH(reuse(clone), Contains("found no kept weight casts"));
  // An in-place change that moves the version counter is seen.
  {
    torch::NoGradGuard no_grad;
    layer->weight.add_(1.0);
  }
  CHECK_THROWS_WITH(reuse(layer), Contains("the weight changed since its casts were kept"));
  // So is another tensor.
  {
    Float8AutocastGuard float8(true, WeightCasts::keep);
    layer(x);
  }
  layer->weight.set_data(layer->weight.detach().clone());
  CHECK_THROWS_WITH(reuse(layer), Contains("the weight changed since its casts were kept"));
  // A fresh forward lets the kept casts go.
  {
    Float8AutocastGuard float8(true, WeightCasts::keep);
    layer(x);
  }
  {
    Float8AutocastGuard float8;
    layer(x);
  }
  CHECK_THROWS_WITH(reuse(layer), Contains("found no kept weight casts"));
}

TEST_CASE("With kept weight casts the delayed recipe records a weight's amax once per step",
          "[fp8]") {
  const bool fused = GENERATE(false, true);
  CAPTURE(fused);
  auto recipe = Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(8));
  recipe.fused_casts = fused;
  const auto recorded = [](torch::nn::Sequential& model, const std::string& key) {
    return model->named_buffers()[key].ne(0).sum().item<int64_t>();
  };
  auto fresh = two_layers(recipe);
  accumulate(fresh, false);
  auto reused = two_layers(recipe);
  accumulate(reused, true);
  // Two steps of three micro-batches: six casts of the input and grad_output either way, and of
  // the weight two with keep and reuse.
  for (const char* layer : {"0.", "2."}) {
    CHECK(recorded(fresh, std::string(layer) + "amax_history_weight") == 6);
    CHECK(recorded(reused, std::string(layer) + "amax_history_weight") == 2);
    CHECK(recorded(reused, std::string(layer) + "amax_history_input") == 6);
    CHECK(recorded(reused, std::string(layer) + "amax_history_grad_output") == 6);
  }
}

TEST_CASE("A checkpoint recomputes under the forward's WeightCasts", "[fp8][checkpoint]") {
  // The recomputation must take the kept casts where the forward did (a delayed layer would
  // otherwise cast its weight once more than the forward and refuse), with the same bits.
  const auto name = GENERATE(as<std::string>{}, "tensorwise", "delayed");
  CAPTURE(name);
  auto plain = two_layers(named(name, false));
  auto checkpointed = two_layers(named(name, false));
  check_same(accumulate(plain, true), accumulate(checkpointed, true, /*checkpointed=*/true));
}
