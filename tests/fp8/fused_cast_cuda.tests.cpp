// GPU tests of the fused float8 casts: the CUDA kernels (amax by atomicMax of keys, the scale,
// the shared-memory tile cast + transpose) against the eager CUDA casts, bit for bit, over shapes
// at and around the 32 x 32 tile, primes, offsets, strides, transposed inputs, zeros, infs, NaNs
// and every dtype, format and granularity; delayed casts step by step; and Float8Linear training
// with and without fused casts on every recipe.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <amp/autocast.h>
#include <amp/fp8.h>

#include "fp8/fused_cast.h"
#include "fp8/scaling.h"

using amp::fp8::CastConfig;
using amp::fp8::Granularity;
using amp::fp8::Recipe;
using amp::fp8::detail::Layouts;

namespace {

const torch::Device kCuda(torch::kCUDA);

// The same values in the same dtype (layout aside), compared as bit patterns, except that NaN
// matches any NaN: ATen's CPU max reduction returns NaNs whose sign and payload depend on the
// dtype and the code path (0xffffffff for float32, 0x7fc00000 for bfloat16), and a NaN amax
// makes the scale and every element NaN. Where NaNs are, both must have them.
bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto bits_type = [](const torch::Tensor& t) {
    return t.element_size() == 1   ? torch::kUInt8
           : t.element_size() == 2 ? torch::kShort
                                   : torch::kInt;
  };
  const auto flat_a = a.reshape(-1).contiguous().cpu(), flat_b = b.reshape(-1).contiguous().cpu();
  const auto nan_a = torch::isnan(flat_a.to(torch::kFloat)),
             nan_b = torch::isnan(flat_b.to(torch::kFloat));
  const auto zero = torch::zeros({}, bits_type(a));
  return torch::equal(nan_a, nan_b) &&
         torch::equal(torch::where(nan_a, zero, flat_a.view(bits_type(a))),
                      torch::where(nan_b, zero, flat_b.view(bits_type(b))));
}

// A rows x cols CUDA input in `layout` with some specials (0, -0, +-inf, NaN) when asked.
torch::Tensor cuda_input(int64_t rows, int64_t cols, torch::ScalarType dtype,
                         const std::string& layout, bool specials, int64_t seed) {
  torch::manual_seed(seed);
  auto base = layout == "column-major" ? torch::randn({cols, rows}).t()
              : layout == "offset"
                  ? torch::randn({rows + 3, cols + 5}).slice(0, 2, 2 + rows).slice(1, 1, 1 + cols)
                  : torch::randn({rows, cols});
  base = base.mul(3);
  if (specials) {
    const float values[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 5 && i < rows * cols; ++i) {
      const int64_t at = (i * 7919) % (rows * cols);
      base.select(0, at / cols).select(0, at % cols).fill_(values[i]);
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
  int64_t seed = 0;
  for (const auto& [rows, cols] : shapes) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (const std::string layout : {"row-major", "column-major", "offset"}) {
        for (const bool specials : {false, true}) {
          const auto x = cuda_input(rows, cols, dtype, layout, specials, ++seed);
          for (const auto fp8 : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
            for (const std::string axis : {"tensorwise", "rows", "columns"}) {
              for (const bool power_of_2 : {false, true}) {
                CastConfig config;
                config.dtype = fp8;
                config.granularity =
                    axis == "tensorwise" ? Granularity::tensorwise : Granularity::rowwise;
                const int64_t dim = axis == "columns" ? 0 : -1;
                const auto eager =
                    amp::fp8::detail::cast_dynamic(x, config, dim, power_of_2).flatten_rows();
                const auto fused = amp::fp8::detail::fused_cast_dynamic(x, config, dim, power_of_2,
                                                                        Layouts::kBoth);
                INFO(rows << "x" << cols << " " << dtype << " " << layout
                          << (specials ? " specials " : " ") << fp8 << " " << axis
                          << (power_of_2 ? " pow2" : ""));
                REQUIRE(fused.data.is_cuda());
                REQUIRE(same_values(fused.data, eager.data));
                REQUIRE(same_values(fused.alternate, eager.data));
                REQUIRE(same_values(fused.scale, eager.scale));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("A fused delayed cast on CUDA updates the history and scale as the eager one",
          "[fp8][fused][cuda]") {
  const auto options = amp::fp8::DelayedScalingOptions().amax_history_len(4).margin(1);
  const auto on_cuda = torch::TensorOptions().device(kCuda);
  amp::fp8::detail::DelayedState eager{torch::zeros({4}, on_cuda), torch::ones({}, on_cuda)};
  amp::fp8::detail::DelayedState fused{torch::zeros({4}, on_cuda), torch::ones({}, on_cuda)};
  torch::manual_seed(5);
  for (int step = 0; step < 6; ++step) {
    auto x = (torch::randn({257, 96}, on_cuda) * std::pow(4.0, step - 3)).to(torch::kBFloat16);
    if (step == 2) x[3][4] = NAN;
    const auto a = amp::fp8::detail::cast_delayed(x, torch::kFloat8_e4m3fn, eager, options);
    const auto b = amp::fp8::detail::fused_cast_delayed(x, torch::kFloat8_e4m3fn, fused, options,
                                                        Layouts::kBoth);
    CAPTURE(step);
    CHECK(same_values(b.data, a.data));
    CHECK(same_values(b.alternate, a.data));
    CHECK(same_values(fused.amax_history, eager.amax_history));
    CHECK(same_values(fused.scale, eager.scale));
  }
}

TEST_CASE("Float8Linear trains on CUDA to the same bits with and without fused casts",
          "[fp8][fused][cuda]") {
  const auto* props = at::cuda::getCurrentDeviceProperties();
  if (props->major < 9 && !(props->major == 8 && props->minor >= 9)) {
    WARN("not run: float8 GEMMs need compute capability 8.9 or newer");
    return;
  }
  const auto name =
      GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed");
  CAPTURE(name);
  const auto train = [&](bool fused) {
    auto recipe = Recipe::from_name(name);
    recipe.fused_casts = fused;
    torch::manual_seed(6);
    torch::nn::Sequential net(
        amp::fp8::Float8Linear(amp::fp8::Float8LinearOptions(64, 128).recipe(recipe)),
        torch::nn::GELU(),
        amp::fp8::Float8Linear(amp::fp8::Float8LinearOptions(128, 32).recipe(recipe)));
    net->to(kCuda);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    std::vector<torch::Tensor> out;
    for (int step = 0; step < 3; ++step) {
      sgd.zero_grad();
      auto x = torch::randn({2, 48, 64}, kCuda).requires_grad_(true);
      torch::Tensor y;
      {
        amp::AutocastGuard guard(c10::DeviceType::CUDA, torch::kBFloat16);
        amp::fp8::Float8AutocastGuard float8;
        y = net->forward(x);
      }
      y.to(torch::kFloat).square().mean().backward();
      out.push_back(y.detach());
      out.push_back(x.grad());
      sgd.step();
    }
    for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
    for (const auto& b : net->buffers()) out.push_back(b.detach().clone());
    return out;
  };
  const auto eager = train(false);
  const auto fused = train(true);
  REQUIRE(eager.size() == fused.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    CHECK(same_values(fused[i], eager[i]));
  }
}
