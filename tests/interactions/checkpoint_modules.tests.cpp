// CheckpointWrapper with the rest of a training loop: a wrapped model saves, loads and clones like
// the unwrapped one (checkpoints of either load into the other, LibTorch archives and Python-format
// state dicts alike), and a checkpointed model trained with each of amp's optimizers, in float32
// and with bf16 weights, gives the plain model's bits.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <amp/autocast.h>
#include <amp/checkpoint.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/low_precision.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include "support/bits.h"
#include "support/temp_dir.h"

using amp_test::same_bits;
using Catch::Contains;

namespace {

torch::nn::Sequential plain_model() {
  torch::manual_seed(31);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::GELU(),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})),
                               torch::nn::Linear(16, 4));
}

// The same model with every module wrapped where it stands.
torch::nn::Sequential wrapped_model() {
  auto plain = plain_model();
  torch::nn::Sequential wrapped;
  for (const auto& module : *plain) wrapped->push_back(amp::CheckpointWrapper(module));
  return wrapped;
}

std::vector<torch::Tensor> values(const torch::nn::Module& module) {
  std::vector<torch::Tensor> v;
  for (const auto& p : module.parameters()) v.push_back(p.detach().clone());
  for (const auto& b : module.buffers()) v.push_back(b.clone());
  return v;
}

bool same_values(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_bits(a[i], b[i])) return false;
  }
  return true;
}

// Moves every parameter away from its initial value, so that a load has something to change.
void perturb(torch::nn::Module& module, double by) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) p.add_(by);
}

// An amp 0.1 wrapper: the wrapped module one level down, under "module", in checkpoints too.
struct NestedUnderModule : torch::nn::Module {
  explicit NestedUnderModule(torch::nn::AnyModule inner) : inner_(std::move(inner)) {
    register_module("module", inner_.ptr());
  }
  torch::Tensor forward(const torch::Tensor& x) { return inner_.forward(x); }
  torch::nn::AnyModule inner_;
};

}  // namespace

TEST_CASE("A checkpoint of the unwrapped model loads into the wrapped one, and back",
          "[interactions][checkpoint][save_load]") {
  auto plain = plain_model();
  perturb(*plain, 0.25);
  auto wrapped = wrapped_model();
  std::stringstream stream;
  torch::save(plain, stream);
  REQUIRE_NOTHROW(torch::load(wrapped, stream));
  CHECK(same_values(values(*wrapped), values(*plain)));

  // The wrapped model writes the same names: the plain model reads them.
  perturb(*wrapped, -0.5);
  std::stringstream back;
  torch::save(wrapped, back);
  auto reloaded = plain_model();
  REQUIRE_NOTHROW(torch::load(reloaded, back));
  CHECK(same_values(values(*reloaded), values(*wrapped)));

  // The module tree still shows the wrapped module (as Python's named_modules does).
  CHECK(wrapped->named_parameters().contains("0.module.weight"));

  // A checkpoint written by amp 0.1's wrapper (a "module" level) still loads.
  auto old_style = plain_model();
  torch::nn::Sequential nested;
  for (const auto& module : *old_style) {
    nested->push_back(std::make_shared<NestedUnderModule>(module));
  }
  perturb(*nested, 1.0);
  std::stringstream old_stream;
  torch::save(nested, old_stream);
  auto fresh = wrapped_model();
  REQUIRE_NOTHROW(torch::load(fresh, old_stream));
  CHECK(same_values(values(*fresh), values(*nested)));
}

