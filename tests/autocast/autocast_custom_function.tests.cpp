// custom_fwd / custom_bwd on torch::autograd::Function: dtypes inside forward and backward and
// gradient values, matching Python's torch.amp.custom_fwd / custom_bwd (torch 2.14).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <amp/autocast.h>
#include <amp/custom_function.h>

#include "support/autocast_helpers.h"

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

// The forward of both matmul functions below: records what it sees, saves a and b, multiplies.
torch::Tensor matmul_forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
  observed.forward_autocast = at::autocast::is_autocast_enabled(torch::kCPU);
  observed.forward_a = a.scalar_type();
  observed.forward_b = b.scalar_type();
  observed.forward_mm = a.mm(b).scalar_type();
  ctx->save_for_backward({a, b});
  return a.mm(b);
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
        [&](const torch::Tensor& a, const torch::Tensor& b) { return matmul_forward(ctx, a, b); },
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
        [&](const torch::Tensor& a, const torch::Tensor& b) { return matmul_forward(ctx, a, b); },
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
// Fresh leaves a and b, each requiring grad.
std::pair<torch::Tensor, torch::Tensor> inputs() {
  return {torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}}, torch::requires_grad()),
          torch::tensor({{0.5f, -1.0f}, {2.0f, 0.25f}}, torch::requires_grad())};
}
const auto kExpectedY = [] { return torch::tensor({{4.5f, -0.5f}, {9.5f, -2.0f}}); };
const auto kExpectedGradA = [] { return torch::tensor({{-0.5f, 2.25f}, {-0.5f, 2.25f}}); };
const auto kExpectedGradB = [] { return torch::tensor({{4.0f, 4.0f}, {6.0f, 6.0f}}); };

}  // namespace

