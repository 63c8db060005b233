// Tests of amp's fused ops on the CPU: bitwise against ATen's AMP ops, fp64 references for the
// norms, the extended update against a tensor-op reference, validation messages, and the launch
// planner.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <amp/ops.h>

#include "support/bits.h"
#include "support/reference_scale_update.h"

namespace {

using amp_test::raw_bits;
using amp_test::same_bits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

torch::Tensor scaled_randn(int64_t n, torch::ScalarType dtype, double scale = 4096.0) {
  return (torch::randn({n}, torch::kDouble) * scale).to(dtype);
}

torch::Tensor zero_flag(torch::Device device = torch::kCPU) {
  return torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

torch::Tensor scalar(float v, torch::Device device = torch::kCPU) {
  return torch::full({1}, v, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

/// Runs amp's op on a clone of `grads` (one call) and ATen's op per tensor (its one-dtype
/// calls), and checks results and found_inf agree.
void check_against_aten(const std::vector<torch::Tensor>& grads, float inv,
                        float found_on_entry = 0.0f) {
  std::vector<torch::Tensor> mine, ref;
  for (const auto& g : grads) {
    mine.push_back(g.clone());
    ref.push_back(g.clone());
  }
  // clone() keeps strides of dense tensors only; rebuild the views the caller made.
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].is_non_overlapping_and_dense()) {
      mine[i] = torch::empty_like(grads[i].unsqueeze(-1).expand({-1, -1, 2})).select(-1, 0);
      mine[i].copy_(grads[i]);
    }
  }
  auto found_mine = scalar(found_on_entry), found_ref = scalar(found_on_entry);
  amp::non_finite_check_and_unscale_(mine, found_mine, scalar(inv));
  for (auto& g : ref) at::_amp_foreach_non_finite_check_and_unscale_({g}, found_ref, scalar(inv));
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("tensor " << i << " dtype " << grads[i].scalar_type() << " numel " << grads[i].numel());
    CHECK(same_bits(mine[i], ref[i]));
  }
  CHECK(found_mine.item<float>() == found_ref.item<float>());
}

// The CPU kernel's vector widths, grain and serial threshold (8M elements) put boundaries at
// these sizes.
const std::vector<int64_t> kSizes = {0,
                                     1,
                                     7,
                                     15,
                                     16,
                                     17,
                                     33,
                                     32767,
                                     32768,
                                     32769,
                                     65535,
                                     65536,
                                     65537,
                                     (1 << 20) + 3,
                                     (1 << 23) + 3};

}  // namespace

TEST_CASE("Unscaling matches ATen bit for bit for every dtype and size", "[ops]") {
  torch::manual_seed(1);
  const auto dtype = GENERATE(torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble);
  const float inv = GENERATE(1.0f / 65536.0f, 0.3f, 1.0f);
  for (int64_t n : kSizes) {
    INFO("numel " << n);
    check_against_aten({scaled_randn(n, dtype)}, inv);
  }
}

TEST_CASE("One call unscales a mixed-dtype list with views like ATen's per-dtype calls", "[ops]") {
  torch::manual_seed(2);
  std::vector<torch::Tensor> grads = {
      scaled_randn(1001, torch::kFloat),
      scaled_randn(4099, torch::kHalf).narrow(0, 1, 4097),  // unaligned view
      scaled_randn(70001, torch::kBFloat16),
      scaled_randn(333, torch::kDouble),
      scaled_randn(0, torch::kFloat),
      torch::randn({300, 200}).t(),                           // transposed, dense
      torch::randn({64, 50}, torch::kHalf).narrow(1, 3, 40),  // not dense
      torch::randn({90, 90}, torch::kDouble).t().narrow(0, 1, 80),
  };
  check_against_aten(grads, 1.0f / 1024.0f);
  check_against_aten(grads, 1.0f);
}

TEST_CASE("Non-finite values anywhere set found_inf and the rest is still unscaled", "[ops]") {
  torch::manual_seed(3);
  const float bad = std::vector<float>{kNaN, kInf, -kInf}.at(GENERATE(0, 1, 2));
  const auto dtype = GENERATE(torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble);
  const int64_t n = 65537;
  for (int64_t pos :
       {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{32767}, int64_t{32768}, n / 2, n - 2, n - 1}) {
    INFO("position " << pos << " value " << bad);
    auto g = scaled_randn(n, dtype);
    g[pos] = bad;
    check_against_aten({scaled_randn(100, torch::kFloat), g}, 0.125f);
    auto found = zero_flag();
    amp::non_finite_check_and_unscale_({g}, found, scalar(0.125f));
    CHECK(found.item<float>() == 1.0f);
  }
}

