// amp::fp8 on the CPU: the float8 region and its threads, Float8Linear against torch::nn::Linear,
// convert_to_float8_training on module trees and containers, recipes and their errors, Transformer
// Engine's delayed-scaling rule step by step, checkpoints, and GradScaler and autocast with float8.
// The bit-for-bit comparisons with torchao are in tests/parity/fp8_parity.py.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <amp/archive.h>
#include <amp/autocast.h>
#include <amp/fp8.h>
#include <amp/low_precision.h>

#include "fp8/scaling.h"
#include "fp8_helpers.h"
#include "support/temp_dir.h"

using amp::fp8::Float8LinearImpl;
using Catch::Matchers::Contains;

namespace {

struct Grads {
  torch::Tensor output, input, weight, bias;
};

Grads run(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
          const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& x) {
  if (weight.grad().defined()) weight.mutable_grad().reset();
  if (bias.defined() && bias.grad().defined()) bias.mutable_grad().reset();
  auto input = x.detach().clone().requires_grad_(true);
  auto output = forward(input);
  output.square().sum().backward();
  return {output.detach(), input.grad(), weight.grad().clone(),
          bias.defined() ? bias.grad().clone() : torch::Tensor()};
}

// False (with a warning) for a rowwise recipe on a LibTorch whose CPU emulation cannot run it;
// the test "A rowwise layer on a CPU without rowwise scales says so" covers that case.
bool runs_here(const std::string& recipe) {
  if (recipe.rfind("rowwise", 0) != 0 || amp_test::cpu_takes_rowwise_scales()) return true;
  WARN("not run: this LibTorch's CPU at::_scaled_mm takes tensorwise scales only");
  return false;
}

// A module holding its Linear as a member handle, the usual C++ pattern.
struct WithMember : torch::nn::Module {
  WithMember() { fc = register_module("fc", torch::nn::Linear(4, 3)); }
  torch::nn::Linear fc{nullptr};
};

}  // namespace

TEST_CASE("Outside a float8 region Float8Linear is torch::nn::Linear, bit for bit", "[fp8]") {
  torch::manual_seed(5);
  torch::nn::Linear linear(24, 10);
  torch::manual_seed(5);
  Float8Linear layer(24, 10);
  // Same initialisation from the same seed.
  CHECK(same_bytes(layer->weight, linear->weight));
  CHECK(same_bytes(layer->bias, linear->bias));
  const auto x = torch::randn({7, 24});
  const auto expected =
      run([&](const torch::Tensor& in) { return linear(in); }, linear->weight, linear->bias, x);
  const auto actual =
      run([&](const torch::Tensor& in) { return layer(in); }, layer->weight, layer->bias, x);
  CHECK(same_bytes(actual.output, expected.output));
  CHECK(same_bytes(actual.input, expected.input));
  CHECK(same_bytes(actual.weight, expected.weight));
  CHECK(same_bytes(actual.bias, expected.bias));
  // The state dict is Linear's.
  CHECK(layer->named_parameters().keys() == linear->named_parameters().keys());
  CHECK(layer->named_buffers().size() == 0);
}

TEST_CASE("Inside a float8 region the three GEMMs are float8: close to Linear, not equal",
          "[fp8]") {
  const auto recipe =
      GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed");
  CAPTURE(recipe);
  if (!runs_here(recipe)) return;
  torch::manual_seed(6);
  Float8Linear layer(Float8LinearOptions(32, 16).recipe(Recipe::from_name(recipe)));
  const auto x = torch::randn({2, 8, 32});
  const auto reference = run(
      [&](const torch::Tensor& in) {
        return torch::nn::functional::linear(in, layer->weight, layer->bias);
      },
      layer->weight, layer->bias, x);
  Grads fp8;
  {
    Float8AutocastGuard float8;
    // The delayed recipe's first cast uses scale 1; its second uses the recorded amaxes.
    if (recipe == "delayed")
      run([&](const torch::Tensor& in) { return layer(in); }, layer->weight, layer->bias, x);
    fp8 = run([&](const torch::Tensor& in) { return layer(in); }, layer->weight, layer->bias, x);
  }
  CHECK(fp8.output.sizes() == reference.output.sizes());
  CHECK(fp8.output.scalar_type() == torch::kFloat);
  for (const auto& [a, b] :
       std::vector<std::pair<torch::Tensor, torch::Tensor>>{{fp8.output, reference.output},
                                                            {fp8.input, reference.input},
                                                            {fp8.weight, reference.weight},
                                                            {fp8.bias, reference.bias}}) {
    CHECK_FALSE(torch::equal(a, b));
    const double error = ((a - b).norm() / b.norm()).item<double>();
    CHECK(error < 0.1);  // e4m3 keeps 3 mantissa bits, e5m2 two
  }
}

