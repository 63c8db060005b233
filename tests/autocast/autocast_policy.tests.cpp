// Autocast policies for custom operators: ops defined here with TORCH_LIBRARY get
// lower-precision, fp32 and promote behaviour through amp::autocast_kernel / register_autocast.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

#include <amp/autocast.h>
#include <amp/autocast_policy.h>

#include "support/autocast_helpers.h"

namespace {

// What the backend kernels received, in call order.
std::vector<torch::Tensor> received;

torch::Tensor record(const torch::Tensor& t) {
  received.push_back(t);
  return t;
}

torch::Tensor scale(const torch::Tensor& x, double factor) { return record(x) * factor; }

torch::Tensor add_pair(const torch::Tensor& a, const torch::Tensor& b) {
  record(a);
  record(b);
  return a + b;
}

torch::Tensor join(at::TensorList xs, const std::optional<torch::Tensor>& extra) {
  std::vector<torch::Tensor> all;
  for (const auto& x : xs) all.push_back(record(x));
  if (extra) all.push_back(record(*extra));
  return torch::cat(all);
}

torch::Tensor& accumulate_(torch::Tensor& self, const torch::Tensor& other) {
  record(self);
  record(other);
  return self.add_(other);
}

torch::Tensor identity(const torch::Tensor& x) { return record(x).clone(); }

torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b) { return a.mm(b); }

}  // namespace

TORCH_LIBRARY(amp_policy_test, m) {
  m.def("scale(Tensor x, float factor) -> Tensor");
  m.def("add_pair(Tensor a, Tensor b) -> Tensor");
  m.def("join(Tensor[] xs, Tensor? extra) -> Tensor");
  m.def("accumulate_(Tensor(a!) self, Tensor other) -> Tensor(a!)");
  m.def("identity(Tensor x) -> Tensor");
  m.def("matmul(Tensor a, Tensor b) -> Tensor");
  m.def("unregistered(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(amp_policy_test, CompositeExplicitAutograd, m) {
  m.impl("scale", scale);
  m.impl("add_pair", add_pair);
  m.impl("join", join);
  m.impl("accumulate_", accumulate_);
  m.impl("identity", identity);
  m.impl("unregistered", identity);
}

// Decomposes into differentiable ATen ops, so gradients flow through the autocast casts.
TORCH_LIBRARY_IMPL(amp_policy_test, CompositeImplicitAutograd, m) { m.impl("matmul", matmul); }

TORCH_LIBRARY_IMPL(amp_policy_test, AutocastCPU, m) {
  m.impl("scale", amp::autocast_kernel(torch::kCPU, amp::AutocastPolicy::lower_precision));
  m.impl("add_pair", amp::autocast_kernel(torch::kCPU, amp::AutocastPolicy::fp32));
  m.impl("join", amp::autocast_kernel(torch::kCPU, amp::AutocastPolicy::promote));
  m.impl("accumulate_", amp::autocast_kernel(torch::kCPU, amp::AutocastPolicy::fp32));
  m.impl("matmul", amp::autocast_kernel(torch::kCPU, amp::AutocastPolicy::lower_precision));
}

TORCH_LIBRARY_IMPL(amp_policy_test, AutocastCUDA, m) {
  m.impl("scale", amp::autocast_kernel(torch::kCUDA, amp::AutocastPolicy::lower_precision));
  m.impl("add_pair", amp::autocast_kernel(torch::kCUDA, amp::AutocastPolicy::fp32));
  m.impl("join", amp::autocast_kernel(torch::kCUDA, amp::AutocastPolicy::promote));
}

namespace {

torch::Tensor call_scale(const torch::Tensor& x, double factor) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("amp_policy_test::scale", "")
                             .typed<torch::Tensor(const torch::Tensor&, double)>();
  return op.call(x, factor);
}

torch::Tensor call_add_pair(const torch::Tensor& a, const torch::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("amp_policy_test::add_pair", "")
                             .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>();
  return op.call(a, b);
}

torch::Tensor call_join(at::TensorList xs, const std::optional<torch::Tensor>& extra) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("amp_policy_test::join", "")
          .typed<torch::Tensor(at::TensorList, const std::optional<torch::Tensor>&)>();
  return op.call(xs, extra);
}