TEST_CASE("A wrapped float8 model saves and loads its delayed-scaling histories by the plain names",
          "[interactions][checkpoint][save_load][fp8]") {
  const auto recipe =
      amp::fp8::Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(4));
  const auto make = [&](bool wrap) {
    torch::manual_seed(32);
    amp::fp8::Float8Linear layer(amp::fp8::Float8LinearOptions(16, 16).recipe(recipe));
    torch::nn::Sequential seq;
    if (wrap) {
      seq->push_back(amp::CheckpointWrapper(torch::nn::AnyModule(layer)));
    } else {
      seq->push_back(layer);
    }
    return seq;
  };
  auto trained = make(false);
  {
    amp::fp8::Float8AutocastGuard float8;
    for (int k = 0; k < 3; ++k) trained->forward(torch::randn({16, 16}) * (k + 1)).sum().backward();
  }
  std::stringstream stream;
  torch::save(trained, stream);
  auto wrapped = make(true);
  torch::load(wrapped, stream);
  CHECK(same_values(values(*wrapped), values(*trained)));
}

TEST_CASE("Python-format state dicts of wrapped float8 models use the plain names both ways",
          "[interactions][checkpoint][save_load][fp8]") {
  // amp::save_state_dict / load_state_dict (Python's files) see through CheckpointWrapper as
  // torch::save does: the plain model's file loads into the wrapped one and back, float8
  // delayed-scaling histories included.
  const auto recipe =
      amp::fp8::Recipe::delayed(amp::fp8::DelayedScalingOptions().amax_history_len(4));
  const auto make = [&](bool wrap) {
    torch::manual_seed(33);
    torch::nn::Sequential seq;
    for (int k = 0; k < 2; ++k) {
      amp::fp8::Float8Linear layer(amp::fp8::Float8LinearOptions(16, 16).recipe(recipe));
      if (wrap) {
        seq->push_back(amp::CheckpointWrapper(torch::nn::AnyModule(layer)));
      } else {
        seq->push_back(layer);
      }
    }
    return seq;
  };
  auto plain = make(false);
  auto wrapped = make(true);
  std::vector<std::string> plain_names, wrapped_names;
  for (const auto& entry : amp::state_dict(*plain)) plain_names.push_back(entry.key());
  for (const auto& entry : amp::state_dict(*wrapped)) wrapped_names.push_back(entry.key());
  CHECK(wrapped_names == plain_names);
  CHECK(plain_names[0] == "0.weight");

  {
    amp::fp8::Float8AutocastGuard float8;
    for (int k = 0; k < 3; ++k) plain->forward(torch::randn({16, 16}) * (k + 1)).sum().backward();
  }
  amp_test::TempDir dir("interactions_state_dict");
  const std::string plain_file = (dir.path() / "plain.pt").string();
  amp::save_state_dict(*plain, plain_file);
  amp::load_state_dict(*wrapped, plain_file);
  CHECK(same_values(values(*wrapped), values(*plain)));

  // Trained wrapped (checkpointed forward), its file into a fresh plain model.
  {
    amp::fp8::Float8AutocastGuard float8;
    wrapped->forward(torch::randn({16, 16}).requires_grad_(true)).sum().backward();
  }
  const std::string wrapped_file = (dir.path() / "wrapped.pt").string();
  amp::save_state_dict(*wrapped, wrapped_file);
  auto reloaded = make(false);
  amp::load_state_dict(*reloaded, wrapped_file);
  CHECK(same_values(values(*reloaded), values(*wrapped)));
}

TEST_CASE("A model holding CheckpointWrappers clones, and the clone trains as the original",
          "[interactions][checkpoint]") {
  auto original = wrapped_model();
  perturb(*original, 0.125);
  std::shared_ptr<torch::nn::Module> copy;
  REQUIRE_NOTHROW(copy = original->clone());
  auto clone = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(copy);
  REQUIRE(clone);
  CHECK(same_values(values(*clone), values(*original)));
  // A deep copy: new storages, wrapped again (still checkpointed), same options.
  const auto& first = *clone->ptr<amp::CheckpointWrapperImpl>(0);
  CHECK(first.options().preserve_rng_state());
  CHECK(clone->parameters()[0].data_ptr() != original->parameters()[0].data_ptr());
  // One SGD step each on the same batch: the same bits; the original is not touched by the
  // clone's step.
  const auto x = torch::randn({5, 8});
  const auto step = [&x](torch::nn::SequentialImpl& model) {
    torch::optim::SGD opt(model.parameters(), 0.1);
    model.forward(x).square().mean().backward();
    opt.step();
  };
  const auto before = values(*original);
  step(*clone);
  CHECK(same_values(values(*original), before));
  step(*original);
  CHECK(same_values(values(*clone), values(*original)));
}

