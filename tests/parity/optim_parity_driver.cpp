// C++ twin of optim_parity.py's, lion_parity.py's and low_precision_parity.py's reference
// training: amp::optim's optimizers (optionally in a low-precision mode) with amp::GradScaler and
// amp::AutocastGuard, recording parameters and optimizer state every step.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "parity_driver_support.h"

namespace {

using amp_parity::Inputs;

// One param group, or (lr2 > 0) the first layer at lr and the second at lr2, its other options
// taken from the optimizer's defaults as in Python.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> make_groups(const std::vector<torch::Tensor>& params,
                                                           double lr2) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (lr2 <= 0) {
    groups.emplace_back(params);
    return groups;
  }
  groups.emplace_back(std::vector<torch::Tensor>(params.begin(), params.begin() + 2));
  groups.emplace_back(std::vector<torch::Tensor>(params.begin() + 2, params.end()),
                      std::make_unique<Options>(lr2));
  return groups;
}

// low_precision_parity.py's keys: "mode" (nearest, master, kahan, sr; absent: none),
// "state_dtype" ("" for unset) and "seed".
template <typename Options>
Options low_precision(const Inputs& in, Options options) {
  if (!in.has("mode")) return options;
  const std::string mode = in.text("mode");
  const std::string state = in.text("state_dtype");
  if (!state.empty()) {
    options.state_dtype(state == "float32"    ? torch::kFloat
                        : state == "bfloat16" ? torch::kBFloat16
                                              : torch::kHalf);
  }
  return options.master_weights(mode == "master")
      .kahan_summation(mode == "kahan")
      .stochastic_rounding(mode == "sr")
      .rounding_seed(in.integer("seed"));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Inputs& in,
                                                        const std::vector<torch::Tensor>& params) {
  namespace optim = amp::optim;
  const std::string kind = in.text("optimizer");
  const double lr = in.real("lr");
  const double lr2 = in.real("lr2");
  if (kind == "sgd") {
    auto options = low_precision(in, optim::FusedSGDOptions(lr)
                                         .momentum(in.real("momentum"))
                                         .dampening(in.real("dampening"))
                                         .weight_decay(in.real("weight_decay"))
                                         .nesterov(in.integer("nesterov") != 0));
    return std::make_unique<optim::FusedSGD>(make_groups<optim::FusedSGDOptions>(params, lr2),
                                             options);
  }
  if (kind == "lion") {
    auto options = low_precision(in, optim::FusedLionOptions(lr)
                                         .betas({in.real("beta1"), in.real("beta2")})
                                         .weight_decay(in.real("weight_decay")));
    return std::make_unique<optim::FusedLion>(make_groups<optim::FusedLionOptions>(params, lr2),
                                              options);
  }
  const auto adam = [&](auto options) {
    return low_precision(in, options.betas({in.real("beta1"), in.real("beta2")})
                                 .eps(in.real("eps"))
                                 .weight_decay(in.real("weight_decay"))
                                 .amsgrad(in.integer("amsgrad") != 0));
  };
  if (kind == "adam") {
    return std::make_unique<optim::FusedAdam>(make_groups<optim::FusedAdamOptions>(params, lr2),
                                              adam(optim::FusedAdamOptions(lr)));
  }
  return std::make_unique<optim::FusedAdamW>(make_groups<optim::FusedAdamWOptions>(params, lr2),
                                             adam(optim::FusedAdamWOptions(lr)));
}

