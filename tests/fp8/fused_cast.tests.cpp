// amp's fused float8 casts (Recipe::fused_casts) against the eager casts they replace, bit for bit
// on the CPU, which runs the CUDA kernels' element arithmetic and tile walk (cast_element.h): the
// conversion and the scale one value at a time over whole dtypes, then whole casts over shapes
// at tile boundaries, primes, offsets, strides, transposed and N-d inputs, zeros, infs and NaNs,
// every dtype, format and granularity; delayed casts step by step; and Float8Linear training
// with and without fused casts for every recipe.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <amp/fp8.h>

#include "fp8/cast_element.h"
#include "fp8/fused_cast.h"
#include "fp8/scaling.h"
#include "fp8_helpers.h"
#include "fused_cast_helpers.h"

using amp::fp8::CastConfig;
using amp::fp8::Granularity;
using amp::fp8::detail::Float8Operand;
using amp::fp8::detail::Layouts;
using amp_test::same_values;
namespace ce = amp::fp8::cast_element;

namespace {

bool row_major(const torch::Tensor& t) { return t.stride(1) == 1 && t.stride(0) == t.size(1); }
bool column_major(const torch::Tensor& t) { return t.stride(0) == 1 && t.stride(1) == t.size(0); }

const std::vector<torch::ScalarType> kFormats = {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2};

ce::Format format_of(torch::ScalarType t) {
  return t == torch::kFloat8_e4m3fn ? ce::Format::kE4M3 : ce::Format::kE5M2;
}

// A rows x cols input in one of the layouts the casts meet, with values of one class.
torch::Tensor make_input(int64_t rows, int64_t cols, torch::ScalarType dtype,
                         const std::string& layout, const std::string& values, int64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x;
  if (layout == "row-major") {
    x = torch::randn({rows, cols});
  } else if (layout == "column-major") {
    x = torch::randn({cols, rows}).t();
  } else if (layout == "offset") {
    x = torch::randn({rows + 3, cols + 5}).slice(0, 2, 2 + rows).slice(1, 1, 1 + cols);
  } else {  // "strided": every other column of a wider tensor
    x = torch::randn({rows, 2 * cols}).slice(1, 0, 2 * cols, 2);
  }
  torch::NoGradGuard no_grad;
  if (values == "normal") {
    x.mul_(3);
  } else if (values == "tiny") {
    x.mul_(1e-6);  // scaled into float8's subnormals and below
  } else if (values == "all-zero") {
    x.zero_();
  } else {  // "specials": a zero, a negative zero, infinities and NaN among normal values
    const std::vector<float> specials = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < specials.size() && static_cast<int64_t>(i) < x.numel(); ++i) {
      const int64_t at = (static_cast<int64_t>(i) * 7919) % x.numel();
      x.select(0, at / cols).select(0, at % cols).fill_(specials[i]);
    }
  }
  // The dtype conversion keeps the layout of the view's values, not its strides: redo the
  // layout in the target dtype.
  if (dtype == torch::kFloat) return x;
  if (layout == "row-major") return x.to(dtype);
  if (layout == "column-major") return x.t().to(dtype).t();
  if (layout == "offset") {
    auto wide = torch::zeros({rows + 3, cols + 5}, dtype);
    wide.slice(0, 2, 2 + rows).slice(1, 1, 1 + cols).copy_(x);
    return wide.slice(0, 2, 2 + rows).slice(1, 1, 1 + cols);
  }
  auto wide = torch::zeros({rows, 2 * cols}, dtype);
  wide.slice(1, 0, 2 * cols, 2).copy_(x);
  return wide.slice(1, 0, 2 * cols, 2);
}

}  // namespace

