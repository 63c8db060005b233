// Activation checkpointing with float8 layers: a checkpointed float8 block keeps no more after its
// forward than a checkpointed high-precision one (the float8 copies are dropped with the
// activations), and gives the uncheckpointed block's bits, for every recipe, eager and fused.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <amp/checkpoint.h>
#include <amp/fp8.h>

#include "fp8/fp8_helpers.h"
#include "support/counting_allocator.h"

using amp::fp8::Float8AutocastGuard;
using amp::fp8::Float8Linear;
using amp::fp8::Float8LinearOptions;
using amp::fp8::Recipe;

namespace {

// Float8Linear -> GELU -> Float8Linear, the block of a transformer's MLP.
struct Mlp : torch::nn::Module {
  Mlp(int64_t width, int64_t hidden, const Recipe& recipe) {
    up = register_module("up", Float8Linear(Float8LinearOptions(width, hidden).recipe(recipe)));
    down = register_module("down", Float8Linear(Float8LinearOptions(hidden, width).recipe(recipe)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down(torch::gelu(up(x))); }
  Float8Linear up{nullptr}, down{nullptr};
};

Recipe recipe_named(const std::string& name, bool fused) {
  auto recipe = Recipe::from_name(name);
  recipe.fused_casts = fused;
  return recipe;
}

// The bytes a forward leaves allocated (its output included) and what backward then computes.
struct Forward {
  int64_t held = 0;
  std::vector<torch::Tensor> results;
};

Forward run(const Recipe& recipe, bool float8, bool checkpointed, int64_t rows, int64_t width,
            int64_t hidden) {
  auto& counter = amp_test::CountingAllocator::install();
  torch::manual_seed(17);
  auto mlp = std::make_shared<Mlp>(width, hidden, recipe);
  auto x = torch::randn({rows, width}).requires_grad_(true);
  Forward f;
  torch::Tensor y;
  {
    const int64_t before = counter.live();
    Float8AutocastGuard region(float8);
    y = checkpointed ? amp::checkpoint([mlp](const torch::Tensor& t) { return mlp->forward(t); }, x)
                     : mlp->forward(x);
    f.held = counter.live() - before;
  }
  y.square().mean().backward();
  f.results = {y.detach(), x.grad()};
  for (const auto& p : mlp->parameters()) f.results.push_back(p.grad());
  for (const auto& b : mlp->buffers()) f.results.push_back(b.clone());
  return f;
}

}  // namespace

TEST_CASE("A checkpointed float8 block keeps no float8 copies after its forward",
          "[interactions][checkpoint][fp8]") {
  // 64 -> 256 -> 64 on 256 rows: the output is 64 KiB; without checkpointing the float8 layers
  // would keep 80 KiB of float8 copies (input, hidden) besides the activations. Small, because
  // where ATen's CPU float8 GEMM runs oneDNN's reference kernel (on AMX machines) a block 64
  // times larger takes minutes.
  const int64_t rows = 256, width = 64, hidden = 256;
  const auto plain_checkpointed = run(Recipe::tensorwise(), false, true, rows, width, hidden).held;
  // The output, and the CPU generator's state kept for the recomputation (a few KiB).
  CHECK(plain_checkpointed >= rows * width * 4);
  CHECK(plain_checkpointed < rows * width * 4 + 16 * 1024);
  const std::string name = GENERATE(from_range(Recipe::names()));
  const bool fused = GENERATE(false, true);
  CAPTURE(name, fused);
  if (name.rfind("rowwise", 0) == 0 && !amp_test::cpu_takes_rowwise_scales()) return;
  const auto recipe = recipe_named(name, fused);
  const auto checkpointed = run(recipe, true, true, rows, width, hidden);
  const auto kept = run(recipe, true, false, rows, width, hidden);
  // What a checkpointed float8 forward may keep beyond the output: the delayed recipe's scales
  // recorded for the recomputation (4 bytes a cast).
  CHECK(checkpointed.held <= plain_checkpointed + 64);
  CHECK(kept.held > checkpointed.held + rows * hidden);
  // And backward recomputes the same float8 tensors: the uncheckpointed block's bits.
  REQUIRE(checkpointed.results.size() == kept.results.size());
  for (size_t i = 0; i < kept.results.size(); ++i) {
    INFO("tensor " << i);
    CHECK(amp_test::same_bytes(checkpointed.results[i], kept.results[i]));
  }
}
