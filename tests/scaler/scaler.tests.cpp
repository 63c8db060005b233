// GradScaler's API and state machine: options, scaling, unscale_/step/update, every Python error.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include <amp/detail/option_fields.h>
#include <amp/grad_scaler.h>
#include <amp/info.h>

#include "scaler/validate.h"
#include "support/warnings.h"

#include "support/scaler_helpers.h"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// An optimizer whose step records the call and returns the closure's loss or a marker tensor.
class CountingOptimizer : public torch::optim::Optimizer {
 public:
  explicit CountingOptimizer(std::vector<torch::Tensor> params)
      : torch::optim::Optimizer(std::move(params),
                                std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    ++steps;
    return closure ? closure() : torch::full({}, 42.0);
  }
  int steps = 0;
};

}  // namespace

TEST_CASE("Default options equal torch.amp.GradScaler's defaults", "[scaler]") {
  GradScalerOptions options;
  CHECK(options.init_scale() == 65536.0);
  CHECK(options.growth_factor() == 2.0);
  CHECK(options.backoff_factor() == 0.5);
  CHECK(options.growth_interval() == 2000);
  CHECK(options.enabled());
  CHECK(options.hysteresis() == 1);
  CHECK_FALSE(options.consecutive_hysteresis());
  CHECK(options.min_scale() == 0.0);
  CHECK(options.max_scale() == kInf);
  CHECK_FALSE(options.track_counters());

  auto scaler = cpu_scaler(GradScalerOptions().init_scale(1024.0).growth_interval(7));
  CHECK(scaler.is_enabled());
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.get_growth_tracker() == 0);
  CHECK(scaler.get_growth_factor() == 2.0);
  CHECK(scaler.get_backoff_factor() == 0.5);
  CHECK(scaler.get_growth_interval() == 7);
  CHECK_FALSE(scaler.scale_tensor().defined());
}

TEST_CASE("The options table reads and writes every option field on its own", "[scaler]") {
  // Every field away from its default: each row must read its own field, not a neighbour's.
  const GradScalerOptions defaults;
  const GradScalerOptions changed = GradScalerOptions()
                                        .init_scale(2.0)
                                        .growth_factor(3.0)
                                        .backoff_factor(0.25)
                                        .growth_interval(7)
                                        .enabled(false)
                                        .hysteresis(4)
                                        .consecutive_hysteresis(true)
                                        .min_scale(0.5)
                                        .max_scale(1024.0)
                                        .at_min_scale(amp::MinScalePolicy::kThrow)
                                        .track_counters(true);
  const auto& fields = amp::detail::option_fields();
  // GradScalerOptions has 12 fields; found_inf_sync (a handle) is the one not in the table.
  REQUIRE(fields.size() == 11);
  std::set<std::string> names;
  for (const auto& field : fields) {
    INFO(field.name);
    names.insert(field.name);
    CHECK(field.get(changed) != field.get(defaults));
    // Writing one field into the defaults changes that field and no other.
    GradScalerOptions one = defaults;
    field.set(one, field.get(changed));
    for (const auto& other : fields) {
      INFO("other field " << other.name);
      CHECK(other.get(one) == (&other == &field ? other.get(changed) : other.get(defaults)));
    }
  }
  CHECK(names.size() == fields.size());
  CHECK(std::string(fields.front().name) == "enabled");
}