TEST_CASE("The float8 region nests, restores what it found and belongs to its thread", "[fp8]") {
  CHECK_FALSE(amp::fp8::is_float8_enabled());
  {
    Float8AutocastGuard outer;
    CHECK(amp::fp8::is_float8_enabled());
    {
      Float8AutocastGuard off(false);
      CHECK_FALSE(amp::fp8::is_float8_enabled());
      {
        Float8AutocastGuard on_again;
        CHECK(amp::fp8::is_float8_enabled());
      }
      CHECK_FALSE(amp::fp8::is_float8_enabled());
    }
    CHECK(amp::fp8::is_float8_enabled());
    bool seen_in_thread = true;
    std::thread([&] { seen_in_thread = amp::fp8::is_float8_enabled(); }).join();
    CHECK_FALSE(seen_in_thread);  // a new thread starts outside
  }
  CHECK_FALSE(amp::fp8::is_float8_enabled());
}

TEST_CASE("A backward follows its forward's choice, inside or outside the region", "[fp8]") {
  torch::manual_seed(7);
  Float8Linear layer(16, 16);
  const auto x = torch::randn({4, 16}, torch::requires_grad());
  auto grads_with_backward = [&](bool backward_in_region) {
    layer->zero_grad();
    torch::Tensor loss;
    {
      Float8AutocastGuard float8;
      loss = layer(x).square().sum();
      if (backward_in_region) loss.backward();
    }
    if (!backward_in_region) loss.backward();
    return layer->weight.grad().clone();
  };
  const auto inside = grads_with_backward(true);
  const auto outside = grads_with_backward(false);
  CHECK(same_bytes(inside, outside));
  // A forward outside the region gives Linear's gradient even when backward runs inside one.
  layer->zero_grad();
  auto loss = layer(x).square().sum();
  {
    Float8AutocastGuard float8;
    loss.backward();
  }
  auto plain = layer->weight.grad().clone();
  layer->zero_grad();
  torch::nn::functional::linear(x, layer->weight, layer->bias).square().sum().backward();
  CHECK(same_bytes(plain, layer->weight.grad()));
  CHECK_FALSE(torch::equal(plain, inside));
}