TEST_CASE("found_inf is a plain store: already 1 on entry it stays 1, never reset", "[ops]") {
  auto g = scaled_randn(1000, torch::kFloat);
  check_against_aten({g}, 0.5f, 1.0f);
  auto found = scalar(1.0f);
  amp::non_finite_check_and_unscale_({g}, found, scalar(0.5f));
  CHECK(found.item<float>() == 1.0f);
}

TEST_CASE("inv_scale 1.0 leaves every bit untouched, NaN payloads included", "[ops]") {
  auto g = scaled_randn(5000, torch::kHalf);
  g.view(torch::kShort)[17] = static_cast<int16_t>(0x7d01);  // a signalling NaN
  const auto before = g.clone();
  auto found = zero_flag();
  amp::non_finite_check_and_unscale_({g}, found, scalar(1.0f));
  CHECK(torch::equal(raw_bits(g), raw_bits(before)));
  CHECK(found.item<float>() == 1.0f);
}

TEST_CASE("Overflow attribution names the tensors that held non-finite values", "[ops]") {
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(scaled_randn(40000 + i, torch::kFloat));
  grads[1][39999] = kNaN;
  grads[4][0] = -kInf;
  auto flags = torch::zeros({6});
  auto found = zero_flag();
  amp::non_finite_check_and_unscale_(grads, found, scalar(0.5f), flags);
  CHECK(found.item<float>() == 1.0f);
  CHECK(torch::equal(flags, torch::tensor({0.f, 1.f, 0.f, 0.f, 1.f, 0.f})));
}

TEST_CASE("A list above the serial threshold is split across threads with the same results",
          "[ops]") {
  // Lists under 8M elements in all run on one thread; this one (8M + 240,022) is split into
  // ranges across threads (when there are several), which must not change any result.
  torch::manual_seed(9);
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(scaled_randn(40000 + i, torch::kFloat));
  grads.push_back(scaled_randn((int64_t{1} << 23) + 7, torch::kFloat));
  check_against_aten(grads, 0.25f);

  std::vector<torch::Tensor> ref_per;
  for (auto& g : grads) ref_per.push_back((g.to(torch::kDouble) * 0.5).norm());
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(grads, found, scalar(0.5f), true);
  CHECK(total.item<double>() == Approx(torch::stack(ref_per).norm().item<double>()).epsilon(1e-6));
  CHECK(torch::allclose(per.to(torch::kDouble), torch::stack(ref_per), 1e-6));

  grads[1][39999] = kNaN;
  grads[6][int64_t{1} << 22] = kInf;  // the middle: where two threads' ranges meet
  auto flags = torch::zeros({7});
  found = zero_flag();
  amp::non_finite_check_and_unscale_(grads, found, scalar(0.5f), flags);
  CHECK(found.item<float>() == 1.0f);
  CHECK(torch::equal(flags, torch::tensor({0.f, 1.f, 0.f, 0.f, 0.f, 0.f, 1.f})));
}

TEST_CASE("Empty lists and empty tensors are accepted", "[ops]") {
  auto found = zero_flag();
  amp::non_finite_check_and_unscale_({}, found, scalar(0.5f));
  amp::non_finite_check_and_unscale_({torch::empty({0, 3})}, found, scalar(0.5f));
  auto [total, per] = amp::unscale_norm({torch::empty({0})}, found, scalar(0.5f), true);
  CHECK(total.item<float>() == 0.0f);
  CHECK(per.numel() == 1);
  CHECK(found.item<float>() == 0.0f);
}