namespace {

// A Cloneable model whose reset() builds a wrapped child: its clone() makes the child a clone of
// the original's child (Module::clone_).
struct WrappedNet : torch::nn::Cloneable<WrappedNet> {
  WrappedNet() { reset(); }
  void reset() override {
    block = register_module("block",
                            amp::CheckpointWrapper(torch::nn::AnyModule(torch::nn::Linear(4, 4))));
  }
  torch::Tensor forward(const torch::Tensor& x) { return block->forward(x); }
  amp::CheckpointWrapper block{nullptr};
};

}  // namespace

TEST_CASE("A Cloneable model whose reset() builds a CheckpointWrapper clones its weights",
          "[interactions][checkpoint]") {
  torch::manual_seed(33);
  auto net = std::make_shared<WrappedNet>();
  perturb(*net, 2.0);
  auto clone = std::dynamic_pointer_cast<WrappedNet>(net->clone());
  REQUIRE(clone);
  CHECK(same_values(values(*clone), values(*net)));
  const auto x = torch::randn({3, 4});
  CHECK(same_bits(clone->forward(x), net->forward(x)));
}

namespace {

// Three steps of a model with or without its modules wrapped, by `make_optimizer`'s optimizer,
// under CPU bf16 autocast and a GradScaler; bf16 weights (amp::to_low_precision) when asked.
template <typename MakeOptimizer>
std::vector<torch::Tensor> train(bool wrap, bool bf16_weights,
                                 const MakeOptimizer& make_optimizer) {
  auto model = wrap ? wrapped_model() : plain_model();
  if (bf16_weights) amp::to_low_precision(*model, torch::kBFloat16);
  auto optimizer = make_optimizer(model->parameters());
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(1024.0));
  torch::manual_seed(34);
  for (int k = 0; k < 3; ++k) {
    optimizer->zero_grad();
    const auto x = torch::randn({6, 8});
    torch::Tensor loss;
    {
      amp::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16);
      loss = model->forward(x.to(bf16_weights ? torch::kBFloat16 : torch::kFloat))
                 .to(torch::kFloat)
                 .square()
                 .mean();
    }
    scaler.scale(loss).backward();
    scaler.step(*optimizer);
    scaler.update();
  }
  return values(*model);
}

}  // namespace

TEST_CASE("A checkpointed model trains to the plain model's bits with every fused optimizer",
          "[interactions][checkpoint][optim][low_precision]") {
  using namespace amp::optim;
  using Params = std::vector<torch::Tensor>;
  SECTION("FusedAdamW, float32 weights") {
    const auto make = [](Params p) {
      return std::make_unique<FusedAdamW>(p, FusedAdamWOptions(1e-2));
    };
    CHECK(same_values(train(true, false, make), train(false, false, make)));
  }
  SECTION("FusedSGD with momentum, bf16 weights with Kahan summation") {
    const auto make = [](Params p) {
      return std::make_unique<FusedSGD>(p,
                                        FusedSGDOptions(0.1).momentum(0.9).kahan_summation(true));
    };
    CHECK(same_values(train(true, true, make), train(false, true, make)));
  }
  SECTION("FusedLion, bf16 weights with stochastic rounding") {
    const auto make = [](Params p) {
      return std::make_unique<FusedLion>(
          p, FusedLionOptions(1e-3).stochastic_rounding(true).rounding_seed(3));
    };
    CHECK(same_values(train(true, true, make), train(false, true, make)));
  }
  SECTION("FusedAdam, bf16 weights with master weights") {
    const auto make = [](Params p) {
      return std::make_unique<FusedAdam>(p, FusedAdamOptions(1e-2).master_weights(true));
    };
    CHECK(same_values(train(true, true, make), train(false, true, make)));
  }
}