TEST_CASE("convert_to_float8_training swaps Linear layers in module trees and containers",
          "[fp8]") {
  torch::manual_seed(8);
  auto root = std::make_shared<torch::nn::Module>();
  auto seq = root->register_module(
      "seq", torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                   torch::nn::Linear(16, 16)));
  auto block = root->register_module("block", std::make_shared<torch::nn::Module>());
  block->register_module("proj", torch::nn::Linear(16, 16));
  auto list = root->register_module("list", torch::nn::ModuleList(torch::nn::Linear(16, 16)));
  auto dict = root->register_module(
      "dict",
      torch::nn::ModuleDict(torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>(
          {{"proj", torch::nn::Linear(16, 16).ptr()}, {"head", torch::nn::Linear(16, 4).ptr()}})));
  const auto weight_before = root->named_parameters()["seq.0.weight"];
  const auto x = torch::randn({4, 8});
  const auto before = seq->forward(x);

  std::vector<std::string> seen;
  const auto converted = amp::fp8::convert_to_float8_training(
      *root, Recipe::tensorwise(),
      [&](const std::string& name, const torch::nn::LinearImpl& linear) {
        seen.push_back(name);
        return linear.options.out_features() != 4;  // keep the head in high precision
      });
  CHECK(seen == std::vector<std::string>{"seq.0", "seq.2", "block.proj", "list.0", "dict.proj",
                                         "dict.head"});
  CHECK(converted ==
        std::vector<std::string>{"seq.0", "seq.2", "block.proj", "list.0", "dict.proj"});
  // The registry and the containers hold the new layers; the parameters are the same tensors.
  const auto named = root->named_modules();
  for (const auto& name : converted) {
    INFO(name);
    REQUIRE(named[name]->as<Float8LinearImpl>() != nullptr);
    CHECK(named[name]->as<Float8LinearImpl>()->qualified_name() == name);
  }
  CHECK(named["dict.head"]->as<torch::nn::LinearImpl>() != nullptr);
  CHECK(seq->ptr(0)->as<Float8LinearImpl>() != nullptr);
  CHECK(seq->ptr(2)->as<Float8LinearImpl>() != nullptr);
  CHECK(list->ptr(0)->as<Float8LinearImpl>() != nullptr);
  CHECK((*dict)["proj"]->as<Float8LinearImpl>() != nullptr);
  CHECK((*dict)["head"]->as<torch::nn::LinearImpl>() != nullptr);
  CHECK(root->named_parameters()["seq.0.weight"].unsafeGetTensorImpl() ==
        weight_before.unsafeGetTensorImpl());
  CHECK(root->named_parameters().size() == 12);

  // Sequential's forward runs the new layers: the same output outside the region, float8 inside.
  CHECK(same_bytes(seq->forward(x), before));
  {
    Float8AutocastGuard float8;
    CHECK_FALSE(torch::equal(seq->forward(x), before));
  }
  // A second conversion finds nothing left to convert.
  CHECK(
      amp::fp8::convert_to_float8_training(
          *root, Recipe::tensorwise(),
          [](const std::string& name, const torch::nn::LinearImpl&) { return name != "dict.head"; })
          .empty());
}

TEST_CASE("convert_to_float8_training refuses a Linear it cannot swap, and changes nothing",
          "[fp8]") {
  auto module = std::make_shared<WithMember>();
  auto extra = module->register_module("plain", torch::nn::Sequential(torch::nn::Linear(3, 3)));
  CHECK_THROWS_WITH(amp::fp8::convert_to_float8_training(*module),
                    Contains("the Linear 'fc' is also held outside the module tree") &&
                        Contains("Declare the member as amp::fp8::Float8Linear") &&
                        Contains("Nothing was converted."));
  CHECK(module->named_modules()["plain.0"]->as<torch::nn::LinearImpl>() != nullptr);
  // Leaving it out with the filter converts the rest.
  const auto converted = amp::fp8::convert_to_float8_training(
      *module, Recipe::tensorwise(),
      [](const std::string& name, const torch::nn::LinearImpl&) { return name != "fc"; });
  CHECK(converted == std::vector<std::string>{"plain.0"});
}

