// AutocastGuard and amp::autocast: op dtypes under CPU autocast (checked against Python's
// torch.autocast 2.14), enter/exit state, nesting, the weight-cast cache, validation.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <stdexcept>
#include <vector>

#include <amp/autocast.h>

#include "support/autocast_helpers.h"
#include "support/devices.h"

namespace {

namespace F = torch::nn::functional;
using amp_test::full_autocast_state;
using amp_test::FullAutocastState;
using amp_test::kLowerPrecision;
using amp_test::nesting_count;
using amp_test::weight_cast_node;

}  // namespace

TEST_CASE("Ops on CPU autocast's lower-precision list run in the region's dtype", "[autocast]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  const auto a = torch::randn({4, 4});
  const auto b = torch::randn({4, 4});
  const auto weight = torch::randn({3, 4});
  const auto image = torch::randn({1, 2, 5, 5});
  const auto kernel = torch::randn({3, 2, 3, 3});

  amp::AutocastGuard autocast(torch::kCPU, dtype);
  CHECK(torch::mm(a, b).scalar_type() == dtype);
  CHECK(F::linear(a, weight).scalar_type() == dtype);
  CHECK(F::conv2d(image, kernel).scalar_type() == dtype);
  CHECK(torch::matmul(a, b).scalar_type() == dtype);
  CHECK(torch::bmm(a.unsqueeze(0), b.unsqueeze(0)).scalar_type() == dtype);
}

TEST_CASE("Losses and prod on CPU autocast's fp32 list return float32", "[autocast]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  const auto input = torch::randn({4, 4}).to(dtype);
  const auto target = torch::rand({4, 4}).to(dtype);

  amp::AutocastGuard autocast(torch::kCPU, dtype);
  CHECK(F::mse_loss(input, target).scalar_type() == torch::kFloat);
  CHECK(F::binary_cross_entropy_with_logits(input, target).scalar_type() == torch::kFloat);
  CHECK(F::l1_loss(input, target).scalar_type() == torch::kFloat);
  CHECK(F::cross_entropy(input, torch::tensor({0, 1, 2, 3})).scalar_type() == torch::kFloat);
  CHECK(input.prod().scalar_type() == torch::kFloat);
}

TEST_CASE("Ops on no CPU autocast list keep their input dtype", "[autocast]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  const auto fp32 = torch::randn({4, 4});
  const auto low = fp32.to(dtype);

  amp::AutocastGuard autocast(torch::kCPU, dtype);
  CHECK(torch::softmax(low, 1).scalar_type() == dtype);
  CHECK(torch::softmax(fp32, 1).scalar_type() == torch::kFloat);
  CHECK(low.sum().scalar_type() == dtype);
  CHECK(torch::exp(low).scalar_type() == dtype);
  CHECK(F::layer_norm(low, F::LayerNormFuncOptions({4})).scalar_type() == dtype);
  CHECK((fp32 + fp32).scalar_type() == torch::kFloat);
  CHECK(torch::relu(fp32).scalar_type() == torch::kFloat);
}

TEST_CASE("cat and stack promote to the widest floating input dtype", "[autocast]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  const auto fp32 = torch::randn({2, 3});
  const auto low = torch::randn({2, 3}).to(dtype);

  amp::AutocastGuard autocast(torch::kCPU, dtype);
  CHECK(torch::cat({low, fp32}).scalar_type() == torch::kFloat);
  CHECK(torch::cat({low, low}).scalar_type() == dtype);
  CHECK(torch::stack({low, fp32}).scalar_type() == torch::kFloat);
}

TEST_CASE("float64 inputs are never cast inside a region", "[autocast]") {
  const auto a = torch::randn({4, 4}, torch::kDouble);
  amp::AutocastGuard autocast(torch::kCPU);
  CHECK(torch::mm(a, a).scalar_type() == torch::kDouble);
  CHECK(F::linear(a, a).scalar_type() == torch::kDouble);
}