TEST_CASE("Out-of-range options are refused with a sentence naming the value", "[scaler]") {
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().growth_factor(1.0)),
                    Contains("The growth factor must be > 1.0. Got growth_factor=1"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().growth_factor(kInf)),
                    Contains("The growth factor must be > 1.0. Got growth_factor=inf"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().backoff_factor(1.0)),
                    Contains("The backoff factor must be < 1.0. Got backoff_factor=1"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().backoff_factor(0.0)),
                    Contains("pass a value in (0, 1)"));
  CHECK_THROWS_WITH(
      cpu_scaler(GradScalerOptions().init_scale(0.0)),
      Contains("The initial scale must be finite and > 0, within float32's normal range "
               "[1.17549e-38, 3.40282e+38] since the scale is kept in a float32 "
               "tensor. Got init_scale=0; pass a positive value such as 65536.0"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().init_scale(kNaN)),
                    Contains("Got init_scale=nan"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().init_scale(kInf)),
                    Contains("Got init_scale=inf"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().growth_interval(0)),
                    Contains("The growth interval must be >= 1. Got growth_interval=0"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().hysteresis(0)),
                    Contains("The hysteresis must be >= 1 and <= 2^31-1. Got hysteresis=0"));
  // The allowance lives in an int32 tensor: 2^31 would break every update().
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().hysteresis(int64_t{1} << 31)),
                    Contains("Got hysteresis=2147483648"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().min_scale(-1.0)),
                    Contains("The minimum scale must be finite and >= 0. Got min_scale=-1"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().max_scale(0.0)),
                    Contains("The maximum scale must be > 0. Got max_scale=0"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().min_scale(8.0).max_scale(4.0)),
                    Contains("min_scale must not exceed max_scale"));
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().max_scale(1024.0)),
                    Contains("The initial scale must lie in [min_scale, max_scale]. Got "
                             "init_scale=65536"));
  // As in Python, a disabled scaler checks nothing.
  CHECK_NOTHROW(cpu_scaler(GradScalerOptions().enabled(false).growth_factor(0.5)));
}

TEST_CASE("Setters validate like the constructor and keep the old value on error", "[scaler]") {
  auto scaler = cpu_scaler();
  scaler.set_growth_factor(3.0);
  scaler.set_backoff_factor(0.25);
  scaler.set_growth_interval(5);
  CHECK(scaler.get_growth_factor() == 3.0);
  CHECK(scaler.get_backoff_factor() == 0.25);
  CHECK(scaler.get_growth_interval() == 5);
  CHECK_THROWS_WITH(scaler.set_growth_factor(0.9), Contains("The growth factor must be > 1.0."));
  CHECK_THROWS_WITH(scaler.set_backoff_factor(1.5), Contains("The backoff factor must be < 1.0."));
  CHECK_THROWS_WITH(scaler.set_growth_interval(-3), Contains("Got growth_interval=-3"));
  CHECK(scaler.get_growth_factor() == 3.0);
  CHECK(scaler.get_backoff_factor() == 0.25);
  CHECK(scaler.get_growth_interval() == 5);
}

TEST_CASE("A CUDA scaler without CUDA warns and disables itself", "[scaler][no-gpu]") {
  amp_test::WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  GradScaler scaler;  // Python's default device is "cuda"
  // Python 2.14: "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."
  REQUIRE(collector.messages.size() == 1);
  CHECK_THAT(collector.messages[0],
             Contains("GradScaler is enabled for CUDA, but CUDA is not available.  Disabling."));
  CHECK_FALSE(scaler.is_enabled());
  CHECK_FALSE(scaler.options().enabled());
  CHECK(scaler.device_type() == c10::DeviceType::CUDA);
  CHECK(scaler.get_scale() == 1.0);
  GradScaler with_options(GradScalerOptions().init_scale(8.0));
  CHECK_FALSE(with_options.is_enabled());
  CHECK(collector.messages.size() == 2);
  // A scaler constructed disabled has nothing to warn about.
  GradScaler disabled(GradScalerOptions().enabled(false));
  CHECK(collector.messages.size() == 2);
}

TEST_CASE("A CUDA scaler is refused at construction by an amp built without CUDA kernels",
          "[scaler]") {
  // The check GradScaler's constructor runs when CUDA is available (this machine may have none).
  CHECK_NOTHROW(amp::detail::check_cuda_kernels_built(true));
  CHECK_THROWS_WITH(amp::detail::check_cuda_kernels_built(false),
                    Contains("this build of amp has no CUDA kernels (it was configured with "
                             "AMP_WITH_CUDA=OFF). Rebuild amp with -DAMP_WITH_CUDA=ON"));
  if (torch::cuda::is_available() && !amp::built_with_cuda()) {
    CHECK_THROWS_WITH(GradScaler(), Contains("AMP_WITH_CUDA=OFF"));
  }
}