TEST_CASE("Float8Linear and Recipe refuse bad input with a sentence", "[fp8]") {
  Float8Linear layer(8, 4);
  Float8AutocastGuard float8;
  CHECK_THROWS_WITH(layer(torch::randn({2, 8}, torch::kDouble)),
                    Contains("Float8Linear (in_features=8, out_features=4): the input must be "
                             "float32, bfloat16 or float16 to be cast to float8. Got Double."));
  CHECK_THROWS_WITH(layer(torch::randn({2, 5})),
                    Contains("the input's last dimension must be in_features=8. Got an input of "
                             "shape [2, 5]."));
  CHECK_THROWS_WITH(Recipe::from_name("blockwise"),
                    Contains("unknown recipe name 'blockwise'; use tensorwise, rowwise, "
                             "rowwise_with_gw_hp or delayed."));
  auto mixed = Recipe::tensorwise();
  mixed.weight.enabled = false;
  CHECK_THROWS_WITH(Float8Linear(Float8LinearOptions(8, 4).recipe(mixed)),
                    Contains("the output GEMM has input in float8 but weight in high precision"));
  auto two_dtypes = Recipe::tensorwise();
  two_dtypes.input_for_grad_weight.dtype = torch::kFloat8_e5m2;
  CHECK_THROWS_WITH(two_dtypes.validate(), Contains("input is cast to Float8_e4m3fn for one GEMM"));
  auto not_fp8 = Recipe::tensorwise();
  not_fp8.grad_output.dtype = torch::kBFloat16;
  CHECK_THROWS_WITH(
      not_fp8.validate(),
      Contains("grad_output.dtype must be Float8_e4m3fn or Float8_e5m2. Got BFloat16."));
  auto rowwise_delayed = Recipe::delayed();
  rowwise_delayed.input.granularity = rowwise_delayed.input_for_grad_weight.granularity =
      amp::fp8::Granularity::rowwise;
  CHECK_THROWS_WITH(rowwise_delayed.validate(),
                    Contains("the delayed recipe casts every operand tensorwise"));
  CHECK_THROWS_WITH(
      Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(0)).validate(),
      Contains("amax_history_len must be at least 1. Got 0."));
  CHECK_THROWS_WITH(Recipe::delayed(amp::fp8::DelayedScalingOptions().margin(-1)).validate(),
                    Contains("margin must be in [0, 126]. Got -1."));
}

TEST_CASE("Delayed scaling follows Transformer Engine's rule cast by cast", "[fp8]") {
  using amp::fp8::detail::cast_delayed;
  amp::fp8::detail::DelayedState state{torch::zeros({3}), torch::ones({})};
  auto options = amp::fp8::DelayedScalingOptions().amax_history_len(3);
  const auto e4m3 = torch::kFloat8_e4m3fn;
  auto cast_amax = [&](float amax, float other = 0.5f) {
    return cast_delayed(torch::tensor({other, -amax}), e4m3, state, options);
  };
  auto history = [&] {
    return std::vector<float>(state.amax_history.data_ptr<float>(),
                              state.amax_history.data_ptr<float>() + 3);
  };
  auto scale = [&] { return state.scale.item<float>(); };

  // The first cast uses scale 1: -600 saturates to -448.
  auto first = cast_amax(600.0f);
  CHECK(first.scale.item<float>() == 1.0f);
  CHECK(first.data.to(torch::kFloat)[1].item<float>() == -448.0f);
  CHECK(history() == std::vector<float>{0, 0, 600});
  CHECK(scale() == 448.0f / 600.0f);
  // The next cast uses that scale; a zero amax keeps the scale (max over the history is 600).
  auto second = cast_delayed(torch::zeros({4}), e4m3, state, options);
  CHECK(second.scale.item<float>() == 448.0f / 600.0f);
  CHECK(history() == std::vector<float>{0, 600, 0});
  CHECK(scale() == 448.0f / 600.0f);
  // An inf amax keeps the scale for as long as it stays in the history (three casts).
  cast_amax(std::numeric_limits<float>::infinity());
  CHECK(history() == std::vector<float>{0, 0, INFINITY});
  CHECK(scale() == 448.0f / 600.0f);
  cast_amax(2.0f);
  CHECK(scale() == 448.0f / 600.0f);
  cast_amax(4.0f);
  CHECK(history() == std::vector<float>{0, 2, 4});
  CHECK(scale() == 448.0f / 600.0f);
  cast_amax(1.0f);
  CHECK(history() == std::vector<float>{0, 4, 1});
  CHECK(scale() == 112.0f);  // max(2, 4, 1) = 4 → 448 / 4
  // NaN is ignored by the amax, as by Transformer Engine's fmaxf.
  cast_delayed(torch::tensor({NAN, 3.0f}), e4m3, state, options);
  CHECK(history() == std::vector<float>{0, 1, 3});
  CHECK(scale() == 112.0f);
  // most_recent and margin: (448 / 2^2) / 8 = 14.
  options.amax_compute_algo(amp::fp8::AmaxComputeAlgo::most_recent).margin(2);
  cast_amax(8.0f, 0.0f);
  CHECK(scale() == 14.0f);
  // A scale too large for float32 becomes FLT_MAX.
  cast_amax(1e-38f, 0.0f);
  CHECK(scale() == FLT_MAX);
}