TEST_CASE("The fused conversion gives the eager cast's float8 bits for every bf16 and fp16 value",
          "[fp8][fused]") {
  // Every bfloat16 and float16 bit pattern (as float32), and a million random float32 patterns.
  auto all16 = torch::arange(0, 1 << 16, torch::kInt).to(torch::kShort);
  std::vector<torch::Tensor> values = {all16.view(torch::kBFloat16).to(torch::kFloat),
                                       all16.view(torch::kHalf).to(torch::kFloat)};
  torch::manual_seed(1);
  values.push_back(torch::randint(std::numeric_limits<int32_t>::min(),
                                  std::numeric_limits<int32_t>::max(), {1 << 20}, torch::kLong)
                       .to(torch::kInt)
                       .view(torch::kFloat));
  const float scales[] = {1.0f, 0.5f, 3.0f, 448.0f / 7.0f, 1e-3f};
  for (const auto& x : values) {
    for (const auto fp8 : kFormats) {
      for (const float s : scales) {
        const auto scale = torch::full({}, s);
        const auto eager = amp::fp8::detail::quantize(x, scale, fp8);
        auto fused = torch::empty_like(eager);
        const float* in = x.data_ptr<float>();
        auto* out = static_cast<uint8_t*>(fused.data_ptr());
        for (int64_t i = 0; i < x.numel(); ++i) out[i] = ce::quantize(in[i], s, format_of(fp8));
        INFO(c10::toString(fp8) << " scale " << s);
        CHECK(same_values(fused, eager));
      }
    }
  }
}

TEST_CASE("The fused scale gives torchao's scale for every amax, as a tensor or one at a time",
          "[fp8][fused]") {
  // Every positive bfloat16 (amaxes of bf16 tensors), random float32 amaxes, 0, inf and NaN; in
  // a long tensor (vectorised ATen loops) and one value at a time (a tensorwise scale).
  auto all16 = torch::arange(0, 1 << 15, torch::kInt).to(torch::kShort);
  torch::manual_seed(2);
  auto amax = torch::cat({all16.view(torch::kBFloat16).to(torch::kFloat),
                          torch::rand({1 << 16}).mul(1000), torch::rand({1 << 12}).mul(1e-10),
                          torch::tensor({0.0f, INFINITY, NAN, 1e-12f, 448.0f, 57344.0f})});
  for (const auto fp8 : kFormats) {
    for (const bool power_of_2 : {false, true}) {
      INFO(c10::toString(fp8) << (power_of_2 ? " pow2" : ""));
      const auto eager = amp::fp8::detail::amax_to_scale(amax, fp8, power_of_2);
      auto fused = torch::empty_like(eager);
      for (int64_t i = 0; i < amax.numel(); ++i) {
        fused[i] = ce::scale_from_amax(amax[i].item<float>(), format_of(fp8), power_of_2);
      }
      CHECK(same_values(fused, eager));
      for (int64_t i = 0; i < amax.numel(); i += 997) {
        const auto one = amp::fp8::detail::amax_to_scale(amax[i].reshape({}), fp8, power_of_2);
        CHECK(same_values(fused[i], one));
      }
    }
  }
}

TEST_CASE("A fused dynamic cast gives the eager cast's bits for every shape, layout and value",
          "[fp8][fused]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},   {1, 37},  {37, 1},  {31, 33},
                                                           {32, 32}, {33, 31}, {64, 96}, {97, 131}};
  const std::vector<std::string> layouts = {"row-major", "column-major", "offset", "strided"};
  const std::vector<std::string> classes = {"normal", "specials", "all-zero", "tiny"};
  int64_t checked = 0;
  amp_test::sweep_dynamic_casts(shapes, layouts, classes, make_input,
                                [&](const Float8Operand& fused, const Float8Operand& eager) {
                                  amp_test::require_same_cast(fused, eager);
                                  REQUIRE(fused.axiswise_dim == eager.axiswise_dim);
                                  REQUIRE(fused.orig_dtype == eager.orig_dtype);
                                  ++checked;
                                });
  CHECK(checked == 8 * 3 * 4 * 4 * 2 * 3 * 2);
}

