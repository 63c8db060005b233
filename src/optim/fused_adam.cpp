// FusedAdam and FusedAdamW: Python's fused Adam step (torch/optim/adam.py, _fused_adam) over
// at::_fused_adam_ / at::_fused_adamw_, their options and state in LibTorch's Adam layout.
#include <cmath>
#include <functional>
#include <type_traits>

#include <ATen/ATen.h>

#include <amp/optim/adam.h>

#include "optim/fused_optimizer.h"

namespace amp::optim {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

namespace {

// ---- the options, for both types ----

template <typename AdamOptions>
void check_adam(const AdamOptions& options, const std::string& where) {
  detail::check_finite_at_least(options.lr(), 0.0, "lr", where,
                                "pass a learning rate such as 1e-3.");
  detail::check_finite_at_least(options.eps(), 0.0, "eps", where, "the default is 1e-8.");
  detail::check_finite_at_least(options.weight_decay(), 0.0, "weight_decay", where,
                                "pass 0 for no weight decay.");
  const auto [beta1, beta2] = options.betas();
  TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, where,
              ": betas[0] must be in [0, 1). Got betas[0]=", beta1, "; the default is 0.9.");
  TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, where,
              ": betas[1] must be in [0, 1). Got betas[1]=", beta2, "; the default is 0.999.");
}

// Python's rule: each option the group set, the others from the optimizer's defaults.
template <typename AdamOptions>
AdamOptions merge_adam(const AdamOptions& group, const AdamOptions& defaults) {
  AdamOptions merged = defaults;
  AMP_TAKE_IF_SET(merged, group, lr);
  AMP_TAKE_IF_SET(merged, group, betas);
  AMP_TAKE_IF_SET(merged, group, eps);
  AMP_TAKE_IF_SET(merged, group, weight_decay);
  AMP_TAKE_IF_SET(merged, group, amsgrad);
  AMP_TAKE_IF_SET(merged, group, maximize);
  AMP_TAKE_IF_SET(merged, group, capturable);
  detail::merge_low_precision(merged, group);
  return merged;
}

template <typename AdamOptions>
bool equal_adam(const AdamOptions& lhs, const AdamOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.amsgrad() == rhs.amsgrad() &&
         lhs.maximize() == rhs.maximize() && lhs.capturable() == rhs.capturable() &&
         detail::equal_low_precision(lhs, rhs);
}

template <typename AdamOptions>
void write_adam_options(const AdamOptions& options, OutputArchive& archive) {
  // LibTorch's AdamOptions entries first, so torch::optim::Adam/AdamW can read them.
  archive.write("lr", c10::IValue(options.lr()));
  archive.write("betas", c10::IValue(options.betas()));
  archive.write("eps", c10::IValue(options.eps()));
  archive.write("weight_decay", c10::IValue(options.weight_decay()));
  archive.write("amsgrad", c10::IValue(options.amsgrad()));
  archive.write("maximize", c10::IValue(options.maximize()));
  archive.write("capturable", c10::IValue(options.capturable()));
  detail::write_low_precision(options, archive);
}

template <typename AdamOptions>
void read_adam_options(AdamOptions& options, InputArchive& archive) {
  using detail::read_bool;
  using detail::read_double;
  options.lr(read_double(archive, "lr", true, 0.0))
      .betas(detail::read_betas(archive))
      .eps(read_double(archive, "eps", true, 0.0))
      .weight_decay(read_double(archive, "weight_decay", true, 0.0))
      .amsgrad(read_bool(archive, "amsgrad", true, false))
      // Absent from LibTorch's checkpoints.
      .maximize(read_bool(archive, "maximize", false, false))
      .capturable(read_bool(archive, "capturable", false, false));
  detail::read_low_precision(options, archive);
}

