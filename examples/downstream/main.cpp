// One mixed-precision training step with amp: the forward pass under amp::AutocastGuard, the
// backward pass and the optimizer step through amp::GradScaler. Exits 1 if the step misbehaved.
#include <amp/amp.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

int main() {
  // float16 autocast with loss scaling: on the GPU when there is one, else on the CPU.
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  torch::manual_seed(0);
  torch::nn::Linear model(16, 4);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler(device.type());
  const torch::Tensor inputs = torch::randn({8, 16}, device);
  const torch::Tensor targets =
      torch::randint(4, {8}, torch::TensorOptions(device).dtype(torch::kLong));
  const torch::Tensor before = model->weight.detach().clone();

  torch::Tensor logits, loss;
  {
    amp::AutocastGuard autocast(device.type(), torch::kHalf);
    logits = model(inputs);                                        // float16: linear is autocast's
    loss = torch::nn::functional::cross_entropy(logits, targets);  // float32: a loss is not
  }
  optimizer.zero_grad();
  scaler.scale(loss).backward();  // gradients of loss * scale: small ones survive float16
  scaler.step(optimizer);         // unscales; steps only if no gradient overflowed
  scaler.update();                // adapts the scale for the next iteration

  std::cout << "amp " << amp::version() << " on " << device << ": logits " << logits.scalar_type()
            << ", loss " << loss.scalar_type() << " = " << loss.item<float>() << ", loss scale "
            << scaler.get_scale() << "\n";
  const bool ok = logits.scalar_type() == torch::kHalf && loss.scalar_type() == torch::kFloat &&
                  std::isfinite(loss.item<float>()) && !model->weight.detach().equal(before);
  std::cout << (ok ? "the step trained the model\n" : "the step did not behave as expected\n");
  return ok ? 0 : 1;
}