TEST_CASE("A delayed-scaling checkpoint resumes bit for bit", "[fp8]") {
  amp_test::TempDir dir("fp8_checkpoint");
  const auto path = (dir.path() / "layer.pt").string();
  auto make = [] {
    torch::manual_seed(9);
    return Float8Linear(Float8LinearOptions(16, 8).recipe(
        Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(5))));
  };
  auto train = [](Float8Linear& layer, int from, int to) {
    torch::optim::SGD opt(layer->parameters(), 0.05);
    Float8AutocastGuard float8;
    for (int step = from; step < to; ++step) {
      opt.zero_grad();
      torch::manual_seed(100 + step);
      layer(torch::randn({4, 16}) * (step + 1)).square().mean().backward();
      opt.step();
    }
  };
  auto straight = make();
  train(straight, 0, 6);

  auto first = make();
  train(first, 0, 3);
  torch::save(first, path);
  auto resumed = make();
  amp::load(resumed, path);
  CHECK(resumed->named_buffers().size() == 6);
  train(resumed, 3, 6);
  for (const auto& item : straight->named_parameters()) {
    CHECK(same_bytes(item.value(), resumed->named_parameters()[item.key()]));
  }
  for (const auto& item : straight->named_buffers()) {
    INFO(item.key());
    CHECK(same_bytes(item.value(), resumed->named_buffers()[item.key()]));
  }
  // The histories did record: a fresh layer's buffers differ.
  CHECK_FALSE(torch::equal(make()->named_buffers()["scale_input"],
                           resumed->named_buffers()["scale_input"]));
}

TEST_CASE("A loss scale does not change dynamic float8 gradients beyond the scale itself",
          "[fp8]") {
  // grad_output's own scale absorbs the loss scale: for a power of two the float8 bits are the
  // same and the GEMMs' results are exactly S times larger, so unscaling restores them.
  const auto recipe = GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp");
  CAPTURE(recipe);
  if (!runs_here(recipe)) return;
  torch::manual_seed(10);
  Float8Linear layer(Float8LinearOptions(32, 16).recipe(Recipe::from_name(recipe)));
  const auto x = torch::randn({8, 32});
  auto grad_with_loss_scale = [&](double loss_scale) {
    layer->zero_grad();
    Float8AutocastGuard float8;
    (layer(x).square().mean() * loss_scale).backward();
    return layer->weight.grad().clone();
  };
  const double scale = 65536.0;
  CHECK(same_bytes(grad_with_loss_scale(scale) / scale, grad_with_loss_scale(1.0)));
}

TEST_CASE("Under CPU autocast the output follows autocast's dtype", "[fp8]") {
  const auto recipe =
      GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed");
  CAPTURE(recipe);
  if (!runs_here(recipe)) return;
  torch::manual_seed(12);
  Float8Linear layer(Float8LinearOptions(16, 16).recipe(Recipe::from_name(recipe)));
  auto x = torch::randn({4, 16}, torch::requires_grad());
  torch::Tensor out;
  {
    Float8AutocastGuard float8;
    amp::AutocastGuard autocast(amp::AutocastOptions(torch::kCPU).dtype(torch::kBFloat16));
    out = layer(x);
  }
  CHECK(out.scalar_type() == torch::kBFloat16);
  // torchao's rowwise_with_gw_hp raises here (its high-precision grad_weight GEMM meets bf16 and
  // float32); amp multiplies in grad_output's dtype.
  out.to(torch::kFloat).square().sum().backward();
  CHECK(layer->weight.grad().scalar_type() == torch::kFloat);
  CHECK(torch::isfinite(layer->weight.grad()).all().item<bool>());
  CHECK(x.grad().scalar_type() == torch::kFloat);
}

