// custom_fwd / custom_bwd on torch::autograd::Function: dtypes inside forward and backward and
// gradient values, matching Python's torch.amp.custom_fwd / custom_bwd (torch 2.14).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <optional>
#include <tuple>
#include <vector>

#include <amp/autocast.h>
#include <amp/custom_function.h>

#include "autocast_test_support.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What forward and backward saw, written by the functions below.
struct Observed {
  bool forward_autocast = false;
  c10::ScalarType forward_a = c10::ScalarType::Undefined;
  c10::ScalarType forward_b = c10::ScalarType::Undefined;
  c10::ScalarType forward_mm = c10::ScalarType::Undefined;
  bool backward_autocast = false;
  c10::ScalarType backward_dtype = c10::ScalarType::Undefined;
  c10::ScalarType backward_grad = c10::ScalarType::Undefined;
  c10::ScalarType backward_mm = c10::ScalarType::Undefined;
};
Observed observed;

void observe_forward(const torch::Tensor& a, const torch::Tensor& b) {
  observed.forward_autocast = at::autocast::is_autocast_enabled(torch::kCPU);
  observed.forward_a = a.scalar_type();
  observed.forward_b = b.scalar_type();
  observed.forward_mm = a.mm(b).scalar_type();
}

variable_list matmul_backward(AutogradContext* ctx, const variable_list& grads) {
  const auto saved = ctx->get_saved_variables();
  const auto& g = grads[0];
  observed.backward_autocast = at::autocast::is_autocast_enabled(torch::kCPU);
  observed.backward_dtype = at::autocast::get_autocast_dtype(torch::kCPU);
  observed.backward_grad = g.scalar_type();
  const auto grad_a = g.mm(saved[1].t());
  observed.backward_mm = grad_a.scalar_type();
  return {grad_a, saved[0].t().mm(g)};
}

// A matmul that runs in whatever autocast state its caller has (custom_fwd without cast).
struct AutocastMatmul : torch::autograd::Function<AutocastMatmul> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor a, torch::Tensor b) {
    return amp::custom_fwd(
        ctx, torch::kCPU,
        [&](const torch::Tensor& a, const torch::Tensor& b) {
          observe_forward(a, b);
          ctx->save_for_backward({a, b});
          return a.mm(b);
        },
        a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return amp::custom_bwd(ctx, torch::kCPU, [&] { return matmul_backward(ctx, grads); });
  }
};

// A matmul that needs full precision: custom_fwd with cast_inputs = float32.
struct Fp32Matmul : torch::autograd::Function<Fp32Matmul> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor a, torch::Tensor b) {
    return amp::custom_fwd(
        ctx, torch::kCPU, torch::kFloat,
        [&](const torch::Tensor& a, const torch::Tensor& b) {
          observe_forward(a, b);
          ctx->save_for_backward({a, b});
          return a.mm(b);
        },
        a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return amp::custom_bwd(ctx, torch::kCPU, matmul_backward, ctx, grads);
  }
};

// A backward that forgot custom_fwd in forward.
struct MissingForwardState : torch::autograd::Function<MissingForwardState> {
  static torch::Tensor forward(AutogradContext*, torch::Tensor a) { return a * 2; }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return amp::custom_bwd(ctx, torch::kCPU, [&] { return variable_list{grads[0] * 2}; });
  }
};

// Forward recorded CPU, backward asks for CUDA.
struct MismatchedDevice : torch::autograd::Function<MismatchedDevice> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor a) {
    return amp::custom_fwd(
        ctx, torch::kCPU, [](const torch::Tensor& a) { return a * 2; }, a);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return amp::custom_bwd(ctx, torch::kCUDA, [&] { return variable_list{grads[0] * 2}; });
  }
};

// Python: a = [[1, 2], [3, 4]], b = [[0.5, -1], [2, 0.25]], y = a @ b, y.sum().backward().
torch::Tensor input_a() {
  return torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}}, torch::requires_grad());
}
torch::Tensor input_b() {
  return torch::tensor({{0.5f, -1.0f}, {2.0f, 0.25f}}, torch::requires_grad());
}
const auto kExpectedY = [] { return torch::tensor({{4.5f, -0.5f}, {9.5f, -2.0f}}); };
const auto kExpectedGradA = [] { return torch::tensor({{-0.5f, 2.25f}, {-0.5f, 2.25f}}); };
const auto kExpectedGradB = [] { return torch::tensor({{4.0f, 4.0f}, {6.0f, 6.0f}}); };

}  // namespace

TEST_CASE("custom_fwd without cast runs forward and backward under the caller's autocast",
          "[autocast][custom_function]") {
  auto a = input_a();
  auto b = input_b();
  torch::Tensor y;
  {
    amp::AutocastGuard autocast(torch::kCPU);
    y = AutocastMatmul::apply(a, b);
  }
  CHECK(observed.forward_autocast);
  CHECK(observed.forward_a == torch::kFloat);
  CHECK(observed.forward_mm == torch::kBFloat16);
  CHECK(y.scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(y.to(torch::kFloat), kExpectedY()));

  // backward() runs outside any region; custom_bwd reopens forward's region.
  y.sum().backward();
  CHECK(observed.backward_autocast);
  CHECK(observed.backward_dtype == torch::kBFloat16);
  CHECK(observed.backward_grad == torch::kBFloat16);
  CHECK(observed.backward_mm == torch::kBFloat16);
  CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  CHECK(a.grad().scalar_type() == torch::kFloat);
  CHECK(torch::equal(a.grad(), kExpectedGradA()));
  CHECK(torch::equal(b.grad(), kExpectedGradB()));
}