TEST_CASE("Invalid arguments are refused with a sentence naming them", "[ops]") {
  auto found = zero_flag();
  const auto g = torch::ones({4});
  CHECK_THROWS_WITH(
      amp::non_finite_check_and_unscale_({g}, found, torch::ones({1}, torch::kDouble)),
      Catch::Contains("inv_scale must be a Float tensor, but got dtype Double"));
  auto two = torch::zeros({2});
  CHECK_THROWS_WITH(amp::non_finite_check_and_unscale_({g}, two, scalar(1.0f)),
                    Catch::Contains("found_inf must be a 1-element tensor, but got 2 elements"));
  CHECK_THROWS_WITH(
      amp::non_finite_check_and_unscale_({g, torch::ones({2}, torch::kInt)}, found, scalar(1.0f)),
      Catch::Contains("grads[1] has dtype Int"));
  CHECK_THROWS_WITH(
      amp::non_finite_check_and_unscale_({g.to_sparse()}, found, scalar(1.0f)),
      Catch::Contains("grads[0] has layout Sparse but must be strided (dense); unscale a sparse "
                      "tensor's values() instead."));
  CHECK_THROWS_WITH(
      amp::non_finite_check_and_unscale_({g}, found, scalar(1.0f), torch::zeros({3})),
      Catch::Contains("per_tensor_found_inf must have one element per grad (1), but has 3"));
  auto s = scalar(1.0f);
  auto t = torch::zeros({1}, torch::kLong);
  CHECK_THROWS_WITH(amp::update_scale_(s, t, found, 2.0, 0.5, 10),
                    Catch::Contains("growth_tracker must be a Int tensor, but got dtype Long"));
  auto tracker = torch::zeros({1}, torch::kInt);
  CHECK_THROWS_WITH(amp::update_scale_(s, tracker, found, 2.0, 0.5, 10, std::nullopt, std::nullopt,
                                       amp::ScaleUpdateExtensions{3}),
                    Catch::Contains("hysteresis=3 needs the hysteresis_remaining tensor"));
  CHECK_THROWS_WITH(amp::update_scale_(s, tracker, found, 2.0, 0.5, 10, std::nullopt,
                                       torch::zeros({3}, torch::kInt)),
                    Catch::Contains("counters must be a contiguous int64 tensor of 3 elements"));
  CHECK_THROWS_WITH(
      amp::update_scale_(s, tracker, found, 2.0, 0.5, 10, std::nullopt, std::nullopt,
                         amp::ScaleUpdateExtensions{1, false, 4.0, 2.0}),
      Catch::Contains(
          "max_scale must be > 0 and >= min_scale, but got max_scale=2 and min_scale=4"));
  auto total = scalar(1.0f);
  CHECK_THROWS_WITH(amp::clip_unscaled_({g}, scalar(1.0f), total, -1.0),
                    Catch::Contains("max_norm must be > 0, but got -1"));
}

TEST_CASE("The scale update matches ATen's over random trajectories", "[ops]") {
  torch::manual_seed(4);
  const double growth = GENERATE(2.0, 1.5, 1.0000001);
  const double backoff = GENERATE(0.5, 0.25, 0.3333);
  const int64_t interval = GENERATE(1, 2, 3);
  auto s1 = scalar(3.0e37f), s2 = s1.clone();
  auto t1 = torch::zeros({1}, torch::kInt), t2 = t1.clone();
  for (int step = 0; step < 60; ++step) {
    const auto found = scalar(torch::rand({1}).item<float>() < 0.2f ? 1.0f : 0.0f);
    amp::update_scale_(s1, t1, found, growth, backoff, interval);
    at::_amp_update_scale_(s2, t2, found, growth, backoff, interval);
    REQUIRE(same_bits(s1, s2));
    REQUIRE(torch::equal(t1, t2));
  }
}

TEST_CASE("The CPU update saturates the tracker at 2^31-1 where ATen's wraps", "[ops]") {
  amp_test::require_tracker_saturates(
      [](at::Tensor& scale, at::Tensor& tracker, const at::Tensor& found, int64_t interval) {
        amp::update_scale_(scale, tracker, found, 2.0, 0.5, interval);
      },
      torch::kCPU);
}

TEST_CASE("The CPU update's counters saturate at 2^63-1 instead of wrapping", "[ops]") {
  amp_test::require_counters_saturate(torch::kCPU);
}

TEST_CASE("The extended update matches a tensor-op reference of the rule", "[ops]") {
  torch::manual_seed(5);
  amp_test::UpdateOptions o;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.5;
  o.growth_interval = GENERATE(1, 3);
  o.hysteresis = GENERATE(1, 2, 4);
  o.consecutive_hysteresis = GENERATE(false, true);
  o.min_scale = GENERATE(0.0, 3.0);
  o.max_scale = GENERATE(std::numeric_limits<double>::infinity(), 300.0);
  // 0-dim state, as GradScaler keeps it.
  amp_test::require_random_updates_match_reference(o, 80, torch::kCPU);
}