TEST_CASE("A fused cast writes the layouts it is asked for", "[fp8][fused]") {
  CastConfig config;
  const auto x = torch::randn({48, 80});
  const auto same = amp::fp8::detail::fused_cast_dynamic(x, config, -1, false, Layouts::kSame);
  CHECK(row_major(same.data));
  CHECK_FALSE(same.alternate.defined());
  const auto other = amp::fp8::detail::fused_cast_dynamic(x, config, -1, false, Layouts::kOther);
  CHECK(column_major(other.data));
  CHECK(same_values(other.data, same.data));
  const auto both = amp::fp8::detail::fused_cast_dynamic(x.t(), config, -1, false, Layouts::kBoth);
  CHECK(column_major(both.data));  // the layout of x.t(), as the eager cast keeps it
  CHECK(row_major(both.alternate));
  // The transpose carries the second layout along, and keeping it drops the first.
  const auto t = both.t();
  CHECK(row_major(t.data));
  CHECK(column_major(t.alternate));
  const auto kept = both.in_alternate_layout();
  CHECK(row_major(kept.data));
  CHECK_FALSE(kept.alternate.defined());
  CHECK(same_values(kept.data, both.data));
}

TEST_CASE("A fused cast of an N-d or permuted input gives the eager cast's rows", "[fp8][fused]") {
  torch::manual_seed(4);
  const auto contiguous = torch::randn({3, 5, 48}).mul(2);
  const auto permuted = torch::randn({5, 3, 48}).transpose(0, 1);
  for (const auto& x : {contiguous, permuted}) {
    for (const bool rowwise : {false, true}) {
      CastConfig config;
      config.granularity = rowwise ? Granularity::rowwise : Granularity::tensorwise;
      const auto eager = amp::fp8::detail::cast_dynamic(x, config, -1, rowwise).flatten_rows();
      const auto fused =
          amp::fp8::detail::fused_cast_dynamic(x, config, -1, rowwise, Layouts::kSame);
      CHECK(fused.data.sizes() == std::vector<int64_t>{15, 48});
      CHECK(same_values(fused.data, eager.data));
      CHECK(same_values(fused.scale, eager.scale));
    }
  }
}

TEST_CASE("A fused delayed cast updates the history and scale as the eager one, step by step",
          "[fp8][fused]") {
  const auto algo =
      GENERATE(amp::fp8::AmaxComputeAlgo::max, amp::fp8::AmaxComputeAlgo::most_recent);
  const auto fp8 = GENERATE(torch::kFloat8_e4m3fn, torch::kFloat8_e5m2);
  const auto dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  CAPTURE(static_cast<int>(algo), fp8, dtype);
  const auto options =
      amp::fp8::DelayedScalingOptions().amax_history_len(4).amax_compute_algo(algo).margin(1);
  amp_test::step_delayed_casts(
      7, fp8, options, torch::kCPU,
      [&](int step) {
        auto x = (torch::randn({33, 40}) * std::pow(4.0, step - 3)).to(dtype);
        if (step == 2) x[3][4] = NAN;  // ignored by the amax
        if (step == 4) x[0][0] = INFINITY;
        if (step == 5) x.zero_();
        return x;
      },
      [](const Float8Operand& b, const Float8Operand& a) { CHECK(same_values(b.scale, a.scale)); });
}

TEST_CASE("Float8Linear trains to the same bits with and without fused casts, every recipe",
          "[fp8][fused]") {
  const auto name = GENERATE(from_range(amp_test::kRecipeNames));
  const bool autocast = GENERATE(false, true);
  CAPTURE(name, autocast);
  if (name.rfind("rowwise", 0) == 0 && !amp_test::cpu_takes_rowwise_scales()) {
    WARN("not run: this LibTorch's CPU at::_scaled_mm takes tensorwise scales only");
    return;
  }
  const auto eager = amp_test::train_float8_mlp(name, false, torch::kCPU, 48, 64, 32, 24, autocast);
  const auto fused = amp_test::train_float8_mlp(name, true, torch::kCPU, 48, 64, 32, 24, autocast);
  amp_test::check_same_runs(fused, eager);
}