// ---- the step and the checkpoint state, for both types ----

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
void adam_low_precision(StateMap& states, const AdamOptions& o, bool decoupled,
                        const detail::LowPrecisionPlan& plan, const std::vector<at::Tensor>& params,
                        const detail::ParamPositions& positions,
                        const std::optional<at::Tensor>& grad_scale,
                        const std::optional<at::Tensor>& found_inf, const std::string& where) {
  std::vector<detail::StepSlot> slots;
  for (const at::Tensor& param : params) {
    detail::check_low_precision_param(param, positions.of(param), where);
    auto& entry = states[param.unsafeGetTensorImpl()];
    if (!entry) entry = std::make_unique<FusedAdamParamState>();
    auto& state = static_cast<FusedAdamParamState&>(*entry);
    at::Tensor step = state.step(), master = state.master_weight(), comp = state.kahan_comp();
    detail::StepSlot slot =
        detail::engine_slot(param, positions.of(param), step, master, comp, plan);
    state.step(step).master_weight(master).kahan_comp(comp);
    const c10::ScalarType dtype = plan.state_dtype;
    state.exp_avg(detail::state_tensor(state.exp_avg(), param, dtype));
    state.exp_avg_sq(detail::state_tensor(state.exp_avg_sq(), param, dtype));
    if (o.amsgrad())
      state.max_exp_avg_sq(detail::state_tensor(state.max_exp_avg_sq(), param, dtype));
    slot.state0 = state.exp_avg();
    slot.state1 = state.exp_avg_sq();
    slot.state2 = o.amsgrad() ? state.max_exp_avg_sq() : at::Tensor();
    slots.push_back(std::move(slot));
  }
  const auto [beta1, beta2] = o.betas();
  detail::run_rule_step<detail::lp::AdamRule>(
      slots,
      detail::AdamHyper{o.lr(), beta1, beta2, o.eps(), o.weight_decay(), o.amsgrad(), o.maximize(),
                        decoupled},
      detail::step_args(o, plan, grad_scale, found_inf));
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
      adam_low_precision(states, o, decoupled, *plan, params, positions, grad_scale, found_inf,
                         where);
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
  // Kept only where the loaded options use them (the first step creates them when missing).
  const auto plan = detail::low_precision_plan(options, param.scalar_type());
  if (plan && plan->write_back == detail::WriteBack::kMasterWeights) {
    state->master_weight(detail::loaded_state_tensor(saved.master_weight(), param, at::kFloat,
                                                     "master_weight", where));
  }
  if (plan && plan->write_back == detail::WriteBack::kKahan) {
    state->kahan_comp(detail::loaded_state_tensor(saved.kahan_comp(), param, param.scalar_type(),
                                                  "kahan_comp", where));
  }
  return state;
}

}  // namespace

// ---- options and state ----

FusedAdamOptions::FusedAdamOptions(double lr) { this->lr(lr); }
FusedAdamWOptions::FusedAdamWOptions(double lr) { this->lr(lr); }

void FusedAdamOptions::serialize(OutputArchive& archive) const {
  write_adam_options(*this, archive);
}
void FusedAdamOptions::serialize(InputArchive& archive) { read_adam_options(*this, archive); }
void FusedAdamWOptions::serialize(OutputArchive& archive) const {
  write_adam_options(*this, archive);
}
void FusedAdamWOptions::serialize(InputArchive& archive) { read_adam_options(*this, archive); }

bool operator==(const FusedAdamOptions& lhs, const FusedAdamOptions& rhs) {
  return equal_adam(lhs, rhs);
}
bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs) {
  return equal_adam(lhs, rhs);
}

void FusedAdamParamState::serialize(OutputArchive& archive) const {
  // LibTorch's AdamParamState keeps the count as an int64: written that way, each library reads
  // the other's checkpoints. The count is exact in float32 up to 2^24 steps.
  archive.write("step", c10::IValue(step().defined() ? static_cast<int64_t>(step().item<float>())
                                                     : int64_t{0}));
  detail::write_tensor(archive, "exp_avg", exp_avg());
  detail::write_tensor(archive, "exp_avg_sq", exp_avg_sq());
  detail::write_tensor(archive, "max_exp_avg_sq", max_exp_avg_sq());
  detail::write_tensor(archive, "master_weight", master_weight());
  detail::write_tensor(archive, "kahan_comp", kahan_comp());
}