TEST_CASE("A disabled scaler is a pure pass-through", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().enabled(false));
  auto param = make_param();
  CountingOptimizer optimizer({param});
  const auto loss = torch::full({}, 3.0);
  CHECK(scaler.scale(loss).is_same(loss));
  CHECK(scaler.scale(std::vector<torch::Tensor>{loss})[0].is_same(loss));
  set_grad(param, torch::full({4}, kInf));
  scaler.unscale_(optimizer);
  CHECK(torch::isinf(param.grad()).all().item<bool>());  // untouched
  auto result = scaler.step(optimizer, [] { return torch::full({}, 7.0); });
  CHECK(result.read_taken());
  CHECK(result.loss.item<double>() == 7.0);
  CHECK(optimizer.steps == 1);
  scaler.update();
  scaler.update(5.0);
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.get_growth_tracker() == 0);
  CHECK(scaler.state_dict().empty());
  CHECK_NOTHROW(scaler.load_state_dict(amp_test::make_state_dict()));
}

TEST_CASE("scale() multiplies by the scale and creates it on the first tensor's device",
          "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(4.0));
  const auto loss = torch::tensor({1.5f, -2.0f});
  const auto scaled = scaler.scale(loss);
  CHECK(torch::equal(scaled, torch::tensor({6.0f, -8.0f})));
  REQUIRE(scaler.scale_tensor().defined());
  CHECK(scaler.scale_tensor().dim() == 0);
  CHECK(scaler.scale_tensor().scalar_type() == torch::kFloat);
  CHECK(scaler.growth_tracker_tensor().scalar_type() == torch::kInt);
  CHECK(scaler.scale_tensor().device() == loss.device());

  // A half loss stays half (the 0-dim float scale does not promote it), as in Python.
  CHECK(scaler.scale(torch::ones({2}, torch::kHalf)).scalar_type() == torch::kHalf);
  CHECK(scaler.scale(torch::ones({2}, torch::kBFloat16)).scalar_type() == torch::kBFloat16);

  const auto list = scaler.scale(
      std::vector<torch::Tensor>{torch::full({}, 1.0), torch::full({2}, 0.5, torch::kDouble)});
  REQUIRE(list.size() == 2);
  CHECK(list[0].item<double>() == 4.0);
  CHECK(list[1].scalar_type() == torch::kDouble);
  CHECK(torch::equal(list[1], torch::full({2}, 2.0, torch::kDouble)));
  CHECK(scaler.scale(std::vector<torch::Tensor>{}).empty());
  CHECK_THROWS_WITH(scaler.scale(torch::Tensor()),
                    Contains("outputs must be a Tensor or an iterable of Tensors"));
  CHECK_THROWS_WITH(scaler.scale(std::vector<torch::Tensor>{torch::ones({}), torch::Tensor()}),
                    Contains("outputs must be a Tensor or an iterable of Tensors"));
}

TEST_CASE("Methods called before scale() fail with Python's message", "[scaler]") {
  auto scaler = cpu_scaler();
  auto param = make_param();
  torch::optim::SGD optimizer({param}, 0.1);
  const std::string fix =
      " but _scale is None.  This may indicate your script did not use scaler.scale(loss or "
      "outputs) earlier in the iteration.";
  CHECK_THROWS_WITH(scaler.unscale_(optimizer), Contains("Attempted unscale_" + fix));
  CHECK_THROWS_WITH(scaler.step(optimizer), Contains("Attempted step" + fix));
  CHECK_THROWS_WITH(scaler.update(), Contains("Attempted update" + fix));
  CHECK_THROWS_WITH(scaler.update(2.0), Contains("Attempted update" + fix));
  CHECK_THROWS_WITH(scaler.update(torch::full({}, 2.0)), Contains("Attempted update" + fix));
}

