// C++ twin of checkpoint_parity.py's training: the same network with amp::checkpoint (nested
// where the scenario says), amp::AutocastGuard and SGD by hand, recording loss, gradients and
// parameters every step.
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include <amp/autocast.h>
#include <amp/checkpoint.h>

#include "parity_driver_support.h"

int main(int argc, char* argv[]) {
  if (argc != 3) {
    std::cerr << "usage: checkpoint_parity_driver INPUTS.pt ACTUAL.pt\n";
    return 2;
  }
  torch::set_num_threads(1);
  const amp_parity::Inputs in(argv[1]);
  torch::manual_seed(static_cast<uint64_t>(in.integer("seed")));
  const torch::Device device(in.text("device"));
  std::vector<torch::Tensor> p, xs, ys;
  for (const auto& w : in.tensors("weights")) {
    p.push_back(w.to(device, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
  }
  for (const auto& x : in.tensors("xs")) xs.push_back(x.to(device));
  for (const auto& y : in.tensors("ys")) ys.push_back(y.to(device));
  const std::string autocast = in.text("autocast");
  const auto options = amp::CheckpointOptions()
                           .preserve_rng_state(in.integer("preserve_rng_state") != 0)
                           .early_stop(in.integer("early_stop") != 0);
  const bool nested = in.integer("nested") != 0;
  const double lr = in.real("lr");

  const auto inner = [&p](const torch::Tensor& h) {
    return torch::gelu(torch::linear(h, p[2], p[3]));
  };
  const auto outer = [&](const torch::Tensor& x, double scale) {
    auto h = torch::dropout(torch::linear(x, p[0], p[1]), 0.25, /*train=*/true);
    h = nested ? amp::checkpoint(options, inner, h) : inner(h);
    return std::make_tuple(h * scale, h.relu().mean());
  };

  auto out = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  for (int64_t step = 0; step < in.integer("steps"); ++step) {
    const std::string prefix = std::to_string(step) + "/";
    for (auto& w : p) w.mutable_grad().reset();
    torch::Tensor loss;
    {
      amp::AutocastGuard guard(device.type(),
                               autocast == "float16" ? torch::kHalf : torch::kBFloat16,
                               autocast != "none");
      const auto [a, m] = amp::checkpoint(options, outer, xs[step], in.real("scale"));
      const auto y = torch::linear(a, p[4], p[5]);
      loss = torch::mse_loss(y.to(torch::kFloat), ys[step]) + m.to(torch::kFloat);
    }
    loss.backward();
    out.insert(prefix + "loss", loss.detach().cpu());
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < p.size(); ++i) {
      out.insert(prefix + "grad/" + std::to_string(i), p[i].grad().cpu().clone());
      p[i].sub_(p[i].grad() * lr);
      out.insert(prefix + "param/" + std::to_string(i), p[i].detach().cpu().clone());
    }
  }
  amp_parity::write_pickle(out, argv[2]);
  return 0;
}
