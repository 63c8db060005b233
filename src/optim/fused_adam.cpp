// FusedAdam and FusedAdamW: Python's fused Adam step (torch/optim/adam.py, _fused_adam) over
// at::_fused_adam_ / at::_fused_adamw_, their options and state in LibTorch's Adam layout.
#include <cmath>
#include <functional>
#include <type_traits>

#include <ATen/ATen.h>

#include <amp/optim/adam.h>

#include "optim/adam_checks.h"
#include "optim/field_list.h"
#include "optim/fused_optimizer.h"

namespace amp::optim {

namespace {

// ---- the options, for both types ----

// The fields of FusedAdamOptions and FusedAdamWOptions: LibTorch's AdamOptions entries first
// (torch::optim::Adam/AdamW read them), then maximize and capturable, which its archives lack.
template <typename AdamOptions>
const auto& adam_fields() {
  static const detail::OptionList fields(
      AMP_OPTIMIZER_FIELDS(AdamOptions, kYes, lr, betas, eps, weight_decay, amsgrad),
      AMP_OPTIMIZER_FIELDS(AdamOptions, kNo, maximize, capturable));
  return fields;
}

// ---- the step and the saved state, for both types ----

using detail::StateMap;

// Zero state for a parameter's first step (Python's _init_group for fused=True).
FusedAdamParamState& state_for(StateMap& states, const at::Tensor& param, bool amsgrad) {
  auto& slot = states[param.unsafeGetTensorImpl()];
  if (!slot) {
    auto fresh = std::make_unique<FusedAdamParamState>();
    fresh->step(at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(param.device())));
    fresh->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  auto& state = static_cast<FusedAdamParamState&>(*slot);
  // A state loaded from a run without amsgrad has no maximum yet.
  if (amsgrad && !state.max_exp_avg_sq().defined()) {
    state.max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
  }
  return state;
}

// One dtype bucket of low-precision parameters through amp's step engine: moments in the plan's
// dtype (converted when a checkpoint or an options change left another), and the master copy or
// compensation the plan needs.
template <typename AdamOptions>
void adam_low_precision(const detail::EngineBucket& bucket, const AdamOptions& o, bool decoupled) {
  using Rule = detail::engine::AdamRule;
  const auto [beta1, beta2] = o.betas();
  const detail::AdamHyper hyper{o.lr(),           beta1,       beta2,        o.eps(),
                                o.weight_decay(), o.amsgrad(), o.maximize(), decoupled};
  detail::step_on_engine<Rule, FusedAdamParamState>(
      bucket, o, hyper,
      [&](FusedAdamParamState& state, const at::Tensor& param, detail::StepSlot& slot) {
        const c10::ScalarType dtype = bucket.plan.state_dtype;
        state.exp_avg(detail::state_tensor(state.exp_avg(), param, dtype));
        state.exp_avg_sq(detail::state_tensor(state.exp_avg_sq(), param, dtype));
        if (o.amsgrad()) {
          state.max_exp_avg_sq(detail::state_tensor(state.max_exp_avg_sq(), param, dtype));
        }
        slot.state[Rule::kExpAvg] = state.exp_avg();
        slot.state[Rule::kExpAvgSq] = state.exp_avg_sq();
        if (o.amsgrad()) slot.state[Rule::kMaxExpAvgSq] = state.max_exp_avg_sq();
      });
}

// One group's step; `decoupled` is AdamW's weight decay, `lr_tensor` the capturable lr.
template <typename AdamOptions, typename LrTensor>
void adam_step_group(StateMap& states, const AdamOptions& o, bool decoupled,
                     const detail::GroupWork& work, const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf, LrTensor lr_tensor,
                     const detail::ParamPositions& positions, const std::string& where) {
  const auto [beta1, beta2] = o.betas();
  for (const auto& [dtype, params] : work.params_by_dtype) {
    if (const auto plan = detail::low_precision_plan(o, dtype)) {
      adam_low_precision({states, *plan, params, positions, grad_scale, found_inf, where}, o,
                         decoupled);
      continue;
    }
    std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    for (const at::Tensor& param : params) {
      auto& state = state_for(states, param, o.amsgrad());
      grads.push_back(param.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      if (o.amsgrad()) max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      steps.push_back(state.step());
    }
    // Python's sequence: count the step, run the kernel (which unscales the gradients and skips
    // everything when found_inf is 1), then take the count back by found_inf.
    at::_foreach_add_(steps, 1);
    const auto run = [&](const auto& lr) {
      if (decoupled) {
        at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1,
                          beta2, o.weight_decay(), o.eps(), o.amsgrad(), o.maximize(), grad_scale,
                          found_inf);
      } else {
        at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1,
                         beta2, o.weight_decay(), o.eps(), o.amsgrad(), o.maximize(), grad_scale,
                         found_inf);
      }
    };
    if (o.capturable()) {
      run(lr_tensor());
    } else {
      run(o.lr());
    }
    if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
  }
}

template <typename AdamOptions>
std::unique_ptr<FusedAdamParamState> adam_loaded_state(const at::Tensor& param,
                                                       const FusedAdamParamState& saved,
                                                       const AdamOptions& options,
                                                       const std::string& where) {
  auto state = std::make_unique<FusedAdamParamState>();
  const c10::ScalarType dtype = detail::state_dtype_for(options, param.scalar_type());
  const auto moved = [&](const at::Tensor& t, const char* key) {
    return detail::loaded_state_tensor(t, param, dtype, key, where);
  };
  TORCH_CHECK(saved.exp_avg().defined() && saved.exp_avg_sq().defined(), where,
              " lacks exp_avg or exp_avg_sq; the checkpoint is not an Adam checkpoint. The "
              "optimizer is unchanged.");
  const float count = saved.step().item<float>();
  TORCH_CHECK(std::isfinite(count) && count >= 0 && count == std::floor(count), where,
              " has a step count of ", count,
              "; a count is a whole number >= 0. The optimizer is unchanged.");
  state->step(saved.step().to(param.device(), at::kFloat, false, /*copy=*/true));
  state->exp_avg(moved(saved.exp_avg(), "exp_avg"));
  state->exp_avg_sq(moved(saved.exp_avg_sq(), "exp_avg_sq"));
  state->max_exp_avg_sq(moved(saved.max_exp_avg_sq(), "max_exp_avg_sq"));
  detail::load_write_back_state(*state, saved, param,
                                detail::low_precision_plan(options, param.scalar_type()), where);
  return state;
}

}  // namespace

