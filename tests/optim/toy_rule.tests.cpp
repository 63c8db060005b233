// A rule written in this file alone runs on the step engine: the contract of
// src/optim/engine/rule.h is all a new optimizer's arithmetic needs. The toy rule (a trace of the
// gradients, p -= lr * trace) is stepped through run_rule_step_here() with every write-back, a
// scaled gradient and a skipped step, and compared bit for bit with the same arithmetic in ATen.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "optim/engine/cpu/rule_step_here.h"

namespace amp::optim::detail {

struct ToyHyper {
  double lr, decay;
};

struct ToyScalars : GradScalars {
  float lr, decay;
};

namespace engine {
namespace {

// trace = decay * trace + g;  p = p - lr * trace  (float32, one rounding per operation).
struct ToyRule : RuleOf<ToyHyper, ToyScalars> {
  static constexpr const char* kName = "Toy";
  enum StateSlot : int { kTrace };

  static Scalars scalars(const Hyper& h, float, bool, float scale) {
    Scalars c;
    set_grad_scalars(c, scale, /*maximize=*/false);
    c.lr = static_cast<float>(h.lr);
    c.decay = static_cast<float>(h.decay);
    return c;
  }

  template <typename P, typename S, WriteBack W, bool>
  static void element(const Pointers<P, S>& p, const Scalars& c, uint64_t key, int64_t i,
                      int64_t index) {
    const float g = unscaled_grad<P>(p, i, c);
    const float w = read_weight<P, W>(p, i);
    const auto trace = S::store(S::load(p.state[kTrace][i]) * c.decay + g);
    p.state[kTrace][i] = trace;
    apply_update<P, W>(p, key, i, index, w, -(S::load(trace) * c.lr));
  }
};

}  // namespace
}  // namespace engine
}  // namespace amp::optim::detail

namespace {

using amp::optim::detail::StepArgs;
using amp::optim::detail::StepSlot;
using amp::optim::detail::ToyHyper;
using amp::optim::detail::WriteBack;
using amp::optim::detail::engine::ToyRule;

constexpr ToyHyper kHyper{0.05, 0.75};

struct Toy {
  torch::Tensor param, grad, trace, master, comp, step;
};

Toy make_toy(torch::ScalarType dtype, int64_t n, uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  Toy t;
  t.param = torch::randn({n}).to(dtype);
  t.grad = torch::randn({n}).to(dtype);
  t.trace = torch::randn({n});
  t.step = torch::zeros({});
  return t;
}

StepSlot slot_of(const Toy& t) {
  StepSlot slot;
  slot.param = t.param;
  slot.grad = t.grad;
  slot.master = t.master;
  slot.comp = t.comp;
  slot.state[ToyRule::kTrace] = t.trace;
  slot.step = t.step;
  return slot;
}

// The rule's arithmetic in ATen (float32 tensors, float32 constants): the trace and the update.
std::pair<torch::Tensor, torch::Tensor> reference_update(const torch::Tensor& trace,
                                                         const torch::Tensor& grad32) {
  const auto lr = torch::tensor(static_cast<float>(kHyper.lr));
  const auto decay = torch::tensor(static_cast<float>(kHyper.decay));
  const auto next_trace = trace * decay + grad32;
  return {next_trace, -(next_trace * lr)};
}

}  // namespace

TEST_CASE("A rule defined outside the library's list steps float32 parameters as ATen computes it",
          "[optim][engine]") {
  // 3 parameters of different sizes: one pass over a list, as the engine runs a group.
  std::vector<Toy> toys{make_toy(torch::kFloat, 1000, 1), make_toy(torch::kFloat, 37, 2),
                        make_toy(torch::kFloat, 1 << 16, 3)};
  std::vector<torch::Tensor> want_param, want_trace;
  std::vector<StepSlot> slots;
  for (const Toy& t : toys) {
    const auto [trace, update] = reference_update(t.trace, t.grad);
    want_trace.push_back(trace);
    want_param.push_back(t.param + update);
    slots.push_back(slot_of(t));
  }
  StepArgs args;
  args.write_back = WriteBack::kRoundNearest;
  args.state_dtype = torch::kFloat;
  amp::optim::detail::run_rule_step_here<ToyRule>(slots, kHyper, args);
  for (size_t k = 0; k < toys.size(); ++k) {
    CHECK(torch::equal(toys[k].trace, want_trace[k]));
    CHECK(torch::equal(toys[k].param, want_param[k]));
    CHECK(toys[k].step.item<float>() == 1.0f);
  }
}