TEST_CASE("The per-optimizer state machine refuses what Python refuses", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(2.0));
  auto param = make_param();
  torch::optim::SGD optimizer({param}, 0.1);
  scaler.scale(torch::ones({}));
  set_grad(param, torch::full({4}, 2.0));

  SECTION("unscale_ twice") {
    scaler.unscale_(optimizer);
    CHECK_THROWS_WITH(
        scaler.unscale_(optimizer),
        Contains("unscale_() has already been called on this optimizer since the last update()."));
    // The first unscale_ happened once only.
    CHECK(torch::equal(param.grad(), torch::ones({4})));
  }
  SECTION("unscale_ after step") {
    scaler.step(optimizer);
    CHECK_THROWS_WITH(scaler.unscale_(optimizer),
                      Contains("unscale_() is being called after step()."));
  }
  SECTION("step twice") {
    CHECK(scaler.step(optimizer).read_taken());
    CHECK_THROWS_WITH(scaler.step(optimizer),
                      Contains("step() has already been called since the last update()."));
  }
  SECTION("update resets every optimizer to READY") {
    scaler.step(optimizer);
    scaler.update();
    scaler.scale(torch::ones({}));
    set_grad(param, torch::full({4}, 2.0));
    CHECK_NOTHROW(scaler.unscale_(optimizer));
    CHECK_NOTHROW(scaler.step(optimizer));
  }
  SECTION("update after unscale_ alone is allowed") {
    scaler.unscale_(optimizer);
    CHECK_NOTHROW(scaler.update());
    CHECK(scaler.get_growth_tracker() == 1);
  }
  SECTION("stage() and found_inf_per_device() show the state machine to optimizers") {
    CHECK(scaler.stage(optimizer) == amp::OptimizerStage::kReady);
    CHECK(scaler.found_inf_per_device(optimizer).empty());
    set_grad(param, torch::tensor({1.0f, INFINITY, 2.0f, 3.0f}));
    scaler.unscale_(optimizer);
    CHECK(scaler.stage(optimizer) == amp::OptimizerStage::kUnscaled);
    const auto flags = scaler.found_inf_per_device(optimizer);
    REQUIRE(flags.size() == 1);
    CHECK(flags[0].first == torch::Device(torch::kCPU));
    CHECK(flags[0].second.item<float>() == 1.0f);
    CHECK_FALSE(scaler.step(optimizer).read_taken());
    CHECK(scaler.stage(optimizer) == amp::OptimizerStage::kStepped);
    scaler.update();
    CHECK(scaler.stage(optimizer) == amp::OptimizerStage::kReady);
    CHECK(scaler.found_inf_per_device(optimizer).empty());
  }
  SECTION("a closure is refused when enabled") {
    CHECK_THROWS_WITH(scaler.step(optimizer, [] { return torch::ones({}); }),
                      Contains("Closure use is not currently supported if GradScaler is enabled."));
  }
}

TEST_CASE("update() and step() with nothing recorded fail with Python's messages", "[scaler]") {
  auto scaler = cpu_scaler();
  auto param = make_param();  // never gets a grad
  torch::optim::SGD optimizer({param}, 0.1);
  scaler.scale(torch::ones({}));
  CHECK_THROWS_WITH(scaler.update(), Contains("No inf checks were recorded prior to update."));
  CHECK_THROWS_WITH(scaler.step(optimizer),
                    Contains("No inf checks were recorded for this optimizer."));
  // unscale_ with no grads still recorded nothing, so update() still refuses.
  CHECK_THROWS_WITH(scaler.update(), Contains("No inf checks were recorded prior to update."));
}

TEST_CASE("unscale_ refuses float16 gradients and changes nothing", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(2.0));
  auto p32 = make_param();
  auto p16 = torch::ones({2}, torch::kHalf).requires_grad_(true);
  torch::optim::SGD optimizer({p32, p16}, 0.1);
  scaler.scale(torch::ones({}));
  set_grad(p32, torch::full({4}, 4.0));
  set_grad(p16, torch::full({2}, 4.0, torch::kHalf));
  CHECK_THROWS_AS(scaler.unscale_(optimizer), c10::ValueError);
  CHECK_THROWS_WITH(scaler.unscale_(optimizer), Contains("Attempting to unscale FP16 gradients."));
  CHECK_THROWS_WITH(scaler.step(optimizer), Contains("Attempting to unscale FP16 gradients."));
  CHECK(torch::equal(p32.grad(), torch::full({4}, 4.0)));  // nothing half-done
}