TEST_CASE("A region sets enabled, dtype and cache flag and restores them on exit", "[autocast]") {
  const FullAutocastState before = full_autocast_state();
  REQUIRE_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  REQUIRE(at::autocast::get_autocast_dtype(torch::kCPU) == torch::kBFloat16);
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kHalf, true, false);
    CHECK(autocast.device() == torch::kCPU);
    CHECK(autocast.dtype() == torch::kHalf);
    CHECK(autocast.enabled());
    CHECK_FALSE(autocast.cache_enabled());
    CHECK(at::autocast::is_autocast_enabled(torch::kCPU));
    CHECK(at::autocast::get_autocast_dtype(torch::kCPU) == torch::kHalf);
    CHECK_FALSE(at::autocast::is_autocast_cache_enabled());
    CHECK(nesting_count() == before.nesting + 1);
    // Other device types are untouched.
    CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCUDA));
  }
  CHECK(full_autocast_state() == before);
}

TEST_CASE("The default dtype is the device's current autocast dtype", "[autocast]") {
  {
    amp::AutocastGuard autocast(torch::kCPU);
    CHECK(autocast.dtype() == torch::kBFloat16);
    CHECK(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kBFloat16);
  }
  amp::AutocastGuard outer(torch::kCPU, torch::kHalf);
  amp::AutocastGuard inner(torch::kCPU);
  CHECK(inner.dtype() == torch::kHalf);
  CHECK(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kHalf);
  // CUDA's default does not depend on a GPU being present.
  CHECK(at::autocast::get_autocast_dtype(torch::kCUDA) == torch::kHalf);
}

TEST_CASE("Nested regions and a disabled region inside an enabled one", "[autocast]") {
  const auto a = torch::randn({3, 3});
  const FullAutocastState before = full_autocast_state();
  {
    amp::AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
    {
      amp::AutocastGuard off(torch::kCPU, std::nullopt, /*enabled=*/false);
      CHECK_FALSE(off.enabled());
      CHECK(off.dtype() == torch::kBFloat16);
      CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
      CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
      CHECK(nesting_count() == before.nesting + 2);  // a disabled region counts too
      {
        amp::AutocastGuard half(torch::kCPU, torch::kHalf);
        CHECK(torch::mm(a, a).scalar_type() == torch::kHalf);
      }
      CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
      CHECK(at::autocast::get_autocast_dtype(torch::kCPU) == torch::kBFloat16);
    }
    CHECK(at::autocast::is_autocast_enabled(torch::kCPU));
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
  }
  CHECK(full_autocast_state() == before);
}

TEST_CASE("The full state is restored when an exception leaves a region", "[autocast]") {
  const FullAutocastState before = full_autocast_state();
  const auto throw_inside = [] {
    amp::AutocastGuard outer(torch::kCPU, torch::kHalf, true, false);
    amp::AutocastGuard inner(torch::kCPU, torch::kBFloat16);
    throw std::runtime_error("failure inside the region");
  };
  CHECK_THROWS_WITH(throw_inside(), "failure inside the region");
  CHECK(full_autocast_state() == before);

  // The same through the functional form.
  CHECK_THROWS_WITH(amp::autocast(torch::kCPU,
                                  [] {
                                    torch::mm(torch::ones({2, 3}), torch::ones({2, 3}));
                                  }),
                    Catch::Contains("mat1 and mat2 shapes cannot be multiplied"));
  CHECK(full_autocast_state() == before);
}

