// Shared helpers of the GradScaler test suites: small parameter sets and optimizers with grads,
// and the names the suites use unqualified.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>
#include <catch2/catch.hpp>

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

/// One whole iteration with a finite gradient (ones) on a fresh one-element parameter: scale(),
/// step() with a zero-lr SGD, update().
inline void clean_iteration(amp::GradScaler& scaler) {
  auto param = make_param(1);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.scale(torch::ones({}));
  set_grad(param, torch::ones({1}));
  scaler.step(optimizer);
  scaler.update();
}

/// A scaler on the CPU with the given options (every test machine has a CPU).
inline amp::GradScaler cpu_scaler(amp::GradScalerOptions options = {}) {
  return amp::GradScaler(c10::DeviceType::CPU, std::move(options));
}

}  // namespace amp_test

// The GradScaler suites' common names, brought in for the whole test file that includes this.
using amp::GradScaler;
using amp::GradScalerOptions;
using amp_test::cpu_scaler;
using amp_test::make_param;
using amp_test::set_grad;
using Catch::Contains;
