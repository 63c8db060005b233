// GPU tests of the fused float8 casts: the CUDA kernels (amax by atomicMax of keys, the scale,
// the shared-memory tile cast + transpose) against the eager CUDA casts, bit for bit, over shapes
// at and around the 32 x 32 tile, primes, offsets, strides, transposed inputs, zeros, infs, NaNs
// and every dtype, format and granularity; delayed casts step by step; and Float8Linear training
// with and without fused casts on every recipe.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <amp/fp8.h>

#include "fp8/fused_cast.h"
#include "fp8/scaling.h"
#include "fp8_cuda_helpers.h"
#include "fp8_helpers.h"
#include "fused_cast_helpers.h"

using amp::fp8::detail::Float8Operand;

namespace {

const torch::Device kCuda(torch::kCUDA);

// A rows x cols CUDA input in `layout` with some specials (0, -0, +-inf, NaN) when `values` is
// "specials".
torch::Tensor cuda_input(int64_t rows, int64_t cols, torch::ScalarType dtype,
                         const std::string& layout, const std::string& values, int64_t seed) {
  torch::manual_seed(seed);
  auto base = layout == "column-major" ? torch::randn({cols, rows}).t()
              : layout == "offset"
                  ? torch::randn({rows + 3, cols + 5}).slice(0, 2, 2 + rows).slice(1, 1, 1 + cols)
                  : torch::randn({rows, cols});
  base = base.mul(3);
  if (values == "specials") {
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 5 && i < rows * cols; ++i) {
      const int64_t at = (i * 7919) % (rows * cols);
      base.select(0, at / cols).select(0, at % cols).fill_(specials[i]);
    }
  }
  if (layout == "column-major") return base.t().to(kCuda, dtype).t();
  if (layout == "offset") {
    auto wide = torch::zeros({rows + 3, cols + 5}, torch::TensorOptions(dtype).device(kCuda));
    wide.slice(0, 2, 2 + rows).slice(1, 1, 1 + cols).copy_(base);
    return wide.slice(0, 2, 2 + rows).slice(1, 1, 1 + cols);
  }
  return base.to(kCuda, dtype);
}

}  // namespace

TEST_CASE("Fused CUDA casts give the eager CUDA casts' bits for every shape, layout and value",
          "[fp8][fused][cuda]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 37}, {37, 1}, {31, 33}, {32, 32}, {33, 31}, {64, 96}, {97, 131}, {1000, 1031}};
  amp_test::sweep_dynamic_casts(shapes, {"row-major", "column-major", "offset"},
                                {"normal", "specials"}, cuda_input,
                                [](const Float8Operand& fused, const Float8Operand& eager) {
                                  REQUIRE(fused.data.is_cuda());
                                  amp_test::require_same_cast(fused, eager);
                                });
}

TEST_CASE("A fused delayed cast on CUDA updates the history and scale as the eager one",
          "[fp8][fused][cuda]") {
  const auto options = amp::fp8::DelayedScalingOptions().amax_history_len(4).margin(1);
  amp_test::step_delayed_casts(6, torch::kFloat8_e4m3fn, options, kCuda, [](int step) {
    auto x = (torch::randn({257, 96}, kCuda) * std::pow(4.0, step - 3)).to(torch::kBFloat16);
    if (step == 2) x[3][4] = NAN;
    return x;
  });
}

TEST_CASE("Float8Linear trains on CUDA to the same bits with and without fused casts",
          "[fp8][fused][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const auto name = GENERATE(from_range(amp_test::kRecipeNames));
  CAPTURE(name);
  const auto eager = amp_test::train_float8_mlp(name, false, kCuda, 64, 128, 32, 48, true);
  const auto fused = amp_test::train_float8_mlp(name, true, kCuda, 64, 128, 32, 48, true);
  amp_test::check_same_runs(fused, eager);
}