TEST_CASE("A weight cast is cached inside a region and dropped when the outermost one ends",
          "[autocast]") {
  const auto x = torch::randn({4, 4});
  const auto weight = torch::randn({4, 4}, torch::requires_grad());

  SECTION("two uses in one region share one cast; a new region casts again") {
    const torch::autograd::Node* first = nullptr;
    torch::Tensor y1;  // keeps the first cast node alive, so its address cannot be reused
    {
      amp::AutocastGuard autocast(torch::kCPU);
      y1 = torch::mm(x, weight);
      const auto y2 = torch::mm(x, weight);
      first = weight_cast_node(y1);
      CHECK(first == weight_cast_node(y2));
      {
        amp::AutocastGuard again(torch::kCPU);
        const auto y3 = torch::mm(x, weight);
        CHECK(weight_cast_node(y3) == first);  // entering a nested region keeps the cache
      }
      // Leaving a nested region keeps it too.
      CHECK(weight_cast_node(torch::mm(x, weight)) == first);
    }
    amp::AutocastGuard autocast(torch::kCPU);
    const auto y4 = torch::mm(x, weight);
    CHECK(weight_cast_node(y4) != first);
  }
  SECTION("a disabled outer region keeps the cache alive between inner regions") {
    amp::AutocastGuard off(torch::kCPU, std::nullopt, /*enabled=*/false);
    torch::Tensor y1, y2;
    {
      amp::AutocastGuard autocast(torch::kCPU);
      y1 = torch::mm(x, weight);
    }
    {
      amp::AutocastGuard autocast(torch::kCPU);
      y2 = torch::mm(x, weight);
    }
    CHECK(weight_cast_node(y1) == weight_cast_node(y2));
  }
  SECTION("cache_enabled=false casts on every use") {
    amp::AutocastGuard autocast(torch::kCPU, std::nullopt, true, /*cache_enabled=*/false);
    CHECK(weight_cast_node(torch::mm(x, weight)) != weight_cast_node(torch::mm(x, weight)));
  }
}

TEST_CASE("amp::autocast runs a callable in a region and returns its result", "[autocast]") {
  const auto a = torch::randn({2, 2});
  const FullAutocastState before = full_autocast_state();

  const auto out = amp::autocast(
      torch::kCPU, [](const torch::Tensor& t) { return t.mm(t); }, a);
  CHECK(out.scalar_type() == torch::kBFloat16);
  // CPU autocast's mm is ATen's bf16 mm on bf16 copies of the inputs.
  const auto a_bf16 = a.to(torch::kBFloat16);
  CHECK(torch::equal(out, a_bf16.mm(a_bf16)));

  const auto half = amp::autocast(amp::AutocastOptions(torch::kCPU).dtype(torch::kHalf),
                                  [&] { return torch::mm(a, a); });
  CHECK(half.scalar_type() == torch::kHalf);

  const auto off = amp::autocast(amp::AutocastOptions(torch::kCPU).enabled(false),
                                 [&] { return torch::mm(a, a); });
  CHECK(off.scalar_type() == torch::kFloat);

  int counter = 0;
  int& same = amp::autocast(torch::kCPU, [&]() -> int& { return ++counter, counter; });
  CHECK(&same == &counter);
  CHECK(full_autocast_state() == before);
}

TEST_CASE("An unsupported device type is an error naming it", "[autocast][errors]") {
  const FullAutocastState before = full_autocast_state();
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kMeta),
                    Catch::Contains("User specified an unsupported autocast device_type 'meta'"));
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kMeta, std::nullopt, false),
                    Catch::Contains("device_type 'meta'") && Catch::Contains("cpu, cuda"));
  CHECK_FALSE(amp::is_autocast_available(torch::kMeta));
  CHECK(amp::is_autocast_available(torch::kCPU));
  CHECK(amp::is_autocast_available(torch::kCUDA));
  CHECK(full_autocast_state() == before);
}

TEST_CASE("An unsupported dtype is an error naming device, dtype and the allowed dtypes",
          "[autocast][errors]") {
  const FullAutocastState before = full_autocast_state();
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kCPU, torch::kDouble),
                    Catch::Contains("In CPU autocast, the target dtype Double is not supported") &&
                        Catch::Contains("CPU autocast supports BFloat16 and Half"));
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kCPU, torch::kInt),
                    Catch::Contains("the target dtype Int is not supported"));
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kCPU, torch::kFloat),
                    Catch::Contains("the target dtype Float is not supported"));
  // The rule is the same for the device types other than CUDA; none needs its device present.
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kXPU, torch::kFloat),
                    Catch::Contains("In XPU autocast, the target dtype Float is not supported"));
  CHECK(full_autocast_state() == before);
}

