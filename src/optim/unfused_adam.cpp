// amp::optim::Adam and AdamW: the ATen ops of Python's single-tensor Adam step
// (torch/optim/adam.py, _single_tensor_adam) in its order, over LibTorch's Adam/AdamW options and
// state. Calling the same kernels with the same scalars is what makes the bits equal.
#include <amp/optim/unfused_adam.h>

#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>

#include "optim/adam_checks.h"
#include "optim/fused_optimizer.h"

namespace amp::optim {

namespace {

// The defaults and every group's own options, checked before LibTorch's constructor sees them:
// its messages name no fix, and it silently replaces a group's options of another type by the
// defaults.
template <typename Options>
Options checked(const std::vector<torch::optim::OptimizerParamGroup>& groups, Options defaults,
                const char* name) {
  detail::check_adam(defaults, name);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].has_options()) continue;
    const auto* options = dynamic_cast<const Options*>(&groups[g].options());
    TORCH_CHECK(options != nullptr, name, ": the options of param group ", g, " are not ",
                (std::is_same_v<Options, torch::optim::AdamOptions> ? "torch::optim::AdamOptions"
                                                                    : "torch::optim::AdamWOptions"),
                "; pass the optimizer's own options type, or leave the group's options out to use "
                "the defaults.");
    detail::check_adam(*options, detail::group_where(name, g));
  }
  return defaults;
}

// A Python number as Python's binding passes it to a tensor op: a wrapped double tensor.
// LibTorch's Tensor::mul_(Scalar) (aten::mul_.Scalar) rounds the factor to a bfloat16/float16
// tensor's dtype first (its bits are those of a multiply by a bf16 0-dim tensor), where ATen
// multiplies by a wrapped number in float32.
at::Tensor python_number(double value) { return at::native::wrapped_scalar_tensor(value); }

// Python's step for one parameter with a gradient. `step` is the count after this step.
template <typename Options>
void adam_update(at::Tensor param, at::Tensor grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                 at::Tensor max_exp_avg_sq, int64_t step, const Options& o, bool decoupled) {
  if (o.weight_decay() != 0) {
    if (decoupled) {
      // Python rounds lr * weight_decay before subtracting it from 1. A separate statement:
      // -ffp-contract=on (clang's default) fuses a multiply-add only within one expression.
      const double decay = o.lr() * o.weight_decay();
      param.mul_(python_number(1 - decay));
    } else {
      grad = grad.add(param, o.weight_decay());
    }
  }
  if (param.is_complex()) {  // Python steps complex tensors as their real views
    grad = at::view_as_real(grad);
    exp_avg = at::view_as_real(exp_avg);
    exp_avg_sq = at::view_as_real(exp_avg_sq);
    if (max_exp_avg_sq.defined()) max_exp_avg_sq = at::view_as_real(max_exp_avg_sq);
    param = at::view_as_real(param);
  }
  const auto [beta1, beta2] = o.betas();
  exp_avg.lerp_(grad, 1 - beta1);
  exp_avg_sq.mul_(python_number(beta2)).addcmul_(grad, grad, 1 - beta2);
  // Python's scalars are doubles from the float step count: the same libm pow.
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  const double step_size = o.lr() / bias_correction1;
  const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
  at::Tensor denom;
  if (o.amsgrad()) {
    at::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
    denom = max_exp_avg_sq.sqrt()
                .div(python_number(bias_correction2_sqrt))
                .add_(python_number(o.eps()));
  } else {
    denom =
        exp_avg_sq.sqrt().div(python_number(bias_correction2_sqrt)).add_(python_number(o.eps()));
  }
  param.addcdiv_(exp_avg, denom, -step_size);
}

template <typename Options, typename State>
at::Tensor python_adam_step(torch::optim::Optimizer& optimizer,
                            const torch::optim::Optimizer::LossClosure& closure, bool decoupled,
                            const char* name) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& groups = optimizer.param_groups();
  // Every gradient is checked before any parameter moves.
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      TORCH_CHECK(!params[i].grad().defined() || !params[i].grad().is_sparse(),
                  detail::group_where(name, g), ": parameter ", i,
                  " has a sparse gradient, which Adam cannot use; use a dense gradient.");
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& options = static_cast<const Options&>(groups[g].options());
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& param = params[i];
      if (!param.grad().defined()) continue;
      auto& slot = optimizer.state()[param.unsafeGetTensorImpl()];
      if (!slot) {  // Python's _init_group: zeros, the step count at 0
        auto fresh = std::make_unique<State>();
        fresh->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<State&>(*slot);
      if (options.amsgrad() && !state.max_exp_avg_sq().defined()) {
        state.max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
      }
      state.step(state.step() + 1);
      adam_update(param, param.grad(), state.exp_avg(), state.exp_avg_sq(), state.max_exp_avg_sq(),
                  state.step(), options, decoupled);
    }
  }
  return loss;
}

}  // namespace

// The two classes differ only in LibTorch's base, its options and state types, and whether the
// weight decay is decoupled.
#define AMP_PYTHON_ADAM_MEMBERS(Class, Options, State, decoupled)                                  \
  Class::Class(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,                 \
               torch::optim::Options defaults)                                                     \
      : torch::optim::Class(param_groups,                                                          \
                            checked(param_groups, std::move(defaults), "amp::optim::" #Class)) {}  \
  Class::Class(std::vector<at::Tensor> params, torch::optim::Options defaults)                     \
      : Class({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}      \
  at::Tensor Class::step(LossClosure closure) {                                                    \
    return python_adam_step<torch::optim::Options, torch::optim::State>(*this, closure, decoupled, \
                                                                        "amp::optim::" #Class);    \
  }

AMP_PYTHON_ADAM_MEMBERS(Adam, AdamOptions, AdamParamState, /*decoupled=*/false)
AMP_PYTHON_ADAM_MEMBERS(AdamW, AdamWOptions, AdamWParamState, /*decoupled=*/true)

#undef AMP_PYTHON_ADAM_MEMBERS

}  // namespace amp::optim
