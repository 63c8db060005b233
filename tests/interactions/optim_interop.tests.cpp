// The optimizers that exist to move runs between Python and C++, used with the features a moved
// run brings along: amp::optim::AdamW (Python's unfused arithmetic) under GradScaler with an
// overflowing step and bf16 autocast, and through a Python-format state dict mid-run; FusedLion's
// state without step counts (lion-pytorch keeps none) under stochastic rounding of bf16 weights;
// a float32 Python-format state loaded into amp::optim::AdamW over bf16 weights.
// The AMP recipe's one-file checkpoint (make_dict, dict_entry) of a BatchNorm model mid-run.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include "support/optim_helpers.h"
#include "support/temp_dir.h"

namespace {

std::vector<torch::Tensor> bits(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

// Every state tensor of `optimizer`, by Python's index and name.
std::vector<torch::Tensor> state_tensors(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> out;
  const c10::IValue state = amp::optimizer_state_dict(optimizer).toGenericDict().at("state");
  for (const auto& entry : state.toGenericDict()) {
    for (const auto& field : entry.value().toGenericDict()) {
      if (field.value().isTensor()) out.push_back(field.value().toTensor().clone());
    }
  }
  return out;
}

// A Linear-ReLU-Linear model under bf16 CPU autocast.
struct Loop {
  torch::nn::Sequential model{torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3)};

  torch::Tensor loss(int step) {
    torch::manual_seed(300 + step);
    torch::Tensor x = torch::randn({5, 6});
    if (step == 1) x[0][0] = INFINITY;  // this step's gradients overflow
    amp::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16);
    return model->forward(x).to(torch::kFloat).square().mean();
  }
};

}  // namespace

TEST_CASE(
    "amp::optim::AdamW under GradScaler skips an overflowing step untouched and resumes "
    "through a Python-format state dict with the uninterrupted bits",
    "[interactions][optim][scaler][state_dict]") {
  const auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.1);
  torch::manual_seed(9);
  Loop whole;
  Loop moved;
  torch::NoGradGuard no_grad_copy;
  for (size_t i = 0; i < whole.model->parameters().size(); ++i) {
    moved.model->parameters()[i].copy_(whole.model->parameters()[i]);
  }
  at::AutoGradMode grad(true);
  amp::optim::AdamW whole_opt(whole.model->parameters(), options);
  amp::GradScaler whole_scaler(c10::DeviceType::CPU,
                               amp::GradScalerOptions().init_scale(1024.0).growth_interval(2));
  const auto iteration = [](Loop& loop, torch::optim::Optimizer& opt, amp::GradScaler& scaler,
                            int step) {
    opt.zero_grad();
    scaler.scale(loop.loss(step)).backward();
    scaler.step(opt);
    scaler.update();
  };
  for (int step = 0; step < 5; ++step) {
    const auto params_before = bits(whole.model->parameters());
    const auto state_before = state_tensors(whole_opt);
    const double scale_before = whole_scaler.get_scale();
    iteration(whole, whole_opt, whole_scaler, step);
    if (step == 1) {
      // Skipped: the scale halves, the parameters and every state tensor keep their bits.
      CHECK(whole_scaler.get_scale() == scale_before / 2);
      CHECK(amp_test::all_same_bits(bits(whole.model->parameters()), params_before));
      CHECK(amp_test::all_same_bits(state_tensors(whole_opt), state_before));
    } else {
      CHECK_FALSE(amp_test::all_same_bits(bits(whole.model->parameters()), params_before));
    }
  }

  // The same run moved after step 2 through the Python-format dicts into fresh objects.
  amp::optim::AdamW first_opt(moved.model->parameters(), options);
  amp::GradScaler first_scaler(c10::DeviceType::CPU,
                               amp::GradScalerOptions().init_scale(1024.0).growth_interval(2));
  for (int step = 0; step < 3; ++step) iteration(moved, first_opt, first_scaler, step);
  const c10::IValue model_state = amp::state_dict(*moved.model);
  const c10::IValue optimizer_state = amp::optimizer_state_dict(first_opt);
  const auto scaler_state = first_scaler.state_dict();
  Loop resumed;
  amp::load_state_dict(*resumed.model, model_state);
  amp::optim::AdamW second_opt(resumed.model->parameters(), torch::optim::AdamWOptions(0.5));
  amp::load_optimizer_state_dict(second_opt, optimizer_state);
  amp::GradScaler second_scaler(c10::DeviceType::CPU);
  second_scaler.load_state_dict(scaler_state);
  for (int step = 3; step < 5; ++step) iteration(resumed, second_opt, second_scaler, step);
  CHECK(
      amp_test::all_same_bits(bits(resumed.model->parameters()), bits(whole.model->parameters())));
  CHECK(amp_test::all_same_bits(state_tensors(second_opt), state_tensors(whole_opt)));
  CHECK(second_scaler.get_scale() == whole_scaler.get_scale());
}