TEST_CASE("step() unscales, steps on finite grads and skips on inf or NaN", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(4.0));
  auto param = make_param(3);
  torch::optim::SGD optimizer({param}, 1.0);
  scaler.scale(torch::ones({}));

  set_grad(param, torch::tensor({4.0f, 8.0f, -2.0f}));
  auto result = scaler.step(optimizer);
  CHECK(result.read_taken());
  CHECK(static_cast<bool>(result));
  CHECK(torch::equal(param.grad(), torch::tensor({1.0f, 2.0f, -0.5f})));
  CHECK(torch::equal(param.detach(), torch::tensor({0.0f, -1.0f, 1.5f})));
  scaler.update();
  CHECK(scaler.get_scale() == 4.0);
  CHECK(scaler.get_growth_tracker() == 1);

  double expected_scale = 4.0;
  for (const float bad : {INFINITY, -INFINITY, NAN}) {
    const auto before = param.detach().clone();
    set_grad(param, torch::tensor({4.0f, bad, 2.0f}));
    INFO("bad gradient " << bad);
    result = scaler.step(optimizer);
    CHECK_FALSE(result.read_taken());
    CHECK_FALSE(result.loss.defined());
    CHECK(torch::equal(param.detach(), before));
    scaler.update();
    expected_scale /= 2.0;
    CHECK(scaler.get_scale() == expected_scale);
    CHECK(scaler.get_growth_tracker() == 0);
  }
}

TEST_CASE("The update rule follows PyTorch's own sequence", "[scaler]") {
  // growth 2, backoff 0.25, interval 2 from scale 4: (1, 4) -> (0, 8) -> inf -> (0, 2).
  auto scaler = cpu_scaler(
      GradScalerOptions().init_scale(4.0).growth_factor(2.0).backoff_factor(0.25).growth_interval(
          2));
  auto param = make_param(1);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.scale(torch::ones({}));
  auto iteration = [&](float grad) {
    set_grad(param, torch::full({1}, grad));
    scaler.step(optimizer);
    scaler.update();
    return std::pair<int64_t, double>(scaler.get_growth_tracker(), scaler.get_scale());
  };
  using Expected = std::pair<int64_t, double>;
  CHECK(iteration(1.0f) == Expected(1, 4.0));
  CHECK(iteration(1.0f) == Expected(0, 8.0));
  CHECK(iteration(INFINITY) == Expected(0, 2.0));
}

TEST_CASE("Backing off stops at float32's smallest normal scale, so parameters stay finite",
          "[scaler]") {
  // torch.amp backs off to denormals and 0; then 1/scale is inf, zero gradients unscale to NaN
  // without being flagged, and the next step writes NaN into the parameters (checked in the
  // venv: backoff_factor 1e-50, one overflow, then SGD makes every parameter NaN).
  const float smallest = std::numeric_limits<float>::min();
  for (const double backoff : {1e-50, 0.5}) {
    INFO("backoff_factor " << backoff);
    auto scaler = cpu_scaler(GradScalerOptions().init_scale(1024.0).backoff_factor(backoff));
    auto param = make_param(2);
    torch::optim::SGD optimizer({param}, 0.1);
    for (int overflow = 0; overflow < 200; ++overflow) {
      scaler.scale((param * 2).sum()).backward();
      param.mutable_grad()[0] = INFINITY;
      scaler.step(optimizer);
      scaler.update();
      optimizer.zero_grad();
    }
    CHECK(scaler.get_scale() == static_cast<double>(smallest));
    // A clean step at the floor: the scaled loss's gradients unscale to finite values.
    scaler.scale((param * 0).sum()).backward();
    scaler.step(optimizer);
    scaler.update();
    CHECK(torch::equal(param, torch::ones({2})));
    CHECK(scaler.get_scale() == static_cast<double>(smallest));
  }
}

TEST_CASE("Growth never reaches inf, starting from 1e38", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(1e38).growth_interval(1));
  auto param = make_param(1);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.scale(torch::ones({}));
  for (int i = 0; i < 4; ++i) {
    set_grad(param, torch::ones({1}));
    scaler.step(optimizer);
    scaler.update();
    CHECK(std::isfinite(scaler.get_scale()));
  }
  CHECK(scaler.get_scale() ==
        static_cast<double>(static_cast<float>(static_cast<float>(1e38) * 2.0)));
}

