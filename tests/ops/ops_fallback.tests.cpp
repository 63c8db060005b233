// amp's ops on devices amp has no kernels for: the dispatcher picks the fallback, which runs
// ATen's _amp_* kernels. The fallback is reached here through the PrivateUse1 dispatch key
// (the key out-of-tree devices register under) with CPU tensors, whose ATen kernels exist.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

#include <amp/ops.h>

#include "support/reference_scale_update.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename Signature>
c10::TypedOperatorHandle<Signature> amp_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// The kernel the dispatcher would run for a tensor of that backend.
const c10::DispatchKeySet kOtherDevice(c10::DispatchKey::PrivateUse1);

torch::Tensor scalar(float v) { return torch::full({}, v); }

std::vector<torch::Tensor> sample_grads() {
  torch::manual_seed(11);
  return {torch::randn({1000}) * 4096, (torch::randn({300}) * 4096).to(torch::kHalf),
          (torch::randn({77}) * 4096).to(torch::kBFloat16), torch::randn({20, 30}).t() * 4096,
          torch::empty({0})};
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.clone());
  return out;
}

}  // namespace

TEST_CASE("Devices without amp kernels dispatch to the fallback, CPU and CUDA to amp's own",
          "[ops]") {
  for (const char* name : {"amp::non_finite_check_and_unscale_", "amp::update_scale_",
                           "amp::unscale_norm", "amp::clip_unscaled_"}) {
    INFO(name);
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
    CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
    // What the dispatcher computed for each device: amp's own kernel for CPU, the fallback
    // (registered as the default backend kernel) for devices amp has no kernels for.
    const std::string table = op.dumpComputedTable();
    const auto line_of = [&](const std::string& device) {
      const auto start = table.find("\n" + device + ": ");
      REQUIRE(start != std::string::npos);
      return table.substr(start + 1, table.find('\n', start + 1) - start - 1);
    };
    CHECK_THAT(line_of("CPU"), Catch::Contains("ops/cpu/ops_cpu.cpp"));
    for (const char* device : {"PrivateUse1", "XPU", "MPS", "HPU"}) {
      INFO(device);
      const std::string line = line_of(device);
      CHECK_THAT(line, Catch::Contains("ops_aten_fallback.cpp") &&
                           Catch::Contains("[default backend kernel]"));
    }
  }
}

TEST_CASE("The unscale fallback equals ATen's op, attribution included", "[ops]") {
  using Sig =
      void(at::TensorList, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);
  const auto op = amp_op<Sig>("amp::non_finite_check_and_unscale_");
  for (float bad : {0.0f, kInf, kNaN}) {
    INFO("bad value " << bad);
    auto grads = sample_grads();
    if (bad != 0.0f) grads[2][5] = bad;
    auto mine = clones(grads), ref = clones(grads);
    auto found = scalar(0.0f), found_ref = scalar(0.0f);
    auto per_tensor = torch::zeros({static_cast<int64_t>(grads.size())});
    op.redispatch(kOtherDevice, mine, found, scalar(0.25f), per_tensor);
    for (auto& g : ref) {
      if (g.numel() > 0)
        at::_amp_foreach_non_finite_check_and_unscale_({g}, found_ref, scalar(0.25f));
    }
    CHECK(found.item<float>() == found_ref.item<float>());
    auto expected_per_tensor = torch::zeros({static_cast<int64_t>(grads.size())});
    if (bad != 0.0f) expected_per_tensor[2] = 1.0f;
    CHECK(torch::equal(per_tensor, expected_per_tensor));
    for (size_t i = 0; i < grads.size(); ++i) {
      CHECK(torch::equal(torch::isnan(mine[i]), torch::isnan(ref[i])));
      CHECK(torch::equal(torch::nan_to_num(mine[i]), torch::nan_to_num(ref[i])));
    }
  }
}

