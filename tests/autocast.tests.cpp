// AutocastGuard and amp::autocast: op dtypes under CPU autocast (checked against Python's
// torch.autocast 2.14), enter/exit state, nesting, the weight-cast cache, validation.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <stdexcept>

#include <amp/autocast.h>

#include "autocast_test_support.h"
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
  // Checked before CUDA's availability, so the error is the same on every machine.
  CHECK_THROWS_WITH(amp::AutocastGuard(torch::kCUDA, torch::kDouble),
                    Catch::Contains("In CUDA autocast, the target dtype Double is not supported"));
  CHECK(full_autocast_state() == before);
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