TEST_CASE("update(new_scale) sets the scale, keeps the tracker and checks tensors as Python",
          "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(8.0).growth_interval(10));
  amp_test::clean_iteration(scaler);
  REQUIRE(scaler.get_growth_tracker() == 1);

  scaler.update(3.0);
  CHECK(scaler.get_scale() == 3.0);
  CHECK(scaler.get_growth_tracker() == 1);
  scaler.update(torch::full({1}, 5.0, torch::kDouble));
  CHECK(scaler.get_scale() == 5.0);
  CHECK(scaler.get_growth_tracker() == 1);

  const std::string reason =
      "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor "
      "with requires_grad=False.";
  CHECK_THROWS_WITH(scaler.update(torch::ones({2})), Contains(reason));
  CHECK_THROWS_WITH(scaler.update(torch::ones({}, torch::kFloat).requires_grad_(true)),
                    Contains(reason));
  CHECK_THROWS_WITH(scaler.update(torch::ones({}, torch::TensorOptions().device(torch::kMeta))),
                    Contains(reason));
  CHECK_THROWS_WITH(scaler.update(-1.0), Contains("new_scale must be finite and > 0"));
  CHECK(scaler.get_scale() == 5.0);
}

TEST_CASE("Undefined grads are skipped and mixed dtypes share one found_inf", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(2.0));
  auto p32 = make_param(2);
  auto p64 = torch::ones({2}, torch::kDouble).requires_grad_(true);
  auto pbf = torch::ones({2}, torch::kBFloat16).requires_grad_(true);
  auto none = make_param(2);
  torch::optim::SGD optimizer({p32, none, p64, pbf}, 0.0);
  scaler.scale(torch::ones({}));
  set_grad(p32, torch::full({2}, 2.0));
  set_grad(p64, torch::full({2}, 6.0, torch::kDouble));
  set_grad(pbf, torch::tensor({2.0f, INFINITY}, torch::kBFloat16));
  const auto flags = scaler.check_inf_per_device(optimizer);
  REQUIRE(flags.size() == 1);
  CHECK(flags[0].second.item<float>() == 1.0f);
  // check_inf_per_device does not unscale; a fresh iteration unscales every dtype.
  CHECK(torch::equal(p32.grad(), torch::full({2}, 2.0)));
  scaler.update(2.0);
  set_grad(pbf, torch::full({2}, 8.0, torch::kBFloat16));
  scaler.unscale_(optimizer);
  CHECK(torch::equal(p32.grad(), torch::ones({2})));
  CHECK(torch::equal(p64.grad(), torch::full({2}, 3.0, torch::kDouble)));
  CHECK(torch::equal(pbf.grad(), torch::full({2}, 4.0, torch::kBFloat16)));
  CHECK_FALSE(none.grad().defined());
}

TEST_CASE("Sparse gradients are unscaled through their values, fp16 ones coalesced first",
          "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(2.0));
  auto param = make_param(4);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.scale(torch::ones({}));
  const auto indices = torch::tensor({{0, 2}}, torch::kLong);
  param.mutable_grad() = torch::sparse_coo_tensor(indices, torch::tensor({4.0f, 6.0f}), {4});
  scaler.unscale_(optimizer);
  CHECK(torch::equal(param.grad().to_dense(), torch::tensor({2.0f, 0.0f, 3.0f, 0.0f})));

  // Two duplicate fp16 values, each finite, overflow only once summed by coalescing.
  auto half = torch::ones({4}, torch::kHalf).requires_grad_(true);
  torch::optim::SGD half_optimizer({half}, 0.0);
  const auto duplicate = torch::tensor({{1, 1}}, torch::kLong);
  half.mutable_grad() =
      torch::sparse_coo_tensor(duplicate, torch::tensor({60000.0, 60000.0}, torch::kHalf), {4});
  REQUIRE_FALSE(half.grad().is_coalesced());
  const auto flags = scaler.check_inf_per_device(half_optimizer);
  CHECK(half.grad().is_coalesced());
  CHECK(flags.at(0).second.item<float>() == 1.0f);
}

TEST_CASE("Two optimizers' overflows combine into one update", "[scaler]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(8.0));
  auto a = make_param(1);
  auto b = make_param(1);
  torch::optim::SGD opt_a({a}, 1.0);
  torch::optim::SGD opt_b({b}, 1.0);
  scaler.scale(torch::ones({}));
  set_grad(a, torch::full({1}, 8.0));
  set_grad(b, torch::full({1}, INFINITY));
  CHECK(scaler.step(opt_a).read_taken());
  CHECK_FALSE(scaler.step(opt_b).read_taken());
  CHECK(a.item<float>() == 0.0f);
  CHECK(b.item<float>() == 1.0f);
  scaler.update();
  CHECK(scaler.get_scale() == 4.0);
}

