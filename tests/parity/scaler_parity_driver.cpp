// C++ twin of scaler_parity.py's reference training: amp::GradScaler + amp::AutocastGuard on the
// same inputs and device, writing the per-step trajectory and final parameters for comparison.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>

#include "parity_driver_support.h"

namespace {

using amp_parity::clip_grad_norm;
using amp_parity::forward;
using amp_parity::Inputs;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        std::vector<torch::Tensor> params) {
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

amp::GradScaler make_scaler(const Inputs& in, c10::DeviceType device) {
  return amp::GradScaler(device, amp::GradScalerOptions()
                                     .init_scale(in.real("init_scale"))
                                     .growth_factor(in.real("growth_factor"))
                                     .backoff_factor(in.real("backoff_factor"))
                                     .growth_interval(in.integer("growth_interval")));
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 4) {
    std::cerr << "usage: scaler_parity_driver INPUTS.pt ACTUAL.pt WORKDIR\n";
    return 2;
  }
  torch::set_num_threads(1);
  const Inputs in(argv[1]);
  const std::string workdir = argv[3];
  const torch::Device device(in.text("device"));
  const std::string dtype_name = in.text("dtype");
  const auto dtype = dtype_name == "float16"    ? torch::kHalf
                     : dtype_name == "bfloat16" ? torch::kBFloat16
                                                : torch::kFloat;
  const bool autocast = dtype != torch::kFloat;
  const int64_t steps = in.integer("steps");
  const int64_t acc = in.integer("accumulate");
  const bool two_models = in.integer("two_models") != 0;
  const double clip = in.real("clip");
  std::vector<torch::Tensor> xs, ys;
  for (const auto& x : in.tensors("xs")) xs.push_back(x.to(device));
  for (const auto& y : in.tensors("ys")) ys.push_back(y.to(device));

  std::vector<torch::Tensor> params;
  for (const auto& w : in.tensors("weights")) {
    params.push_back(w.to(device, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
  }
  std::vector<std::vector<torch::Tensor>> groups;
  for (size_t i = 0; i < params.size(); i += 4) {
    groups.emplace_back(params.begin() + i, params.begin() + i + 4);
  }
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  for (const auto& g : groups) optimizers.push_back(make_optimizer(in.text("optimizer"), g));
  std::map<int64_t, int64_t> inject;
  const auto inject_table = in.at("inject").toTensor();
  for (int64_t i = 0; i < inject_table.size(0); ++i) {
    inject[inject_table[i][0].item<int64_t>()] = inject_table[i][1].item<int64_t>();
  }

  auto scaler = make_scaler(in, device.type());
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  std::vector<bool> skipped;
  std::vector<torch::Tensor> losses;
  for (int64_t step = 0; step < steps; ++step) {
    for (auto& opt : optimizers) opt->zero_grad();
    auto step_loss = torch::zeros({}, device);
    for (int64_t micro = 0; micro < acc; ++micro) {
      const auto& x = xs[step * acc + micro];
      const auto& y = ys[step * acc + micro];
      torch::Tensor loss0, loss1;
      {
        amp::AutocastGuard guard(device.type(), dtype, autocast);
        if (two_models) {
          const auto out0 = forward(groups[0], x);
          const auto out1 = forward(groups[1], x);
          loss0 = torch::mse_loss(out0 * 2 + out1 * 3, y);
          loss1 = torch::mse_loss(out0 * 3 - out1 * 5, y);
        } else {
          loss0 = torch::mse_loss(forward(groups[0], x), y) / acc;
        }
      }
      if (two_models) {
        scaler.scale(loss0).backward({}, /*retain_graph=*/true);
        scaler.scale(loss1).backward();
        step_loss = step_loss + loss0.detach().to(torch::kFloat) + loss1.detach().to(torch::kFloat);
      } else {
        scaler.scale(loss0).backward();
        step_loss = step_loss + loss0.detach().to(torch::kFloat);
      }
    }
    if (auto it = inject.find(step); it != inject.end()) {
      torch::NoGradGuard no_grad;
      params[0].grad()[0][0] = it->second == 0 ? INFINITY : NAN;
    }
    if (clip > 0) {
      scaler.unscale_(*optimizers[0]);
      clip_grad_norm(groups[0], clip);
    }
    if (two_models) scaler.unscale_(*optimizers[0]);
    bool any_skipped = false;
    for (auto& opt : optimizers) any_skipped |= !scaler.step(*opt).read_taken();
    if (step == in.integer("new_scale_at")) {
      scaler.update(in.real("new_scale"));
    } else if (step == in.integer("new_scale_tensor_at")) {
      scaler.update(torch::tensor(in.real("new_scale_tensor")).to(device));
    } else {
      scaler.update();
    }
    if (step == in.integer("resume_at")) {
      // Resume from a file, as a restarted job would: a fresh scaler with other settings. It
      // loads the file Python's reference run saved at this step, and the file this run saved
      // must hold the same state.
      const std::string own_path = workdir + "/cpp_resume.pt";
      scaler.save_state_dict(own_path);
      amp::GradScaler resumed(device.type(), amp::GradScalerOptions().init_scale(1.0));
      resumed.load_state_dict(workdir + "/python_resume.pt");
      amp::GradScaler own(device.type(), amp::GradScalerOptions().init_scale(1.0));
      own.load_state_dict(own_path);
      if (own.get_scale() != resumed.get_scale() ||
          own.get_growth_tracker() != resumed.get_growth_tracker()) {
        std::cerr << "the C++ resume file differs from Python's\n";
        return 1;
      }
      scaler = std::move(resumed);
    }
    scales.push_back(scaler.get_scale());
    trackers.push_back(scaler.get_growth_tracker());
    skipped.push_back(any_skipped);
    losses.push_back(step_loss);
  }

  auto result = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  result.insert("scales", torch::tensor(scales, torch::kDouble));
  result.insert("trackers", torch::tensor(trackers, torch::kLong));
  auto skipped_tensor = torch::zeros({steps}, torch::kBool);
  for (int64_t i = 0; i < steps; ++i) skipped_tensor[i] = static_cast<bool>(skipped[i]);
  result.insert("skipped", skipped_tensor);
  result.insert("losses", torch::stack(losses).cpu());
  c10::List<torch::Tensor> final_params;
  for (const auto& p : params) final_params.push_back(p.detach().cpu());
  result.insert("params", final_params);
  amp_parity::write_pickle(result, argv[2]);
  return 0;
}
