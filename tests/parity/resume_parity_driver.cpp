// The C++ side of resume_parity.py: the same model, bf16 autocast, GradScaler and optimizer as the
// Python side, moving the run through Python's checkpoint files (amp/state_dict.h).
//
//   amp_resume_parity_driver resume KIND DEVICE INPUTS CHECKPOINT FINAL
//       loads Python's checkpoint and trains steps k..2k-1
//   amp_resume_parity_driver start KIND DEVICE INPUTS CHECKPOINT FINAL
//       trains steps 0..k-1 from its own initial weights, writes the checkpoint, trains on
// then writes {"model", "optimizer", "scaler"} to FINAL. KIND: adamw_fused, adamw, sgd_fused
// or sgd.
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <amp/amp.h>

namespace {

std::vector<torch::Tensor> tensors(const c10::impl::GenericDict& dict, const char* key,
                                   const torch::Device& device) {
  std::vector<torch::Tensor> out;
  const c10::IValue list = dict.at(key);  // toListRef() refers into it
  for (const c10::IValue& item : list.toListRef()) out.push_back(item.toTensor().to(device));
  return out;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        const std::vector<torch::Tensor>& params) {
  if (kind == "adamw_fused") {
    return std::make_unique<amp::optim::FusedAdamW>(
        params, amp::optim::FusedAdamWOptions(0.01).betas({0.9, 0.99}).weight_decay(0.01));
  }
  if (kind == "adamw") {
    return std::make_unique<amp::optim::AdamW>(
        params, torch::optim::AdamWOptions(0.01).betas({0.9, 0.99}).weight_decay(0.01));
  }
  if (kind == "sgd_fused") {
    return std::make_unique<amp::optim::FusedSGD>(
        params, amp::optim::FusedSGDOptions(0.05).momentum(0.9).weight_decay(0.01));
  }
  TORCH_CHECK(kind == "sgd", "unknown optimizer kind ", kind);
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: amp_resume_parity_driver resume|start KIND DEVICE INPUTS CHECKPOINT "
                 "FINAL\n";
    return 2;
  }
  const std::string mode = argv[1], kind = argv[2], checkpoint = argv[5], final_path = argv[6];
  const torch::Device device(argv[3]);
  const auto inputs = amp::load_pickled(argv[4]).toGenericDict();
  const auto xs = tensors(inputs, "xs", device);
  const auto ys = tensors(inputs, "ys", device);
  const int64_t k = inputs.at("k").toInt();

  torch::manual_seed(11);  // the starting side's own weights; a resumed run loads Python's
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 4));
  model->to(device);
  auto optimizer = make_optimizer(kind, model->parameters());
  amp::GradScaler scaler(device.type(),
                         amp::GradScalerOptions().init_scale(1024.0).growth_interval(2));
  int64_t first = 0;
  if (mode == "resume") {
    const auto saved = amp::load_pickled(checkpoint).toGenericDict();
    amp::load_state_dict(*model, saved.at("model"));
    amp::load_optimizer_state_dict(*optimizer, saved.at("optimizer"));
    scaler.load_state_dict(saved.at("scaler").toGenericDict());
    first = saved.at("step").toInt();
  }
  const auto state = [&] {
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    out.insert("model", amp::state_dict(*model));
    out.insert("optimizer", amp::optimizer_state_dict(*optimizer));
    out.insert("scaler", scaler.state_dict());
    return out;
  };
  for (int64_t step = first; step < 2 * k; ++step) {
    if (mode == "start" && step == k) {
      auto saved = state();
      saved.insert("step", k);
      amp::save_pickled(saved, checkpoint);
    }
    optimizer->zero_grad();
    torch::Tensor out;
    {
      amp::AutocastGuard autocast(device.type(), torch::kBFloat16);
      out = model->forward(xs[step]);
    }
    const torch::Tensor loss = (out.to(torch::kFloat) - ys[step]).pow(2).mean();
    scaler.scale(loss).backward();
    scaler.step(*optimizer);
    scaler.update();
  }
  amp::save_pickled(state(), final_path);
  return 0;
}