TEST_CASE("custom_fwd without cast runs forward and backward under the caller's autocast",
          "[autocast][custom_function]") {
  auto [a, b] = inputs();
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
  auto [a, b] = inputs();
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
  auto [a, b] = inputs();
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
  auto [a, b] = inputs();
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

// Python, torch 2.14: @custom_fwd(device_type="cpu", cast_inputs=torch.float32) inside
// torch.autocast("cpu"), called with d = {"h": half, "b": bf16, "d": float64, "i": int64,
// "m": half on "meta", "n": 7}, l = [half, None, float64, int64], {"x": [half, bf16, float64]}
// and [{"a": half}, {"b": int64}], sees inside forward: d's values float32, float32, float64,
// int64, float16 (the meta tensor: another device type) and 7, the untouched tensors being the
// very objects passed in; l as float32, None, float64, int64; {"x": [float32, float32, float64]};
// [{"a": float32}, {"b": int64}]; autocast off. The caller's containers are not changed. With
// cast_inputs=torch.bfloat16 in a float16 region, float32 and half values become bfloat16.
TEST_CASE("custom_fwd's cast reaches tensors in c10::List, c10::Dict and std::map",
          "[autocast][custom_function]") {
  const auto half = torch::ones({2}, torch::kHalf);
  const auto bf16 = torch::ones({2}, torch::kBFloat16);
  const auto dbl = torch::ones({2}, torch::kDouble);
  const auto ints = torch::ones({2}, torch::kLong);
  const auto meta =
      torch::ones({2}, torch::TensorOptions().dtype(torch::kHalf).device(torch::kMeta));
  using Dtypes = std::vector<c10::ScalarType>;

  c10::List<torch::Tensor> list({half, bf16, dbl, ints, meta});
  c10::List<std::optional<torch::Tensor>> optionals;
  optionals.push_back(half);
  optionals.push_back(std::nullopt);
  optionals.push_back(dbl);
  optionals.push_back(ints);
  c10::Dict<std::string, torch::Tensor> dict;
  std::map<std::string, torch::Tensor> map;
  std::unordered_map<int64_t, torch::Tensor> hashed;
  int64_t key = 0;
  const std::vector<std::pair<std::string, torch::Tensor>> entries{
      {"h", half}, {"b", bf16}, {"d", dbl}, {"i", ints}, {"m", meta}};
  for (const auto& [name, tensor] : entries) {
    dict.insert(name, tensor);
    map.emplace(name, tensor);
    hashed.emplace(key++, tensor);
  }
  const auto in_order = [](const auto& lookup) {
    return Dtypes{lookup("h").scalar_type(), lookup("b").scalar_type(), lookup("d").scalar_type(),
                  lookup("i").scalar_type(), lookup("m").scalar_type()};
  };
  const Dtypes expected{torch::kFloat, torch::kFloat, torch::kDouble, torch::kLong, torch::kHalf};

  torch::autograd::AutogradContext ctx;
  amp::AutocastGuard autocast(torch::kCPU);
  amp::custom_fwd(
      &ctx, torch::kCPU, torch::kFloat,
      [&](const c10::List<torch::Tensor>& l, const c10::List<std::optional<torch::Tensor>>& o,
          const c10::Dict<std::string, torch::Tensor>& d,
          const std::map<std::string, torch::Tensor>& m,
          const std::unordered_map<int64_t, torch::Tensor>& u) {
        CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
        Dtypes from_list;
        for (size_t i = 0; i < l.size(); ++i) from_list.push_back(l.get(i).scalar_type());
        CHECK(from_list == expected);
        REQUIRE(o.size() == 4);
        CHECK(o.get(0)->scalar_type() == torch::kFloat);
        CHECK_FALSE(o.get(1).has_value());
        CHECK(o.get(2)->scalar_type() == torch::kDouble);
        CHECK(o.get(3)->scalar_type() == torch::kLong);
        CHECK(in_order([&](const char* k) { return d.at(k); }) == expected);
        CHECK(in_order([&](const char* k) { return m.at(k); }) == expected);
        const std::map<std::string, int64_t> index{
            {"h", 0}, {"b", 1}, {"d", 2}, {"i", 3}, {"m", 4}};
        CHECK(in_order([&](const char* k) { return u.at(index.at(k)); }) == expected);
        // Tensors that are not cast are passed on as themselves, as in Python.
        CHECK(d.at("d").is_same(dbl));
        CHECK(m.at("i").is_same(ints));
        CHECK(l.get(4).is_same(meta));
        return 0;
      },
      list, optionals, dict, map, hashed);

  // The caller's containers, c10::List and c10::Dict included (they share storage between
  // copies), still hold the original tensors.
  CHECK(list.get(0).is_same(half));
  CHECK(optionals.get(0)->is_same(half));
  CHECK(dict.at("h").is_same(half));
  CHECK(map.at("h").is_same(half));
  CHECK(hashed.at(0).is_same(half));

  SECTION("nested containers") {
    c10::List<c10::List<torch::Tensor>> lists;
    lists.push_back(c10::List<torch::Tensor>({half, bf16}));
    lists.push_back(c10::List<torch::Tensor>({dbl}));
    c10::Dict<std::string, c10::List<torch::Tensor>> dict_of_lists;
    dict_of_lists.insert("x", c10::List<torch::Tensor>({half, bf16, dbl}));
    const std::map<std::string, std::vector<torch::Tensor>> map_of_vectors{
        {"x", {half, bf16, dbl}}};
    const std::vector<std::map<std::string, torch::Tensor>> vector_of_maps{{{"a", half}},
                                                                           {{"b", ints}}};
    const auto dtypes_of = [](const auto& tensors) {
      Dtypes out;
      for (const torch::Tensor& t : tensors) out.push_back(t.scalar_type());
      return out;
    };
    amp::custom_fwd(
        &ctx, torch::kCPU, torch::kFloat,
        [&](const c10::List<c10::List<torch::Tensor>>& ll,
            const c10::Dict<std::string, c10::List<torch::Tensor>>& dl,
            const std::map<std::string, std::vector<torch::Tensor>>& mv,
            const std::vector<std::map<std::string, torch::Tensor>>& vm) {
          CHECK(dtypes_of(ll.get(0).vec()) == Dtypes{torch::kFloat, torch::kFloat});
          CHECK(dtypes_of(ll.get(1).vec()) == Dtypes{torch::kDouble});
          CHECK(dtypes_of(dl.at("x").vec()) ==
                Dtypes{torch::kFloat, torch::kFloat, torch::kDouble});
          CHECK(dtypes_of(mv.at("x")) == Dtypes{torch::kFloat, torch::kFloat, torch::kDouble});
          CHECK(vm.at(0).at("a").scalar_type() == torch::kFloat);
          CHECK(vm.at(1).at("b").scalar_type() == torch::kLong);
          return 0;
        },
        lists, dict_of_lists, map_of_vectors, vector_of_maps);
    CHECK(lists.get(0).get(0).is_same(half));
    CHECK(dict_of_lists.at("x").get(0).is_same(half));
  }
  SECTION("another cast_inputs dtype in another region dtype") {
    amp::AutocastGuard half_region(torch::kCPU, torch::kHalf);
    const std::map<std::string, torch::Tensor> inputs{
        {"f", torch::ones({2})}, {"h", half}, {"d", dbl}, {"i", ints}};
    const auto seen = amp::custom_fwd(
        &ctx, torch::kCPU, torch::kBFloat16,
        [](const std::map<std::string, torch::Tensor>& m) {
          return Dtypes{m.at("f").scalar_type(), m.at("h").scalar_type(), m.at("d").scalar_type(),
                        m.at("i").scalar_type()};
        },
        inputs);
    CHECK(seen == Dtypes{torch::kBFloat16, torch::kBFloat16, torch::kDouble, torch::kLong});
  }
}

// Python's custom_fwd casts the tensor keys of a dict as well; amp leaves keys alone on purpose
// (see custom_fwd), so a tensor key still finds its entry by identity.
TEST_CASE("custom_fwd's cast leaves map keys alone", "[autocast][custom_function]") {
  const auto key = torch::ones({2}, torch::kHalf);
  c10::Dict<torch::Tensor, torch::Tensor> dict;
  dict.insert(key, torch::ones({2}, torch::kHalf));
  torch::autograd::AutogradContext ctx;
  amp::AutocastGuard autocast(torch::kCPU);
  amp::custom_fwd(
      &ctx, torch::kCPU, torch::kFloat,
      [&](const c10::Dict<torch::Tensor, torch::Tensor>& d) {
        REQUIRE(d.contains(key));
        CHECK(d.begin()->key().is_same(key));
        CHECK(d.at(key).scalar_type() == torch::kFloat);
        return 0;
      },
      dict);
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