torch::Tensor& call_accumulate_(torch::Tensor& self, const torch::Tensor& other) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("amp_policy_test::accumulate_", "")
                             .typed<torch::Tensor&(torch::Tensor&, const torch::Tensor&)>();
  return op.call(self, other);
}

torch::Tensor call_unary(const char* name, const torch::Tensor& x) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .typed<torch::Tensor(const torch::Tensor&)>()
      .call(x);
}

torch::Tensor call_matmul(const torch::Tensor& a, const torch::Tensor& b) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("amp_policy_test::matmul", "")
      .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>()
      .call(a, b);
}

std::vector<c10::ScalarType> received_dtypes() {
  std::vector<c10::ScalarType> dtypes;
  for (const auto& t : received) dtypes.push_back(t.scalar_type());
  received.clear();
  return dtypes;
}

using amp_test::kLowerPrecision;

}  // namespace

TEST_CASE("A lower-precision custom op receives the region's dtype", "[autocast][policy]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  received.clear();
  const auto x = torch::ones({3});
  {
    amp::AutocastGuard autocast(torch::kCPU, dtype);
    CHECK(call_scale(x, 2.0).scalar_type() == dtype);
    CHECK(call_scale(x.to(torch::kDouble), 2.0).scalar_type() == torch::kDouble);
    call_scale(torch::ones({3}, torch::kLong), 2.0);
  }
  CHECK(received_dtypes() == std::vector<c10::ScalarType>{dtype, torch::kDouble, torch::kLong});
  // Outside a region the op is untouched.
  CHECK(call_scale(x, 2.0).scalar_type() == torch::kFloat);
  CHECK(torch::equal(call_scale(x, 2.0), torch::full({3}, 2.0f)));
  received.clear();
}

TEST_CASE("A lower-precision custom op uses the weight-cast cache within a region",
          "[autocast][policy]") {
  received.clear();
  const auto weight = torch::randn({4}, torch::requires_grad());
  {
    amp::AutocastGuard autocast(torch::kCPU);
    call_scale(weight, 1.0);
    call_scale(weight, 1.0);
  }
  REQUIRE(received.size() == 2);
  CHECK(received[0].is_same(received[1]));
  {
    amp::AutocastGuard autocast(torch::kCPU);
    call_scale(weight, 1.0);
  }
  REQUIRE(received.size() == 3);
  CHECK_FALSE(received[2].is_same(received[0]));  // received[0] is alive, so a new cast
  received.clear();
}

TEST_CASE("An fp32 custom op receives float32", "[autocast][policy]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  received.clear();
  const auto low = torch::ones({2}, dtype);
  {
    amp::AutocastGuard autocast(torch::kCPU, dtype);
    CHECK(call_add_pair(low, low).scalar_type() == torch::kFloat);
    CHECK(call_add_pair(low, torch::ones({2}, torch::kDouble)).scalar_type() == torch::kDouble);
  }
  CHECK(received_dtypes() ==
        std::vector<c10::ScalarType>{torch::kFloat, torch::kFloat, torch::kFloat, torch::kDouble});
}

TEST_CASE("A promote custom op receives the widest floating dtype, lists included",
          "[autocast][policy]") {
  const auto dtype = GENERATE(values(kLowerPrecision));
  received.clear();
  const auto low = torch::ones({2}, dtype);
  const auto fp32 = torch::ones({2});
  amp::AutocastGuard autocast(torch::kCPU, dtype);

  CHECK(call_join({low, low}, std::nullopt).scalar_type() == dtype);
  CHECK(received_dtypes() == std::vector<c10::ScalarType>{dtype, dtype});

  CHECK(call_join({low, low}, fp32).scalar_type() == torch::kFloat);
  CHECK(received_dtypes() ==
        std::vector<c10::ScalarType>{torch::kFloat, torch::kFloat, torch::kFloat});

  // float64 neither widens the others nor is cast itself.
  call_join({low, torch::ones({2}, torch::kDouble)}, low);
  CHECK(received_dtypes() == std::vector<c10::ScalarType>{dtype, torch::kDouble, dtype});
}