// The record Python's record() makes: "<step>/param/<i>" and "<step>/<state name>/<i>" for every
// state tensor a parameter has, copied to the CPU.
void record(c10::impl::GenericDict& out, int64_t step, const std::vector<torch::Tensor>& params,
            const torch::optim::Optimizer& optimizer) {
  const auto put = [&](const std::string& name, size_t i, const torch::Tensor& t) {
    if (t.defined()) {
      out.insert(std::to_string(step) + "/" + name + "/" + std::to_string(i),
                 t.detach().cpu().clone());
    }
  };
  for (size_t i = 0; i < params.size(); ++i) {
    put("param", i, params[i]);
    const auto found = optimizer.state().find(params[i].unsafeGetTensorImpl());
    if (found == optimizer.state().end()) continue;
    if (const auto* adam =
            dynamic_cast<const amp::optim::FusedAdamParamState*>(found->second.get())) {
      put("step", i, adam->step());
      put("exp_avg", i, adam->exp_avg());
      put("exp_avg_sq", i, adam->exp_avg_sq());
      put("max_exp_avg_sq", i, adam->max_exp_avg_sq());
      put("master_weight", i, adam->master_weight());
      put("kahan_comp", i, adam->kahan_comp());
    } else if (const auto* lion =
                   dynamic_cast<const amp::optim::FusedLionParamState*>(found->second.get())) {
      put("step", i, lion->step());
      put("exp_avg", i, lion->exp_avg());
      put("master_weight", i, lion->master_weight());
      put("kahan_comp", i, lion->kahan_comp());
    } else {
      const auto& sgd = static_cast<const amp::optim::FusedSGDParamState&>(*found->second);
      put("momentum_buffer", i, sgd.momentum_buffer());
      put("step", i, sgd.step());
      put("master_weight", i, sgd.master_weight());
      put("kahan_comp", i, sgd.kahan_comp());
    }
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 3) {
    std::cerr << "usage: optim_parity_driver INPUTS.pt ACTUAL.pt\n";
    return 2;
  }
  torch::set_num_threads(1);
  const Inputs in(argv[1]);
  const torch::Device device(in.text("device"));
  const std::string autocast = in.text("autocast");
  const auto autocast_dtype = autocast == "bfloat16" ? torch::kBFloat16 : torch::kHalf;
  const std::string mode = in.text("scaler");
  std::vector<torch::Tensor> params, xs, ys;
  for (const auto& w : in.tensors("weights")) {
    params.push_back(w.to(device, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
  }
  for (const auto& x : in.tensors("xs")) xs.push_back(x.to(device));
  for (const auto& y : in.tensors("ys")) ys.push_back(y.to(device));
  auto optimizer = make_optimizer(in, params);
  const int64_t resume_at = in.has("resume_at") ? in.integer("resume_at") : -1;
  amp::GradScaler scaler(device.type(), amp::GradScalerOptions()
                                            .init_scale(in.real("init_scale"))
                                            .growth_interval(in.integer("growth_interval"))
                                            .enabled(mode == "enabled"));
  std::map<int64_t, int64_t> inject;
  const auto inject_table = in.at("inject").toTensor();
  for (int64_t i = 0; i < inject_table.size(0); ++i) {
    inject[inject_table[i][0].item<int64_t>()] = inject_table[i][1].item<int64_t>();
  }
  const auto lr_changes = in.at("lr_changes").toTensor();
  const double clip = in.real("clip");

  auto out = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  for (int64_t step = 0; step < in.integer("steps"); ++step) {
    const std::string prefix = std::to_string(step) + "/";
    if (step == resume_at) {
      // A checkpoint round trip into a new optimizer: the run must continue as if uninterrupted.
      std::ostringstream saved;
      torch::save(*optimizer, saved);
      optimizer = make_optimizer(in, params);
      std::istringstream restored(saved.str());
      torch::load(*optimizer, restored);
    }
    for (int64_t i = 0; i < lr_changes.size(0); ++i) {
      if (lr_changes[i][0].item<double>() != static_cast<double>(step)) continue;
      optimizer->param_groups()[lr_changes[i][1].item<int64_t>()].options().set_lr(
          lr_changes[i][2].item<double>());
    }
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      amp::AutocastGuard guard(device.type(), autocast_dtype, autocast != "none");
      loss = torch::mse_loss(amp_parity::forward(params, xs[step]), ys[step]);
    }
    (mode == "none" ? loss : scaler.scale(loss)).backward();
    if (auto it = inject.find(step); it != inject.end()) {
      torch::NoGradGuard no_grad;
      params[0].grad()[0][0] = it->second == 0 ? INFINITY : NAN;
    }
    if (clip > 0) {
      if (mode != "none") scaler.unscale_(*optimizer);
      amp_parity::clip_grad_norm(params, clip);
    }
    if (mode == "none") {
      optimizer->step();
    } else {
      const amp::StepResult result = scaler.step(*optimizer);
      scaler.update();
      if (mode == "enabled") {
        out.insert(prefix + "found_inf", result.found_inf.cpu().clone());
        out.insert(prefix + "scale", scaler.scale_tensor().cpu().clone());
        out.insert(prefix + "tracker", scaler.growth_tracker_tensor().cpu().clone());
      }
    }
    out.insert(prefix + "loss", loss.detach().to(torch::kFloat).cpu());
    record(out, step, params, *optimizer);
  }
  amp_parity::write_pickle(out, argv[2]);
  return 0;
}