TEST_CASE("A tensorwise layer keeps its input for the backward in float8", "[fp8]") {
  // The input is released after the forward (only its float8 copy is kept): a weak reference
  // to it expires once the caller drops it, while rowwise keeps it alive for its dim-0 cast.
  const auto recipe = GENERATE(as<std::string>{}, "tensorwise", "delayed", "rowwise");
  CAPTURE(recipe);
  if (!runs_here(recipe)) return;
  Float8Linear layer(Float8LinearOptions(16, 16).recipe(Recipe::from_name(recipe)));
  Float8AutocastGuard float8;
  torch::Tensor out;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> input_storage;
  {
    auto hidden = torch::randn({4, 16}).requires_grad_(true) * 2;  // a non-leaf activation
    input_storage.emplace(hidden.storage().getWeakStorageImpl());
    out = layer(hidden);
  }
  CHECK(input_storage->expired() == (recipe != "rowwise"));
  out.sum().backward();
  CHECK(layer->weight.grad().defined());
}

TEST_CASE("A rowwise layer on a CPU without rowwise scales says so", "[fp8]") {
  Float8Linear layer(Float8LinearOptions(16, 16).recipe(Recipe::rowwise()));
  Float8AutocastGuard float8;
  const auto x = torch::randn({4, 16});
  if (amp_test::cpu_takes_rowwise_scales()) {
    CHECK(layer(x).sizes() == x.sizes());
  } else {
    CHECK_THROWS_WITH(layer(x),
                      Contains("amp::fp8: rowwise scales on the CPU need a LibTorch whose "
                               "CPU at::_scaled_mm takes them") &&
                          Contains("Use the tensorwise or delayed recipe"));
  }
}

TEST_CASE("The delayed recipe's state stays float32 when the module's dtype changes", "[fp8]") {
  auto make = [] {
    torch::manual_seed(13);
    return Float8Linear(Float8LinearOptions(16, 16).recipe(Recipe::delayed()));
  };
  auto by_to = make();
  by_to->to(torch::kBFloat16);
  auto by_low_precision = make();
  amp::to_low_precision(*by_low_precision, torch::kBFloat16);
  for (auto* layer : {&by_to, &by_low_precision}) {
    CHECK((*layer)->weight.scalar_type() == torch::kBFloat16);
    for (const auto& buffer : (*layer)->named_buffers()) {
      INFO(buffer.key());
      CHECK(buffer.value().scalar_type() == torch::kFloat);
    }
    Float8AutocastGuard float8;
    const auto out = (*layer)(torch::randn({4, 16}).to(torch::kBFloat16));
    CHECK(out.scalar_type() == torch::kBFloat16);
    CHECK((*layer)->named_buffers()["scale_input"].item<float>() != 1.0f);  // updated
  }
}

// ---- behaviour a training loop relies on at the edges (frozen layers, views, empty batches) ----

namespace {

// Counts the calls of the named GEMM operators while it lives (a RecordFunction callback on every
// thread, so the autograd engine's calls are seen too), outermost calls only: whether the CPU's
// at::_scaled_mm runs an aten::mm inside depends on the CPU (oneDNN's float8 kernels on AMX
// machines do not), and one GEMM of the layer is one count either way.
class GemmCounter {
 public:
  explicit GemmCounter(std::vector<std::string> ops) : ops_(std::move(ops)) {
    active_ = this;
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
  }
  ~GemmCounter() {
    at::removeCallback(handle_);
    active_ = nullptr;
  }
  GemmCounter(const GemmCounter&) = delete;
  GemmCounter& operator=(const GemmCounter&) = delete;
  int count() const { return count_.load(); }