TEST_CASE("Any torch::optim optimizer works, and step() returns the optimizer's result",
          "[scaler]") {
  auto param = make_param(3);
  auto grad = torch::tensor({1.0f, -2.0f, 0.5f});
  auto run = [&](torch::optim::Optimizer& optimizer) {
    auto scaler = cpu_scaler(GradScalerOptions().init_scale(1024.0));
    scaler.scale(torch::ones({}));
    const auto before = param.detach().clone();
    set_grad(param, grad * 1024.0);
    const auto result = scaler.step(optimizer);
    CHECK(result.read_taken());
    CHECK(torch::equal(param.grad(), grad));
    CHECK_FALSE(torch::equal(param.detach(), before));
    return result;
  };
  torch::optim::SGD sgd({param}, torch::optim::SGDOptions(0.1).momentum(0.9));
  run(sgd);
  torch::optim::Adam adam({param}, 0.1);
  run(adam);
  torch::optim::AdamW adamw({param}, 0.1);
  run(adamw);
  torch::optim::RMSprop rmsprop({param}, 0.1);
  run(rmsprop);
  torch::optim::Adagrad adagrad({param}, 0.1);
  run(adagrad);

  CountingOptimizer custom({param});
  auto scaler = cpu_scaler();
  scaler.scale(torch::ones({}));
  set_grad(param, grad);
  const auto result = scaler.step(custom);
  CHECK(custom.steps == 1);
  REQUIRE(result.loss.defined());
  CHECK(result.loss.item<double>() == 42.0);
}

TEST_CASE("LBFGS needs a closure, which an enabled scaler refuses and a disabled one passes",
          "[scaler]") {
  auto param = make_param(2);
  torch::optim::LBFGS lbfgs({param}, torch::optim::LBFGSOptions(0.1).max_iter(1));
  auto closure = [&] {
    lbfgs.zero_grad();
    auto loss = (param * param).sum();
    loss.backward();
    return loss;
  };
  auto enabled = cpu_scaler();
  enabled.scale(torch::ones({}));
  CHECK_THROWS_WITH(enabled.step(lbfgs, closure),
                    Contains("Closure use is not currently supported if GradScaler is enabled."));
  auto disabled = cpu_scaler(GradScalerOptions().enabled(false));
  const auto result = disabled.step(lbfgs, closure);
  CHECK(result.read_taken());
  CHECK(result.loss.item<float>() == 2.0f);
}

TEST_CASE("A parameter listed twice is unscaled once and counted once in the clipping norm",
          "[scaler]") {
  // LibTorch's Module::parameters() lists a submodule registered under two names twice; an
  // optimizer built from it holds the same tensor twice. Unscaling it twice would divide its
  // gradient by scale^2.
  auto shared = torch::nn::Linear(3, 2);
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("encoder", shared);
  model->register_module("decoder", shared);
  REQUIRE(model->parameters().size() == 4);
  torch::optim::SGD optimizer(model->parameters(), 0.0);
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(8.0));
  scaler.scale(torch::ones({}));
  set_grad(shared->weight, torch::full({2, 3}, 8.0));
  set_grad(shared->bias, torch::full({2}, 8.0));
  scaler.unscale_(optimizer);
  CHECK(torch::equal(shared->weight.grad(), torch::ones({2, 3})));
  CHECK(torch::equal(shared->bias.grad(), torch::ones({2})));
  scaler.update();

  // The norm of unscale_and_clip_ sees each gradient once: sqrt(6 + 2) ones.
  scaler.scale(torch::ones({}));
  set_grad(shared->weight, torch::full({2, 3}, 8.0));
  set_grad(shared->bias, torch::full({2}, 8.0));
  const double norm = scaler.unscale_and_clip_(optimizer, 1000.0).item<double>();
  CHECK(norm == Approx(std::sqrt(8.0)).epsilon(1e-6));
  CHECK(torch::equal(shared->bias.grad(), torch::ones({2})));
}