TEST_CASE("The update fallback is ATen's _amp_update_scale_ and refuses the extensions", "[ops]") {
  using Sig = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, int64_t,
                   const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t,
                   bool, double, std::optional<double>);
  const auto op = amp_op<Sig>("amp::update_scale_");
  auto s1 = scalar(3.0e38f), s2 = s1.clone();
  auto t1 = torch::zeros({}, torch::kInt), t2 = t1.clone();
  for (float f : {0.f, 0.f, 1.f, 0.f, 0.f, kNaN, 0.f, 0.f}) {
    op.redispatch(kOtherDevice, s1, t1, scalar(f), 2.0, 0.5, 2, std::nullopt, std::nullopt, 1,
                  false, 0.0, std::nullopt);
    at::_amp_update_scale_(s2, t2, scalar(f), 2.0, 0.5, 2);
    CHECK(s1.item<float>() == s2.item<float>());
    CHECK(t1.item<int>() == t2.item<int>());
  }
  auto counters = torch::zeros({3}, torch::kLong);
  CHECK_THROWS_WITH(op.redispatch(kOtherDevice, s1, t1, scalar(0.f), 2.0, 0.5, 2, std::nullopt,
                                  counters, 1, false, 0.0, std::nullopt),
                    Catch::Contains("the update's extensions (hysteresis, min_scale, max_scale, "
                                    "counters) have amp kernels for CPU and CUDA only"));
  CHECK_THROWS_WITH(op.redispatch(kOtherDevice, s1, t1, scalar(0.f), 2.0, 0.5, 2, std::nullopt,
                                  std::nullopt, 1, false, 1.0, std::nullopt),
                    Catch::Contains("use GradScalerOptions without those extensions"));
}

TEST_CASE("The update fallback saturates the tracker at 2^31-1 as amp's kernels do", "[ops]") {
  amp_test::require_tracker_saturates(
      [](at::Tensor& scale, at::Tensor& tracker, const at::Tensor& found, int64_t interval) {
        using Sig =
            void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, int64_t,
                 const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t, bool,
                 double, std::optional<double>);
        amp_op<Sig>("amp::update_scale_")
            .redispatch(kOtherDevice, scale, tracker, found, 2.0, 0.5, interval, std::nullopt,
                        std::nullopt, 1, false, 0.0, std::nullopt);
      },
      torch::kCPU);
}

TEST_CASE("The norm and clip fallbacks match amp's CPU kernels", "[ops]") {
  using NormSig = std::tuple<at::Tensor, at::Tensor>(at::TensorList, const at::Tensor&,
                                                     const at::Tensor&, bool);
  using ClipSig = void(at::TensorList, const at::Tensor&, const at::Tensor&, double, double);
  const auto norm_op = amp_op<NormSig>("amp::unscale_norm");
  const auto clip_op = amp_op<ClipSig>("amp::clip_unscaled_");
  const auto grads = sample_grads();
  const auto inv = scalar(1.0f / 4096.0f);
  auto mine = clones(grads), ref = clones(grads);
  auto found = scalar(0.0f), found_ref = scalar(0.0f);
  const auto [total, per] = norm_op.redispatch(kOtherDevice, mine, found, inv, true);
  const auto [total_ref, per_ref] = amp::unscale_norm(ref, found_ref, inv, true);
  // Sums formed in another order: equal to float32 rounding.
  CHECK(total.item<double>() == Approx(total_ref.item<double>()).epsilon(1e-6));
  CHECK(torch::allclose(per, per_ref, 1e-6));
  CHECK(found.item<float>() == 0.0f);
  clip_op.redispatch(kOtherDevice, mine, inv, total_ref, 0.5, 1e-6);
  amp::clip_unscaled_(ref, inv, total_ref, 0.5, 1e-6);
  for (size_t i = 0; i < grads.size(); ++i) CHECK(torch::equal(mine[i], ref[i]));

  grads[0][3] = kInf;
  auto found_inf = scalar(0.0f);
  norm_op.redispatch(kOtherDevice, grads, found_inf, inv, false);
  CHECK(found_inf.item<float>() == 1.0f);
}
