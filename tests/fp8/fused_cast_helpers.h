// What the CPU and CUDA fused-cast suites share: the NaN-tolerant bit comparison, the sweep of
// fused against eager dynamic casts, delayed casts step by step, and a Float8Linear training run
// with or without fused casts.
#pragma once

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <amp/autocast.h>
#include <amp/fp8.h>

#include "fp8/fused_cast.h"
#include "fp8/scaling.h"

namespace amp_test {

/// Whether `a` and `b` hold the same values in the same dtype (layout aside, read on the CPU from
/// any device), compared as bit patterns, except that NaN matches any NaN: ATen's max reduction
/// returns NaNs whose sign and payload depend on the dtype and the code path (0xffffffff for
/// float32, 0x7fc00000 for bfloat16), and a NaN amax makes the scale and every element NaN.
/// Where NaNs are, both must have them.
inline bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
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

/// Makes a rows x cols input of `dtype` in `layout` with values of the class `values`, seeded by
/// `seed`; each suite builds its inputs on its own device.
using CastInputMaker = std::function<torch::Tensor(
    int64_t rows, int64_t cols, torch::ScalarType dtype, const std::string& layout,
    const std::string& values, int64_t seed)>;

/// One fused cast and the eager cast it replaces, of the same input with the same options.
using CastPairCheck = std::function<void(const amp::fp8::detail::Float8Operand& fused,
                                         const amp::fp8::detail::Float8Operand& eager)>;

/// Casts an input of every shape, input dtype (float32, bfloat16, float16), layout and value
/// class, made by `make` with seeds 1, 2, ... in that order, to every float8 format, tensorwise
/// and rowwise along rows and columns, with and without power-of-2 scales, both eagerly and
/// fused (both layouts), and hands each pair to `check` with the case in INFO: both suites walk
/// the same cases and differ only in their inputs' device and what else they check.
inline void sweep_dynamic_casts(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                const std::vector<std::string>& layouts,
                                const std::vector<std::string>& classes, const CastInputMaker& make,
                                const CastPairCheck& check) {
  using amp::fp8::Granularity;
  int64_t seed = 0;
  for (const auto& [rows, cols] : shapes) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (const auto& layout : layouts) {
        for (const auto& values : classes) {
          const auto x = make(rows, cols, dtype, layout, values, ++seed);
          for (const auto fp8 : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
            for (const std::string axis : {"tensorwise", "rows", "columns"}) {
              for (const bool power_of_2 : {false, true}) {
                amp::fp8::CastConfig config;
                config.dtype = fp8;
                config.granularity =
                    axis == "tensorwise" ? Granularity::tensorwise : Granularity::rowwise;
                const int64_t dim = axis == "columns" ? 0 : -1;
                const auto eager =
                    amp::fp8::detail::cast_dynamic(x, config, dim, power_of_2).flatten_rows();
                const auto fused = amp::fp8::detail::fused_cast_dynamic(
                    x, config, dim, power_of_2, amp::fp8::detail::Layouts::kBoth);
                INFO(std::to_string(rows) + "x" + std::to_string(cols) + " " +
                     c10::toString(dtype) + " " + layout + " " + values + " -> " +
                     c10::toString(fp8) + " " + axis + (power_of_2 ? " pow2" : ""));
                check(fused, eager);
              }
            }
          }
        }
      }
    }
  }
}

/// Requires a fused cast's values in both layouts, and its scale, to be the eager cast's.
inline void require_same_cast(const amp::fp8::detail::Float8Operand& fused,
                              const amp::fp8::detail::Float8Operand& eager) {
  REQUIRE(same_values(fused.data, eager.data));
  REQUIRE(same_values(fused.alternate, eager.data));
  REQUIRE(same_values(fused.scale, eager.scale));
}

