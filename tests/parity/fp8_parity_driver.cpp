// C++ twin of fp8_parity.py's reference training: the same MLP converted by
// amp::fp8::convert_to_float8_training, trained with SGD inside a Float8AutocastGuard (and
// amp::AutocastGuard / amp::GradScaler where the scenario asks), recording what Python records.
#include <torch/torch.h>

#include <string>
#include <vector>

#include <amp/autocast.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>

#include "parity_driver_support.h"

namespace {

using amp_parity::Inputs;

c10::ScalarType dtype_named(const std::string& name) {
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kHalf;
  return torch::kFloat;
}

amp::fp8::Recipe recipe_of(const Inputs& in) {
  const auto name = in.text("recipe");
  if (name != "delayed") return amp::fp8::Recipe::from_name(name);
  return amp::fp8::Recipe::delayed(
      amp::fp8::DelayedScalingOptions()
          .amax_history_len(in.integer("history_len"))
          .amax_compute_algo(in.text("algo") == "max" ? amp::fp8::AmaxComputeAlgo::max
                                                      : amp::fp8::AmaxComputeAlgo::most_recent)
          .margin(in.integer("margin"))
          .fp8_format(in.text("fp8_format") == "hybrid" ? amp::fp8::Float8Format::hybrid
                                                        : amp::fp8::Float8Format::e4m3));
}

}  // namespace

int main(int argc, char** argv) {
  TORCH_CHECK(argc == 3, "usage: fp8_parity_driver INPUTS OUTPUT");
  const Inputs in(argv[1]);
  const torch::Device device(in.text("device"));
  const auto dtype = dtype_named(in.text("dtype"));
  const bool bias = in.integer("bias") != 0;
  const auto weights = in.tensors("weights");
  const auto xs = in.tensors("xs");
  const auto ys = in.tensors("ys");

  torch::nn::Sequential model(
      torch::nn::Linear(
          torch::nn::LinearOptions(in.integer("in_features"), in.integer("hidden")).bias(bias)),
      torch::nn::ReLU(),
      torch::nn::Linear(
          torch::nn::LinearOptions(in.integer("hidden"), in.integer("out_features")).bias(bias)));
  {
    torch::NoGradGuard no_grad;
    auto first = model[0]->as<torch::nn::LinearImpl>();
    auto second = model[2]->as<torch::nn::LinearImpl>();
    first->weight.copy_(weights[0]);
    second->weight.copy_(weights[2]);
    if (bias) {
      first->bias.copy_(weights[1]);
      second->bias.copy_(weights[3]);
    }
  }
  model->to(device, dtype);
  const auto converted = amp::fp8::convert_to_float8_training(*model, recipe_of(in));
  TORCH_CHECK(converted.size() == 2, "expected both Linear layers converted");

  auto params = model->parameters();
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(in.real("lr")));
  const double init_scale = in.real("scaler");
  std::optional<amp::GradScaler> scaler;
  if (init_scale > 0) {
    scaler.emplace(device.type(),
                   amp::GradScalerOptions().init_scale(init_scale).growth_interval(2));
  }
  const auto autocast = in.text("autocast");
  const bool delayed = in.text("recipe") == "delayed";

  c10::impl::GenericDict out(c10::StringType::get(), c10::TensorType::get());
  auto put = [&](int64_t step, const std::string& key, const torch::Tensor& value) {
    out.insert(std::to_string(step) + "/" + key, value.detach().cpu().clone());
  };
  amp::fp8::Float8AutocastGuard float8;
  for (int64_t step = 0; step < in.integer("steps"); ++step) {
    auto x = xs[step].to(device, dtype).requires_grad_(true);
    auto y = ys[step].to(device);
    optimizer.zero_grad();
    torch::Tensor output;
    if (autocast != "none") {
      amp::AutocastGuard region(amp::AutocastOptions(device.type()).dtype(dtype_named(autocast)));
      output = model->forward(x);
    } else {
      output = model->forward(x);
    }
    auto loss = torch::mse_loss(output.to(torch::kFloat), y);
    (scaler ? scaler->scale(loss) : loss).backward();
    put(step, "loss", loss);
    put(step, "output", output);
    put(step, "grad_input", x.grad());
    for (size_t i = 0; i < params.size(); ++i)
      put(step, "grad" + std::to_string(i), params[i].grad());
    if (scaler) {
      scaler->step(optimizer);
      scaler->update();
      put(step, "scale", scaler->scale_tensor());
    } else {
      optimizer.step();
    }
    for (size_t i = 0; i < params.size(); ++i) put(step, "param" + std::to_string(i), params[i]);
    if (delayed) {
      for (int layer = 0; layer < 2; ++layer) {
        for (const auto& buffer : model[layer * 2]->named_buffers()) {
          put(step, "layer" + std::to_string(layer) + "/" + buffer.key(), buffer.value());
        }
      }
    }
  }
  amp_parity::write_pickle(out, argv[2]);
  return 0;
}