TEST_CASE("With hysteresis 1 and no bounds the extended update equals ATen's", "[ops]") {
  auto s1 = scalar(1.0e38f), s2 = s1.clone();
  auto t1 = torch::zeros({1}, torch::kInt), t2 = t1.clone();
  auto h = torch::ones({1}, torch::kInt);
  torch::Tensor no_counters;
  amp_test::UpdateOptions o;
  o.growth_interval = 2;
  for (float f : {0.f, 0.f, 0.f, 1.f, 0.f, 0.f, kNaN, 0.f}) {
    amp_test::update_scale_extended_(s1, t1, h, no_counters, scalar(f), o);
    at::_amp_update_scale_(s2, t2, scalar(f), 2.0, 0.5, 2);
    REQUIRE(same_bits(s1, s2));
    REQUIRE(torch::equal(t1, t2));
  }
}

TEST_CASE("unscale_norm gives the fp64 norm of the unscaled grads without writing them", "[ops]") {
  torch::manual_seed(6);
  std::vector<torch::Tensor> grads = {scaled_randn(65537, torch::kFloat),
                                      scaled_randn(1001, torch::kHalf),
                                      scaled_randn(33000, torch::kBFloat16),
                                      scaled_randn(17, torch::kDouble),
                                      torch::randn({50, 40}).t(),
                                      torch::randn({30, 30}).narrow(1, 1, 20)};
  std::vector<torch::Tensor> before;
  for (auto& g : grads) before.push_back(g.clone());
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(grads, found, scalar(0.25f), true);
  std::vector<torch::Tensor> ref_per;
  for (auto& g : grads) ref_per.push_back((g.to(torch::kDouble) * 0.25).norm());
  const auto ref = torch::stack(ref_per);
  CHECK(total.dim() == 0);
  CHECK(total.scalar_type() == torch::kFloat);
  CHECK(total.item<double>() == Approx(ref.norm().item<double>()).epsilon(1e-6));
  CHECK(torch::allclose(per.to(torch::kDouble), ref, 1e-6));
  CHECK(found.item<float>() == 0.0f);
  for (size_t i = 0; i < grads.size(); ++i)
    CHECK(torch::equal(raw_bits(grads[i]), raw_bits(before[i])));
}

TEST_CASE("unscale_norm has no false overflow when a float32 sum of squares would overflow",
          "[ops]") {
  auto g = torch::full({100000}, 1.0e30f);  // finite; squares sum to 1e65 > FLT_MAX
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm({g}, found, scalar(1.0f), false);
  CHECK(found.item<float>() == 0.0f);
  CHECK(total.item<double>() == Approx(1.0e30 * std::sqrt(100000.0)).epsilon(1e-6));
  g[99999] = kInf;
  auto [total_inf, unused] = amp::unscale_norm({g}, found, scalar(1.0f), false);
  CHECK(found.item<float>() == 1.0f);
  CHECK(std::isinf(total_inf.item<float>()));
}

TEST_CASE("Unscale and clip match unscale_ followed by clip_grad_norm_", "[ops]") {
  torch::manual_seed(7);
  const double max_norm = GENERATE(0.5, 1.0e9);
  std::vector<torch::Tensor> grads = {scaled_randn(70000, torch::kFloat),
                                      scaled_randn(999, torch::kFloat),
                                      torch::randn({40, 60}).t() * 4096};
  std::vector<torch::Tensor> params;
  for (auto& g : grads) {
    auto p = torch::zeros_like(g, torch::MemoryFormat::Preserve).requires_grad_(true);
    p.mutable_grad() = g.clone();
    params.push_back(p);
  }
  auto found = zero_flag();
  std::vector<torch::Tensor> mine;
  for (auto& g : grads) mine.push_back(g.clone());
  const auto inv = scalar(1.0f / 4096.0f);
  const auto total = std::get<0>(amp::unscale_norm(mine, found, inv));
  amp::clip_unscaled_(mine, inv, total, max_norm);

  std::vector<torch::Tensor> ref_grads;
  for (auto& p : params) ref_grads.push_back(p.grad());
  auto found_ref = zero_flag();
  at::_amp_foreach_non_finite_check_and_unscale_(ref_grads, found_ref, scalar(1.0f / 4096.0f));
  const double ref_total = torch::nn::utils::clip_grad_norm_(params, max_norm);
  CHECK(total.item<double>() == Approx(ref_total).epsilon(1e-5));
  for (size_t i = 0; i < grads.size(); ++i) {
    if (max_norm > 1.0e6) {
      CHECK(same_bits(mine[i], params[i].grad()));  // clip coefficient 1: plain unscale
    } else {
      CHECK(torch::allclose(mine[i], params[i].grad(), 1e-5, 1e-7));
    }
  }
}