void FusedAdamParamState::serialize(InputArchive& archive) {
  c10::IValue count;
  TORCH_CHECK(archive.try_read("step", count), "a state entry has no \"step\"");
  if (count.isInt()) {
    TORCH_CHECK(count.toInt() >= 0 && count.toInt() <= (int64_t{1} << 24),
                "a state entry's step count ", count.toInt(), " is outside [0, 2^24]");
    step(at::full({}, static_cast<double>(count.toInt()), at::kFloat));
  } else {
    TORCH_CHECK(count.isTensor() && count.toTensor().numel() == 1,
                "a state entry's \"step\" is neither an integer nor a 1-element tensor");
    step(count.toTensor().reshape(at::IntArrayRef{}).to(at::kFloat));
  }
  exp_avg(detail::read_tensor(archive, "exp_avg"));
  exp_avg_sq(detail::read_tensor(archive, "exp_avg_sq"));
  max_exp_avg_sq(detail::read_tensor(archive, "max_exp_avg_sq"));
  master_weight(detail::read_tensor(archive, "master_weight"));
  kahan_comp(detail::read_tensor(archive, "kahan_comp"));
}

bool operator==(const FusedAdamParamState& lhs, const FusedAdamParamState& rhs) {
  return detail::same_tensor(lhs.step(), rhs.step()) &&
         detail::same_tensor(lhs.exp_avg(), rhs.exp_avg()) &&
         detail::same_tensor(lhs.exp_avg_sq(), rhs.exp_avg_sq()) &&
         detail::same_tensor(lhs.max_exp_avg_sq(), rhs.max_exp_avg_sq()) &&
         detail::same_tensor(lhs.master_weight(), rhs.master_weight()) &&
         detail::same_tensor(lhs.kahan_comp(), rhs.kahan_comp());
}

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
                     const std::vector<torch::optim::OptimizerParamGroup>& groups,
                     const std::string& where, const std::function<at::Tensor()>& lr_tensor) {
  constexpr bool decoupled = std::is_same_v<Options, FusedAdamWOptions>;
  const detail::ParamPositions positions(groups);
  adam_step_group(states, options, decoupled, work, grad_scale, found_inf, lr_tensor, positions,
                  where);
}

}  // namespace

void FusedAdam::check_options(const FusedAdamOptions& options, const std::string& where) const {
  check_adam(options, where);
}
void FusedAdamW::check_options(const FusedAdamWOptions& options, const std::string& where) const {
  check_adam(options, where);
}

FusedAdamOptions FusedAdam::merge_options(const FusedAdamOptions& group,
                                          const FusedAdamOptions& defaults) const {
  return merge_adam(group, defaults);
}
FusedAdamWOptions FusedAdamW::merge_options(const FusedAdamWOptions& group,
                                            const FusedAdamWOptions& defaults) const {
  return merge_adam(group, defaults);
}

void FusedAdam::step_group(size_t group_index, const FusedAdamOptions& options,
                           const detail::GroupWork& work,
                           const std::optional<at::Tensor>& grad_scale,
                           const std::optional<at::Tensor>& found_inf) {
  step_adam_group(state_, options, work, grad_scale, found_inf, param_groups_,
                  detail::group_where(name(), group_index),
                  [&] { return lr_tensor(group_index, options.lr(), work.device); });
}
void FusedAdamW::step_group(size_t group_index, const FusedAdamWOptions& options,
                            const detail::GroupWork& work,
                            const std::optional<at::Tensor>& grad_scale,
                            const std::optional<at::Tensor>& found_inf) {
  step_adam_group(state_, options, work, grad_scale, found_inf, param_groups_,
                  detail::group_where(name(), group_index),
                  [&] { return lr_tensor(group_index, options.lr(), work.device); });
}

std::unique_ptr<FusedAdamParamState> FusedAdam::loaded_state(const at::Tensor& param,
                                                             const FusedAdamParamState& saved,
                                                             const FusedAdamOptions& options,
                                                             const std::string& where) const {
  return adam_loaded_state(param, saved, options, where);
}
std::unique_ptr<FusedAdamParamState> FusedAdamW::loaded_state(const at::Tensor& param,
                                                              const FusedAdamParamState& saved,
                                                              const FusedAdamWOptions& options,
                                                              const std::string& where) const {
  return adam_loaded_state(param, saved, options, where);
}

FusedAdam::FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults)
    : FusedOptimizer("FusedAdam", defaults) {
  add_param_groups(std::move(param_groups));
}

FusedAdam::FusedAdam(std::vector<at::Tensor> params, FusedAdamOptions defaults)
    : FusedAdam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       FusedAdamWOptions defaults)
    : FusedOptimizer("FusedAdamW", defaults) {
  add_param_groups(std::move(param_groups));
}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults)
    : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

}  // namespace amp::optim