// ---- options and state ----

FusedAdamOptions::FusedAdamOptions(double lr) { this->lr(lr); }
FusedAdamWOptions::FusedAdamWOptions(double lr) { this->lr(lr); }

namespace {

// FusedAdamParamState's tensors: LibTorch's AdamParamState entries (the step count as its int64),
// then the low-precision options' (LibTorch's Adam reads past them).
const auto& adam_state_fields() {
  static const detail::StateList fields(
      AMP_STATE_FIELDS(FusedAdamParamState, kStepCount, step),
      AMP_STATE_FIELDS(FusedAdamParamState, kTensor, exp_avg, exp_avg_sq, max_exp_avg_sq,
                       master_weight, kahan_comp));
  return fields;
}

}  // namespace

AMP_SERIALIZE_FROM_FIELDS(FusedAdamOptions, adam_fields<FusedAdamOptions>)
AMP_SERIALIZE_FROM_FIELDS(FusedAdamWOptions, adam_fields<FusedAdamWOptions>)
AMP_SERIALIZE_FROM_FIELDS(FusedAdamParamState, adam_state_fields)

// ---- the optimizers ----

namespace detail {
template class FusedOptimizer<FusedAdamOptions, FusedAdamParamState>;
template class FusedOptimizer<FusedAdamWOptions, FusedAdamParamState>;
}  // namespace detail

// The four hooks of FusedAdam and FusedAdamW: the templates above, over each one's options.
namespace {

template <typename Options>
void step_adam_group(StateMap& states, const Options& options, const detail::GroupWork& work,
                     const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf,
                     const detail::ParamPositions& positions, const std::string& where,
                     const std::function<at::Tensor()>& lr_tensor) {
  constexpr bool decoupled = std::is_same_v<Options, FusedAdamWOptions>;
  adam_step_group(states, options, decoupled, work, grad_scale, found_inf, lr_tensor, positions,
                  where);
}

}  // namespace

// FusedAdam and FusedAdamW differ only in their options type (AdamW's decoupled weight decay):
// their constructors and four hooks are the templates above, written once for both.
#define AMP_DEFINE_ADAM_OPTIMIZER(Optimizer)                                                      \
  Optimizer::Optimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,               \
                       Optimizer##Options defaults)                                               \
      : FusedOptimizer(#Optimizer, defaults) {                                                    \
    add_param_groups(std::move(param_groups));                                                    \
  }                                                                                               \
  Optimizer::Optimizer(std::vector<at::Tensor> params, Optimizer##Options defaults)               \
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {} \
  void Optimizer::check_options(const Optimizer##Options& options, const std::string& where)      \
      const {                                                                                     \
    detail::check_adam(options, where);                                                           \
  }                                                                                               \
  Optimizer##Options Optimizer::merge_options(const Optimizer##Options& group,                    \
                                              const Optimizer##Options& defaults) const {         \
    return adam_fields<Optimizer##Options>().merge(group, defaults);                              \
  }                                                                                               \
  void Optimizer::step_group(                                                                     \
      size_t group_index, const Optimizer##Options& options, const detail::GroupWork& work,       \
      const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {  \
    step_adam_group(state_, options, work, grad_scale, found_inf,                                 \
                    detail::ParamPositions(param_groups_, param_positions()),                     \
                    detail::group_where(name(), group_index),                                     \
                    [&] { return lr_tensor(group_index, options.lr(), work.device); });           \
  }                                                                                               \
  std::unique_ptr<FusedAdamParamState> Optimizer::loaded_state(                                   \
      const at::Tensor& param, const FusedAdamParamState& saved,                                  \
      const Optimizer##Options& options, const std::string& where) const {                        \
    return adam_loaded_state(param, saved, options, where);                                       \
  }

AMP_DEFINE_ADAM_OPTIMIZER(FusedAdam)
AMP_DEFINE_ADAM_OPTIMIZER(FusedAdamW)

#undef AMP_DEFINE_ADAM_OPTIMIZER

}  // namespace amp::optim
