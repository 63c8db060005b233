// Shared helpers of the GradScaler test suites: small parameter sets and optimizers with grads.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

#include <amp/grad_scaler.h>

namespace amp_test {

/// An empty Dict<std::string, IValue> (the type has no default constructor).
inline c10::Dict<std::string, c10::IValue> make_state_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

/// A float32 parameter of `n` ones that requires grad.
inline torch::Tensor make_param(int64_t n = 4) {
  return torch::ones({n}, torch::kFloat).requires_grad_(true);
}

/// Sets `param`'s gradient to `grad` (a copy).
inline void set_grad(torch::Tensor& param, const torch::Tensor& grad) {
  param.mutable_grad() = grad.clone();
}

/// A scaler on the CPU with the given options (every test machine has a CPU).
inline amp::GradScaler cpu_scaler(amp::GradScalerOptions options = {}) {
  return amp::GradScaler(c10::DeviceType::CPU, std::move(options));
}

}  // namespace amp_test