namespace {

using Check = amp::detail::AutocastRequestCheck;

// Runs the validation rule with a machine that has CUDA (or not) and a GPU with bf16 (or not),
// counting how often the rule asked.
struct FakeMachine {
  bool cuda = true;
  bool bf16 = true;
  int cuda_asked = 0;
  int bf16_asked = 0;
  Check check(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true) {
    return amp::detail::check_autocast_request(
        device, dtype, enabled, [this] { return ++cuda_asked, cuda; },
        [this] { return ++bf16_asked, bf16; });
  }
};

const std::vector<c10::ScalarType> kDtypes = {
    torch::kBFloat16, torch::kHalf, torch::kFloat,         torch::kDouble,
    torch::kInt,      torch::kBool, torch::kFloat8_e4m3fn, torch::kComplexFloat};

}  // namespace

// Python, torch 2.14 (autocast_mode.py, autocast.__init__): for each device type and each dtype
// above, torch.autocast(device, dtype=dtype)._enabled and whether it warned, with CUDA made
// available by replacing torch.cuda.amp.common.amp_definitely_not_available and
// torch.cuda.is_bf16_supported by lambdas returning False / True:
//   cpu, xpu, mps, hpu, xla, mtia, maia, ipu: bfloat16 and float16 enabled without warning; every
//     other dtype warns "In <DEVICE> autocast, but the target dtype is not supported" and disables;
//   cuda: every dtype enabled without warning;
//   cuda, is_bf16_supported() False: bfloat16 raises "Current CUDA Device does not support
//     bfloat16", float16 and float32 enabled;
//   cuda without CUDA: every dtype (float64 too) warns "CUDA is not available ..." and disables;
//   enabled=False: no warning for any dtype (float64 on CPU included);
//   "meta": raises "User specified an unsupported autocast device_type 'meta'".
// "privateuseone" takes its list from the backend's Python module in Python (an AssertionError
// when none is registered); amp keeps Python's default list for it, bfloat16 and float16.
TEST_CASE("The dtype rule per device type is Python's", "[autocast][errors]") {
  for (const auto device : amp_test::kAutocastDevices) {
    for (const auto dtype : kDtypes) {
      CAPTURE(c10::DeviceTypeName(device), dtype);
      FakeMachine machine;
      const Check check = machine.check(device, dtype);
      if (device == torch::kCUDA) {
        CHECK(check == Check::enabled);
      } else if (dtype == torch::kBFloat16 || dtype == torch::kHalf) {
        CHECK(check == Check::enabled);
      } else {
        // Python warns and disables; AutocastGuard throws for this outcome.
        CHECK(check == Check::unsupported_dtype);
      }
      if (device != torch::kCUDA) {
        // Like Python, a region on another device type never asks about CUDA.
        CHECK(machine.cuda_asked == 0);
        CHECK(machine.bf16_asked == 0);
      }
      CHECK(machine.check(device, dtype, /*enabled=*/false) == Check::disabled);
    }
  }
}

TEST_CASE("The CUDA rule: availability first, then bf16 support, no dtype list",
          "[autocast][errors]") {
  for (const auto dtype : kDtypes) {
    CAPTURE(dtype);
    FakeMachine no_cuda;
    no_cuda.cuda = false;
    CHECK(no_cuda.check(torch::kCUDA, dtype) == Check::cuda_unavailable);
    CHECK(no_cuda.bf16_asked == 0);

    FakeMachine no_bf16;
    no_bf16.bf16 = false;
    CHECK(no_bf16.check(torch::kCUDA, dtype) ==
          (dtype == torch::kBFloat16 ? Check::cuda_bf16_unsupported : Check::enabled));
    CHECK(no_bf16.bf16_asked == (dtype == torch::kBFloat16 ? 1 : 0));

    FakeMachine disabled;
    CHECK(disabled.check(torch::kCUDA, dtype, /*enabled=*/false) == Check::disabled);
    CHECK(disabled.cuda_asked == 0);
  }
  FakeMachine machine;
  CHECK(machine.check(torch::kMeta, torch::kHalf) == Check::unsupported_device);
  CHECK(machine.check(torch::kMeta, torch::kHalf, /*enabled=*/false) == Check::unsupported_device);
}