TEST_CASE("A rule defined outside the library's list gets every low-precision write-back",
          "[optim][engine]") {
  SECTION("bfloat16 with master weights: the float32 copy steps, the parameter is its rounding") {
    Toy t = make_toy(torch::kBFloat16, 513, 4);
    t.master = t.param.to(torch::kFloat) + 1e-3;  // a master copy the parameter cannot hold
    const auto [trace, update] = reference_update(t.trace, t.grad.to(torch::kFloat));
    const auto want_master = t.master + update;
    StepArgs args;
    args.write_back = WriteBack::kMasterWeights;
    amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(t)}, kHyper, args);
    CHECK(torch::equal(t.trace, trace));
    CHECK(torch::equal(t.master, want_master));
    CHECK(torch::equal(t.param, want_master.to(torch::kBFloat16)));
  }
  SECTION("float16 with Kahan summation: the update goes through the compensation") {
    Toy t = make_toy(torch::kHalf, 300, 5);
    t.comp = (torch::randn({300}) * 1e-4).to(torch::kHalf);
    const auto [trace, update] = reference_update(t.trace, t.grad.to(torch::kFloat));
    // comp += update; next = param + comp; comp += param - next, each rounded to float16.
    const auto c = (t.comp.to(torch::kFloat) + update).to(torch::kHalf).to(torch::kFloat);
    const auto next = (t.param.to(torch::kFloat) + c).to(torch::kHalf);
    const auto lost =
        (t.param.to(torch::kFloat) - next.to(torch::kFloat)).to(torch::kHalf).to(torch::kFloat);
    const auto want_comp = (c + lost).to(torch::kHalf);
    StepArgs args;
    args.write_back = WriteBack::kKahan;
    amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(t)}, kHyper, args);
    CHECK(torch::equal(t.param, next));
    CHECK(torch::equal(t.comp, want_comp));
  }
  SECTION("bfloat16 with stochastic rounding: each value rounds to one of its two neighbours") {
    Toy t = make_toy(torch::kBFloat16, 4096, 6);
    const auto [trace, update] = reference_update(t.trace, t.grad.to(torch::kFloat));
    const auto exact = t.param.to(torch::kFloat) + update;
    StepArgs args;
    args.write_back = WriteBack::kStochastic;
    args.seed = 11;
    amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(t)}, kHyper, args);
    // Truncation towards zero and the next bfloat16 away from zero bracket the exact value.
    const auto bits = exact.view(torch::kInt32);
    const auto down =
        torch::bitwise_and(bits, static_cast<int32_t>(0xFFFF0000)).view(torch::kFloat);
    const auto up =
        (bits + 0x10000).bitwise_and(static_cast<int32_t>(0xFFFF0000)).view(torch::kFloat);
    const auto got = t.param.to(torch::kFloat);
    CHECK(torch::logical_or(got == down, got == up).all().item<bool>());
    // Both neighbours occur: the rounding is not to nearest.
    CHECK((got == down).any().item<bool>());
    CHECK((got == up).any().item<bool>());
  }
}

TEST_CASE(
    "A rule defined outside the library's list unscales by GradScaler's scale and skips on "
    "its flag",
    "[optim][engine]") {
  SECTION("a scale of 1024: the rule reads g / 1024 and the gradient is written back unscaled") {
    Toy t = make_toy(torch::kFloat, 777, 7);
    const auto unscaled = t.grad / 1024.0f;
    const auto [trace, update] = reference_update(t.trace, unscaled);
    const auto want_param = t.param + update;
    StepArgs args;
    args.grad_scale = torch::full({}, 1024.0f);
    args.found_inf = torch::zeros({});
    amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(t)}, kHyper, args);
    CHECK(torch::equal(t.param, want_param));
    CHECK(torch::equal(t.grad, unscaled));
  }
  SECTION("an inf found: nothing changes, the step count included") {
    Toy t = make_toy(torch::kBFloat16, 100, 8);
    const auto param = t.param.clone(), grad = t.grad.clone(), trace = t.trace.clone();
    StepArgs args;
    args.grad_scale = torch::full({}, 2.0f);
    args.found_inf = torch::ones({});
    args.write_back = WriteBack::kRoundNearest;
    amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(t)}, kHyper, args);
    CHECK(torch::equal(t.param, param));
    CHECK(torch::equal(t.grad, grad));
    CHECK(torch::equal(t.trace, trace));
    CHECK(t.step.item<float>() == 0.0f);
  }
}

TEST_CASE("The engine refuses a step outside its legal matrix with the matrix's sentence",
          "[optim][engine]") {
  Toy t = make_toy(torch::kHalf, 10, 9);
  StepArgs args;
  args.write_back = WriteBack::kStochastic;
  CHECK_THROWS_WITH(amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(t)}, kHyper, args),
                    Catch::Contains("stochastic rounding writes bfloat16 parameters only"));
  Toy f = make_toy(torch::kFloat, 10, 10);
  args.write_back = WriteBack::kKahan;
  CHECK_THROWS_WITH(
      amp::optim::detail::run_rule_step_here<ToyRule>({slot_of(f)}, kHyper, args),
      Catch::Contains("float32 parameters keep float32 state and take their update as it is"));
  CHECK(torch::equal(f.step, torch::zeros({})));
}