/// Steps a delayed cast to `fp8` eagerly and fused (both layouts), each with its own history and
/// scale on `device` (zeros and one to start), on `input(step)` for steps 0 .. steps - 1 after
/// seeding 5; at each step checks that the fused values in both layouts are the eager ones (then
/// hands the fused and the eager operand to `check`, where given) and that so are the history and
/// scale left behind.
inline void step_delayed_casts(int steps, c10::ScalarType fp8,
                               const amp::fp8::DelayedScalingOptions& options, torch::Device device,
                               const std::function<torch::Tensor(int step)>& input,
                               const CastPairCheck& check = nullptr) {
  const auto on = torch::TensorOptions().device(device);
  const int64_t len = options.amax_history_len();
  amp::fp8::detail::DelayedState eager{torch::zeros({len}, on), torch::ones({}, on)};
  amp::fp8::detail::DelayedState fused{torch::zeros({len}, on), torch::ones({}, on)};
  torch::manual_seed(5);
  for (int step = 0; step < steps; ++step) {
    const auto x = input(step);
    const auto a = amp::fp8::detail::cast_delayed(x, fp8, eager, options);
    const auto b = amp::fp8::detail::fused_cast_delayed(x, fp8, fused, options,
                                                        amp::fp8::detail::Layouts::kBoth);
    CAPTURE(step);
    CHECK(same_values(b.data, a.data));
    CHECK(same_values(b.alternate, a.data));
    if (check) check(b, a);
    CHECK(same_values(fused.amax_history, eager.amax_history));
    CHECK(same_values(fused.scale, eager.scale));
  }
}

/// What a training run leaves: each step's output and input gradient, then the final parameters
/// and buffers.
struct Float8Run {
  std::vector<torch::Tensor> outputs, tensors;
};

/// Three SGD (momentum) steps of Float8Linear(in, hidden), GELU, Float8Linear(hidden, out) on
/// `device`, seeded alike, on [2, rows, in] inputs under float8 autocast and, where `autocast`,
/// bfloat16 autocast, with the recipe `name`'s casts fused or not.
inline Float8Run train_float8_mlp(const std::string& name, bool fused, torch::Device device,
                                  int64_t in, int64_t hidden, int64_t out, int64_t rows,
                                  bool autocast) {
  using amp::fp8::Float8Linear;
  using amp::fp8::Float8LinearOptions;
  auto recipe = amp::fp8::Recipe::from_name(name);
  recipe.fused_casts = fused;
  torch::manual_seed(6);
  torch::nn::Sequential net(Float8Linear(Float8LinearOptions(in, hidden).recipe(recipe)),
                            torch::nn::GELU(),
                            Float8Linear(Float8LinearOptions(hidden, out).recipe(recipe)));
  net->to(device);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Float8Run run;
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    auto x = torch::randn({2, rows, in}, device).requires_grad_(true);  // N-d input
    torch::Tensor y;
    {
      amp::AutocastGuard guard(device.type(), torch::kBFloat16, autocast);
      amp::fp8::Float8AutocastGuard float8;
      y = net->forward(x);
    }
    y.to(torch::kFloat).square().mean().backward();
    run.outputs.push_back(y.detach());
    run.outputs.push_back(x.grad());
    sgd.step();
  }
  for (const auto& p : net->parameters()) run.tensors.push_back(p.detach().clone());
  for (const auto& b : net->buffers()) run.tensors.push_back(b.detach().clone());
  return run;
}

/// Checks that a run with fused casts left the bits of the run without them.
inline void check_same_runs(const Float8Run& fused, const Float8Run& eager) {
  REQUIRE(eager.outputs.size() == fused.outputs.size());
  for (size_t i = 0; i < eager.outputs.size(); ++i) {
    CAPTURE(i);
    CHECK(same_values(fused.outputs[i], eager.outputs[i]));
  }
  REQUIRE(eager.tensors.size() == fused.tensors.size());
  for (size_t i = 0; i < eager.tensors.size(); ++i) {
    CAPTURE(i);
    CHECK(same_values(fused.tensors[i], eager.tensors[i]));
  }
}

}  // namespace amp_test