TEST_CASE("A disabled region accepts any dtype, as Python does", "[autocast][errors]") {
  const FullAutocastState before = full_autocast_state();
  {
    amp::AutocastGuard off(torch::kCPU, torch::kDouble, /*enabled=*/false);
    CHECK_FALSE(off.enabled());
    CHECK(at::autocast::get_autocast_dtype(torch::kCPU) == torch::kDouble);
  }
  CHECK(full_autocast_state() == before);
}

TEST_CASE("A CUDA region without CUDA runs disabled and still saves and restores state",
          "[autocast][no-gpu]") {
  const FullAutocastState before = full_autocast_state();
  {
    amp::AutocastGuard autocast(torch::kCUDA);
    CHECK_FALSE(autocast.enabled());
    CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCUDA));
    CHECK(nesting_count() == before.nesting + 1);
    amp::AutocastGuard bf16(torch::kCUDA, torch::kBFloat16);
    CHECK_FALSE(bf16.enabled());
    CHECK(at::autocast::get_autocast_dtype(torch::kCUDA) == torch::kBFloat16);
  }
  CHECK(full_autocast_state() == before);
}

TEST_CASE("A CUDA region of any dtype without CUDA runs disabled instead of failing",
          "[autocast][no-gpu]") {
  const FullAutocastState before = full_autocast_state();
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    amp::AutocastGuard autocast(torch::kCUDA, dtype);
    CHECK_FALSE(autocast.enabled());
    CHECK(at::autocast::get_autocast_dtype(torch::kCUDA) == dtype);
  }
  CHECK(full_autocast_state() == before);
}

// ATen's cached_cast casts every eligible CUDA tensor to the region's dtype, float32 included, so
// a float32 region computes the lower-precision ops in float32 (as torch.autocast("cuda",
// dtype=torch.float32) does in Python).
TEST_CASE("A float32 CUDA region runs enabled and computes mm in float32", "[autocast][cuda]") {
  const auto half = torch::randn({8, 8}, torch::kCUDA).to(torch::kHalf);
  amp::AutocastGuard autocast(torch::kCUDA, torch::kFloat);
  CHECK(autocast.enabled());
  CHECK(at::autocast::is_autocast_enabled(torch::kCUDA));
  const auto out = torch::mm(half, half);
  CHECK(out.scalar_type() == torch::kFloat);
  amp::AutocastGuard off(torch::kCUDA, std::nullopt, /*enabled=*/false);
  CHECK(torch::equal(out, torch::mm(half.to(torch::kFloat), half.to(torch::kFloat))));
}

TEST_CASE("CUDA autocast runs lower-precision ops in fp16 by default", "[autocast][cuda]") {
  const auto a = torch::randn({8, 8}, torch::kCUDA);
  amp::AutocastGuard autocast(torch::kCUDA);
  CHECK(autocast.enabled());
  CHECK(torch::mm(a, a).scalar_type() == torch::kHalf);
  CHECK(F::mse_loss(a, a).scalar_type() == torch::kFloat);
  CHECK(torch::softmax(torch::mm(a, a), 1).scalar_type() == torch::kFloat);
  // CPU tensors are not touched by a CUDA region.
  CHECK(torch::mm(a.cpu(), a.cpu()).scalar_type() == torch::kFloat);
}

TEST_CASE("CUDA autocast with bf16 runs where the GPU supports bf16", "[autocast][cuda]") {
  const auto a = torch::randn({8, 8}, torch::kCUDA);
  amp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
  CHECK(autocast.enabled());
  CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
}