TEST_CASE(
    "FusedLion state without step counts, as lion-pytorch writes it, loads under stochastic "
    "rounding and counts from 0",
    "[interactions][optim][low_precision][state_dict]") {
  torch::manual_seed(4);
  const torch::Tensor start = torch::randn({64}).to(torch::kBFloat16);
  const auto options =
      amp::optim::FusedLionOptions(1e-3).weight_decay(0.1).stochastic_rounding(true);
  const auto grad = [](int step) {
    torch::manual_seed(500 + step);
    return torch::randn({64}).to(torch::kBFloat16);
  };
  torch::Tensor p = start.clone().requires_grad_(true);
  amp::optim::FusedLion opt({p}, options);
  for (int step = 0; step < 2; ++step) {
    p.mutable_grad() = grad(step);
    opt.step();
  }
  // The state as lion-pytorch keeps it: exp_avg alone.
  auto saved = amp::optimizer_state_dict(opt).toGenericDict();
  auto state = saved.at("state").toGenericDict();
  auto entry = state.at(0).toGenericDict().copy();
  REQUIRE(entry.contains("step"));
  REQUIRE(entry.erase("step") == 1);
  auto without_counts = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
  without_counts.insert(0, entry);
  saved.insert_or_assign("state", without_counts);

  torch::Tensor q = p.detach().clone().requires_grad_(true);
  amp::optim::FusedLion loaded({q}, options);
  amp::load_optimizer_state_dict(loaded, saved);
  const auto counts = [](const torch::optim::Optimizer& o) {
    return amp::optimizer_state_dict(o)
        .toGenericDict()
        .at("state")
        .toGenericDict()
        .at(0)
        .toGenericDict()
        .at("step")
        .toTensor()
        .item<double>();
  };
  CHECK(counts(loaded) == 0.0);
  // The momentum moved exactly; the count restarts, and with it the stochastic rounding bits.
  p.mutable_grad() = grad(2);
  q.mutable_grad() = grad(2);
  opt.step();
  loaded.step();
  CHECK(counts(opt) == 3.0);
  CHECK(counts(loaded) == 1.0);
  CHECK(torch::equal(state_tensors(opt).back(), state_tensors(loaded).back()));
  // Both parameters moved by one bf16 ulp at most from each other (the rounding draws differ).
  const torch::Tensor gap = (p.detach().to(torch::kFloat) - q.detach().to(torch::kFloat)).abs();
  CHECK((gap <= p.detach().to(torch::kFloat).abs() / 128 + 1e-30).all().item<bool>());
}