 private:
  bool counts(const char* name) const {
    return std::find(ops_.begin(), ops_.end(), name) != ops_.end();
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (active_ != nullptr && active_->counts(fn.name()) && depth_++ == 0) ++active_->count_;
    return nullptr;
  }
  static void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
    if (active_ != nullptr && active_->counts(fn.name())) --depth_;
  }

  static inline GemmCounter* active_ = nullptr;
  // Calls of a counted op in progress on this thread: an op inside another is not counted again.
  static inline thread_local int depth_ = 0;
  std::vector<std::string> ops_;
  std::atomic<int> count_{0};
  at::CallbackHandle handle_;
};

Float8Linear seeded_layer(const std::string& recipe, int64_t in, int64_t out, uint64_t seed) {
  torch::manual_seed(seed);
  return Float8Linear(Float8LinearOptions(in, out).recipe(Recipe::from_name(recipe)));
}

}  // namespace

TEST_CASE("convert_to_float8_training keeps each parameter's requires_grad flag", "[fp8]") {
  // A frozen base layer (partial fine-tuning, LoRA) must stay frozen: an optimizer or a DDP
  // built after the conversion would otherwise train or reduce it.
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Linear(16, 16),
                              torch::nn::Linear(16, 4));
  model[0]->as<torch::nn::LinearImpl>()->weight.requires_grad_(false);
  model[1]->as<torch::nn::LinearImpl>()->weight.requires_grad_(false);
  model[1]->as<torch::nn::LinearImpl>()->bias.requires_grad_(false);
  amp::fp8::convert_to_float8_training(*model);
  const auto params = model->named_parameters();
  CHECK_FALSE(params["0.weight"].requires_grad());
  CHECK(params["0.bias"].requires_grad());
  CHECK_FALSE(params["1.weight"].requires_grad());
  CHECK_FALSE(params["1.bias"].requires_grad());
  CHECK(params["2.weight"].requires_grad());
  CHECK(params["2.bias"].requires_grad());
  // The frozen weights get no gradient from a float8 step.
  Float8AutocastGuard float8;
  model->forward(torch::randn({16, 8})).sum().backward();
  CHECK_FALSE(params["0.weight"].grad().defined());
  CHECK_FALSE(params["1.weight"].grad().defined());
  CHECK(params["0.bias"].grad().defined());
  CHECK(params["2.weight"].grad().defined());
}

TEST_CASE("Permuted inputs of three or more dims give the bits of their contiguous copies",
          "[fp8]") {
  // torch::nn::Linear takes any strided input; so must its float8 replacement (torchao reshapes).
  const auto recipe =
      GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed");
  CAPTURE(recipe);
  if (!runs_here(recipe)) return;
  torch::manual_seed(31);
  const std::vector<torch::Tensor> inputs{
      torch::randn({5, 3, 16}).transpose(0, 1),           // [3, 5, 16], the batch dims swapped
      torch::randn({2, 16, 3, 4}).permute({0, 2, 3, 1}),  // [2, 3, 4, 16], channels last
      torch::randn({16, 6}).t().unsqueeze(0)};            // [1, 6, 16], the feature dim strided
  for (const auto& x : inputs) {
    CAPTURE(x.sizes(), x.strides());
    REQUIRE_FALSE(x.is_contiguous());
    // Two layers with the same state: the delayed recipe updates its history at every cast.
    auto permuted = seeded_layer(recipe, 16, 8, 3);
    auto contiguous = seeded_layer(recipe, 16, 8, 3);
    Float8AutocastGuard float8;
    for (int step = 0; step < 2; ++step) {
      const auto a = run([&](const torch::Tensor& in) { return permuted(in); }, permuted->weight,
                         permuted->bias, x);
      const auto b = run([&](const torch::Tensor& in) { return contiguous(in); },
                         contiguous->weight, contiguous->bias, x.contiguous());
      auto expected_sizes = x.sizes().vec();
      expected_sizes.back() = 8;
      CHECK(a.output.sizes().vec() == expected_sizes);
      CHECK(same_bytes(a.output, b.output));
      CHECK(same_bytes(a.input.contiguous(), b.input));
      CHECK(same_bytes(a.weight, b.weight));
      CHECK(same_bytes(a.bias, b.bias));
    }
  }
}