TEST_CASE("custom_fwd without cast outside a region records autocast off",
          "[autocast][custom_function]") {
  auto a = input_a();
  auto b = input_b();
  const auto y = AutocastMatmul::apply(a, b);
  CHECK_FALSE(observed.forward_autocast);
  CHECK(y.scalar_type() == torch::kFloat);
  {
    // Even if backward is called inside a region, backward runs as forward did.
    amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
    y.sum().backward();
  }
  CHECK_FALSE(observed.backward_autocast);
  CHECK(observed.backward_mm == torch::kFloat);
  CHECK(torch::equal(a.grad(), kExpectedGradA()));
}

TEST_CASE("custom_fwd with cast_inputs casts floating inputs and runs forward without autocast",
          "[autocast][custom_function]") {
  auto a = input_a();
  auto b = input_b();
  torch::Tensor y;
  {
    amp::AutocastGuard autocast(torch::kCPU);
    y = Fp32Matmul::apply(a.to(torch::kBFloat16), b);
    CHECK(at::autocast::is_autocast_enabled(torch::kCPU));  // restored after forward
  }
  CHECK_FALSE(observed.forward_autocast);
  CHECK(observed.forward_a == torch::kFloat);
  CHECK(observed.forward_b == torch::kFloat);
  CHECK(observed.forward_mm == torch::kFloat);
  CHECK(y.scalar_type() == torch::kFloat);
  CHECK(torch::equal(y, kExpectedY()));

  y.sum().backward();
  CHECK_FALSE(observed.backward_autocast);
  CHECK(observed.backward_grad == torch::kFloat);
  CHECK(torch::equal(a.grad(), kExpectedGradA()));
  CHECK(torch::equal(b.grad(), kExpectedGradB()));
}

TEST_CASE("custom_fwd with cast_inputs outside a region leaves inputs alone",
          "[autocast][custom_function]") {
  auto a = input_a();
  auto b = input_b();
  const auto y = Fp32Matmul::apply(a.to(torch::kBFloat16), b.to(torch::kBFloat16));
  CHECK(observed.forward_a == torch::kBFloat16);
  CHECK(observed.forward_mm == torch::kBFloat16);
  CHECK(y.scalar_type() == torch::kBFloat16);
}

TEST_CASE("custom_fwd's cast reaches into containers and skips float64 and integers",
          "[autocast][custom_function]") {
  const auto half = torch::ones({2}, torch::kHalf);
  const auto dbl = torch::ones({2}, torch::kDouble);
  const auto ints = torch::ones({2}, torch::kLong);
  const std::vector<torch::Tensor> list{half, dbl};
  const std::optional<torch::Tensor> maybe = half;
  const std::optional<torch::Tensor> none;
  const auto pair = std::make_tuple(half, 3);

  torch::autograd::AutogradContext ctx;
  amp::AutocastGuard autocast(torch::kCPU);
  const auto dtypes = amp::custom_fwd(
      &ctx, torch::kCPU, torch::kFloat,
      [](const torch::Tensor& h, const torch::Tensor& d, const torch::Tensor& i,
         torch::TensorList l, const std::vector<torch::Tensor>& v,
         const std::optional<torch::Tensor>& m, const std::optional<torch::Tensor>& n,
         const std::tuple<torch::Tensor, int>& t, double scalar) {
        CHECK(scalar == 0.5);
        CHECK_FALSE(n.has_value());
        CHECK(std::get<1>(t) == 3);
        return std::vector<c10::ScalarType>{
            h.scalar_type(),    d.scalar_type(),    i.scalar_type(),  l[0].scalar_type(),
            l[1].scalar_type(), v[0].scalar_type(), m->scalar_type(), std::get<0>(t).scalar_type()};
      },
      half, dbl, ints, torch::TensorList(list), list, maybe, none, pair, 0.5);
  CHECK(dtypes == std::vector<c10::ScalarType>{torch::kFloat, torch::kDouble, torch::kLong,
                                               torch::kFloat, torch::kDouble, torch::kFloat,
                                               torch::kFloat, torch::kFloat});
}

TEST_CASE("custom_bwd without custom_fwd's state is an error saying what to do",
          "[autocast][custom_function][errors]") {
  auto a = torch::ones({2}, torch::requires_grad());
  const auto y = MissingForwardState::apply(a);
  CHECK_THROWS_WITH(y.sum().backward(),
                    Catch::Contains("amp::custom_bwd: the context holds no autocast state") &&
                        Catch::Contains("amp::custom_fwd(ctx, ...)"));
}

TEST_CASE("custom_bwd with another device type than custom_fwd is an error",
          "[autocast][custom_function][errors]") {
  auto a = torch::ones({2}, torch::requires_grad());
  const auto y = MismatchedDevice::apply(a);
  CHECK_THROWS_WITH(y.sum().backward(),
                    Catch::Contains("amp::custom_bwd: device type 'cuda' differs from the "
                                    "device type 'cpu' that amp::custom_fwd recorded"));
}

TEST_CASE("custom_fwd refuses a device type without autocast",
          "[autocast][custom_function][errors]") {
  torch::autograd::AutogradContext ctx;
  CHECK_THROWS_WITH(amp::custom_fwd(&ctx, torch::kMeta, [] { return 1; }),
                    Catch::Contains("amp::custom_fwd: device type 'meta' has no autocast"));
}