TEST_CASE(
    "A float32 Python-format AdamW state loads into amp::optim::AdamW over bf16 weights cast to "
    "bf16, as Python's load_state_dict casts it, and the step runs",
    "[interactions][optim][low_precision][state_dict]") {
  torch::manual_seed(12);
  torch::nn::Linear fp32_model(4, 3);
  amp::optim::AdamW fp32_adamw(fp32_model->parameters(), torch::optim::AdamWOptions(0.01));
  for (int step = 0; step < 2; ++step) {
    fp32_adamw.zero_grad();
    fp32_model->forward(torch::randn({5, 4})).square().mean().backward();
    fp32_adamw.step();
  }
  const c10::IValue file = amp::optimizer_state_dict(fp32_adamw);

  // The same model held in bf16 (amp::to_low_precision's dtype), as a run moved with bf16 weights.
  torch::nn::Linear bf16_model(4, 3);
  bf16_model->to(torch::kBFloat16);
  amp::optim::AdamW bf16_adamw(bf16_model->parameters(), torch::optim::AdamWOptions(0.01));
  amp::load_optimizer_state_dict(bf16_adamw, file);
  const std::vector<torch::Tensor> loaded = state_tensors(bf16_adamw);
  const std::vector<torch::Tensor> saved = state_tensors(fp32_adamw);
  REQUIRE(loaded.size() == saved.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    CAPTURE(i);
    if (saved[i].dim() == 0) continue;  // the step counts
    CHECK(loaded[i].scalar_type() == torch::kBFloat16);
    CHECK(torch::equal(loaded[i], saved[i].to(torch::kBFloat16)));
  }
  bf16_model->forward(torch::randn({5, 4}).to(torch::kBFloat16)).square().mean().backward();
  CHECK_NOTHROW(bf16_adamw.step());
}

TEST_CASE(
    "A BatchNorm model's run under bf16 autocast with GradScaler and FusedAdamW resumes "
    "bit for bit from the make_dict checkpoint read through dict_entry",
    "[interactions][serialize][scaler]") {
  // Two copies of one run: the first goes on, the second is rebuilt from the checkpoint taken
  // after step 2 (model with BatchNorm buffers, optimizer, scaler, step) and takes step 3 too.
  const auto make = [] {
    torch::manual_seed(41);
    return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                 torch::nn::Linear(6, 2));
  };
  const auto step = [](torch::nn::Sequential& model, amp::optim::FusedAdamW& optimizer,
                       amp::GradScaler& scaler, int n) {
    torch::manual_seed(500 + n);
    const at::Tensor x = torch::randn({8, 4});
    optimizer.zero_grad();
    at::Tensor loss;
    {
      amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      loss = model->forward(x).to(torch::kFloat).square().mean();
    }
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
  };
  auto model = make();
  amp::optim::FusedAdamW optimizer(model->parameters(), amp::optim::FusedAdamWOptions(0.01));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(256.0).growth_interval(1));
  for (int n = 1; n <= 2; ++n) step(model, optimizer, scaler, n);
  amp_test::TempDir dir("interop_make_dict");
  const std::string path = (dir.path() / "checkpoint.pt").string();
  amp::save_pickled(amp::make_dict({{"model", amp::state_dict(*model)},
                                    {"optimizer", amp::optimizer_state_dict(optimizer)},
                                    {"scaler", scaler.state_dict()},
                                    {"step", int64_t{2}}}),
                    path);
  step(model, optimizer, scaler, 3);

  torch::manual_seed(7);  // other weights: the load must replace them all
  auto resumed = torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                       torch::nn::Linear(6, 2));
  amp::optim::FusedAdamW resumed_optimizer(resumed->parameters(),
                                           amp::optim::FusedAdamWOptions(0.5));
  amp::GradScaler resumed_scaler;
  const c10::IValue checkpoint = amp::load_pickled(path);
  amp::load_state_dict(*resumed, amp::dict_entry(checkpoint, "model"));
  amp::load_optimizer_state_dict(resumed_optimizer, amp::dict_entry(checkpoint, "optimizer"));
  resumed_scaler.load_state_dict(amp::dict_entry(checkpoint, "scaler"));
  CHECK(amp::dict_entry(checkpoint, "step").toInt() == 2);
  step(resumed, resumed_optimizer, resumed_scaler, 3);
  CHECK(resumed_scaler.get_scale() == scaler.get_scale());
  const auto mine = amp::state_dict(*model);
  const auto theirs = amp::state_dict(*resumed);
  REQUIRE(mine.size() == theirs.size());
  for (const auto& entry : mine) {
    CAPTURE(entry.key());
    CHECK(torch::equal(entry.value(), theirs.at(entry.key())));
  }
}