TEST_CASE(
    "A frozen weight's float8 layer computes no grad_weight, and an unneeded grad_input "
    "neither",
    "[fp8]") {
  const auto recipe =
      GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed");
  CAPTURE(recipe);
  if (!runs_here(recipe)) return;
  // The backward's GEMMs, float8 or not: grad_input and grad_weight.
  const auto gemms_in_backward = [&](bool weight_trains, bool input_needs_grad,
                                     torch::Tensor* grad_input) {
    auto layer = seeded_layer(recipe, 32, 16, 4);
    layer->weight.requires_grad_(weight_trains);
    torch::manual_seed(5);
    auto x = torch::randn({8, 32}).requires_grad_(input_needs_grad);
    Float8AutocastGuard float8;
    const auto loss = layer(x).square().sum();
    GemmCounter gemms({"aten::_scaled_mm", "aten::mm"});
    loss.backward();
    if (grad_input != nullptr && input_needs_grad) *grad_input = x.grad();
    CHECK(layer->weight.grad().defined() == weight_trains);
    return gemms.count();
  };
  torch::Tensor trained, frozen;
  const int both = gemms_in_backward(true, true, &trained);
  CHECK(gemms_in_backward(false, true, &frozen) == both / 2);
  CHECK(gemms_in_backward(true, false, nullptr) == both / 2);
  // Leaving grad_weight out changes nothing in grad_input.
  CHECK(same_bytes(frozen, trained));
}

TEST_CASE("An empty batch inside a float8 region gives the empty output Linear gives", "[fp8]") {
  // An MoE expert that received no tokens, an empty last micro-batch: torchao's amax fails on
  // zero elements; amp returns [..., 0 rows, out] and leaves delayed histories untouched.
  const auto recipe =
      GENERATE(as<std::string>{}, "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed");
  CAPTURE(recipe);
  auto layer = seeded_layer(recipe, 16, 8, 6);
  std::vector<std::pair<std::string, torch::Tensor>> buffers_before;
  for (const auto& b : layer->named_buffers())
    buffers_before.emplace_back(b.key(), b.value().clone());
  for (const auto& sizes : std::vector<std::vector<int64_t>>{{0, 16}, {2, 0, 16}, {0, 3, 16}}) {
    CAPTURE(sizes);
    auto x = torch::randn(sizes).requires_grad_(true);
    torch::Tensor out;
    {
      Float8AutocastGuard float8;
      out = layer(x);
    }
    auto expected_sizes = sizes;
    expected_sizes.back() = 8;
    CHECK(out.sizes().vec() == expected_sizes);
    CHECK(out.scalar_type() == torch::kFloat);
    layer->zero_grad();
    out.sum().backward();
    // As torch::nn::Linear: zero gradients for the parameters, an empty one for the input.
    CHECK(torch::equal(layer->weight.grad(), torch::zeros({8, 16})));
    CHECK(torch::equal(layer->bias.grad(), torch::zeros({8})));
    CHECK(x.grad().sizes() == x.sizes());
  }
  // Under CPU autocast the empty output takes autocast's dtype, as a non-empty one does.
  {
    Float8AutocastGuard float8;
    amp::AutocastGuard autocast(amp::AutocastOptions(torch::kCPU).dtype(torch::kBFloat16));
    CHECK(layer(torch::randn({0, 16})).scalar_type() == torch::kBFloat16);
  }
  for (const auto& [name, before] : buffers_before) {
    INFO(name);
    CHECK(torch::equal(layer->named_buffers()[name], before));
  }
}