TEST_CASE("A custom op's mutated argument is not cast", "[autocast][policy]") {
  received.clear();
  auto self = torch::zeros({2}, torch::kBFloat16);
  const auto other = torch::ones({2}, torch::kBFloat16);
  {
    amp::AutocastGuard autocast(torch::kCPU);
    auto& result = call_accumulate_(self, other);
    CHECK(&result == &self);
  }
  CHECK(received_dtypes() == std::vector<c10::ScalarType>{torch::kBFloat16, torch::kFloat});
  CHECK(torch::equal(self, torch::ones({2}, torch::kBFloat16)));
}

TEST_CASE("Gradients flow through a custom op's autocast casts", "[autocast][policy]") {
  const auto a = torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}}, torch::requires_grad());
  const auto b = torch::tensor({{0.5f, -1.0f}, {2.0f, 0.25f}}, torch::requires_grad());
  torch::Tensor y;
  {
    amp::AutocastGuard autocast(torch::kCPU);
    y = call_matmul(a, b);
  }
  CHECK(y.scalar_type() == torch::kBFloat16);
  y.sum().backward();
  CHECK(a.grad().scalar_type() == torch::kFloat);
  CHECK(torch::equal(a.grad(), torch::tensor({{-0.5f, 2.25f}, {-0.5f, 2.25f}})));
  CHECK(torch::equal(b.grad(), torch::tensor({{4.0f, 4.0f}, {6.0f, 6.0f}})));
}

TEST_CASE("register_autocast gives an op a policy in one line and can replace it",
          "[autocast][policy]") {
  received.clear();
  const auto x = torch::ones({2});
  amp::register_autocast("amp_policy_test::identity", torch::kCPU,
                         amp::AutocastPolicy::lower_precision);
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
    CHECK(call_unary("amp_policy_test::identity", x).scalar_type() == torch::kHalf);
  }
  amp::register_autocast("amp_policy_test::identity", torch::kCPU, amp::AutocastPolicy::fp32);
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
    CHECK(call_unary("amp_policy_test::identity", x.to(torch::kHalf)).scalar_type() ==
          torch::kFloat);
    // An op without an autocast kernel falls through unchanged.
    CHECK(call_unary("amp_policy_test::unregistered", x).scalar_type() == torch::kFloat);
  }
  received.clear();
}

TEST_CASE("register_autocast and autocast_kernel reject bad names and devices",
          "[autocast][policy][errors]") {
  CHECK_THROWS_WITH(
      amp::register_autocast("identity", torch::kCPU, amp::AutocastPolicy::fp32),
      Catch::Contains("amp::register_autocast: operator name 'identity' is not qualified"));
  CHECK_THROWS_WITH(
      amp::register_autocast("amp_policy_test::missing", torch::kCPU, amp::AutocastPolicy::fp32),
      Catch::Contains("amp::register_autocast: no operator 'amp_policy_test::missing' is "
                      "defined"));
  CHECK_THROWS_WITH(
      amp::register_autocast("amp_policy_test::identity", torch::kMeta, amp::AutocastPolicy::fp32),
      Catch::Contains("amp::register_autocast: device type 'meta' has no autocast dispatch key"));
  CHECK_THROWS_WITH(amp::autocast_kernel(torch::kMeta, amp::AutocastPolicy::promote),
                    Catch::Contains("amp::autocast_kernel: device type 'meta' has no autocast "
                                    "dispatch key"));
}

TEST_CASE("Custom op policies apply on CUDA", "[autocast][policy][cuda]") {
  received.clear();
  const auto x = torch::ones({2}, torch::kCUDA);
  amp::AutocastGuard autocast(torch::kCUDA);
  CHECK(call_scale(x, 2.0).scalar_type() == torch::kHalf);
  CHECK(call_add_pair(x.to(torch::kHalf), x).scalar_type() == torch::kFloat);
  CHECK(call_join({x.to(torch::kHalf), x.to(torch::kHalf)}, std::nullopt).scalar_type() ==
        torch::kHalf);
  CHECK(call_join({x.to(torch::kHalf), x}, std::nullopt).scalar_type() == torch::kFloat);
  // A CPU tensor is not cast by a CUDA region.
  CHECK(call_scale(torch::ones({2}), 2.0).scalar_type() == torch::kFloat);
  received.clear();
}
