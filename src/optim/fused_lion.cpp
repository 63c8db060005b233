// FusedLion: the Lion rule (rules/lion.h) on amp's step engine for every parameter dtype, its
// options and state.
#include <amp/optim/lion.h>

#include <cmath>

#include <ATen/ATen.h>

#include "optim/field_list.h"
#include "optim/fused_optimizer.h"

namespace amp::optim {

// ---- options and state ----

FusedLionOptions::FusedLionOptions(double lr) { this->lr(lr); }

namespace {

// FusedLionOptions' fields: lion-pytorch's options (LibTorch has no Lion) and maximize.
const auto& lion_fields() {
  static const detail::OptionList fields(
      AMP_OPTIMIZER_FIELDS(FusedLionOptions, kYes, lr, betas, weight_decay),
      AMP_OPTIMIZER_FIELDS(FusedLionOptions, kNo, maximize));
  return fields;
}

// FusedLionParamState's tensors.
const auto& lion_state_fields() {
  static const detail::StateList fields(
      AMP_STATE_FIELDS(FusedLionParamState, kStepCount, step),
      AMP_STATE_FIELDS(FusedLionParamState, kTensor, exp_avg, master_weight, kahan_comp));
  return fields;
}

}  // namespace

AMP_SERIALIZE_FROM_FIELDS(FusedLionOptions, lion_fields)
AMP_SERIALIZE_FROM_FIELDS(FusedLionParamState, lion_state_fields)

// ---- the optimizer ----

template class detail::FusedOptimizer<FusedLionOptions, FusedLionParamState>;

namespace {

// How a parameter of `dtype` is updated: the low-precision options' plan for bfloat16/float16
// parameters when one is set; otherwise the update as it is (round to nearest), with the momentum
// in the parameter's dtype as lion-pytorch keeps it.
detail::LowPrecisionPlan lion_plan(const FusedLionOptions& o, c10::ScalarType dtype) {
  if (const auto plan = detail::low_precision_plan(o, dtype)) return *plan;
  return detail::LowPrecisionPlan{detail::WriteBack::kRoundNearest, dtype};
}

void check_lion_dtype(c10::ScalarType dtype, const std::string& where) {
  TORCH_CHECK(detail::engine_param_dtype(dtype), where, ": FusedLion updates float32, bfloat16 ",
              "and float16 parameters, and this group has ", dtype,
              " ones; convert them, or give them another optimizer.");
}

}  // namespace

FusedLion::FusedLion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedLionOptions defaults)
    : FusedOptimizer("FusedLion", defaults) {
  add_param_groups(std::move(param_groups));
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (const auto& p : param_groups_[g].params()) {
      check_lion_dtype(p.scalar_type(), detail::group_where(name(), g));
    }
  }
}

FusedLion::FusedLion(std::vector<at::Tensor> params, FusedLionOptions defaults)
    : FusedLion({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

void FusedLion::check_options(const FusedLionOptions& options, const std::string& where) const {
  detail::check_finite_at_least(options.lr(), 0.0, "lr", where,
                                "pass a learning rate such as 1e-4.");
  detail::check_finite_at_least(options.weight_decay(), 0.0, "weight_decay", where,
                                "pass 0 for no weight decay.");
  const auto [beta1, beta2] = options.betas();
  TORCH_CHECK(beta1 >= 0.0 && beta1 <= 1.0, where,
              ": betas[0] must be in [0, 1]. Got betas[0]=", beta1, "; the default is 0.9.");
  TORCH_CHECK(beta2 >= 0.0 && beta2 <= 1.0, where,
              ": betas[1] must be in [0, 1]. Got betas[1]=", beta2, "; the default is 0.99.");
}

FusedLionOptions FusedLion::merge_options(const FusedLionOptions& group,
                                          const FusedLionOptions& defaults) const {
  return lion_fields().merge(group, defaults);
}

void FusedLion::step_group(size_t group_index, const FusedLionOptions& o,
                           const detail::GroupWork& work,
                           const std::optional<at::Tensor>& grad_scale,
                           const std::optional<at::Tensor>& found_inf) {
  const std::string where = detail::group_where(name(), group_index);
  const detail::ParamPositions positions(param_groups_, param_positions());
  const auto [beta1, beta2] = o.betas();
  const detail::LionHyper hyper{o.lr(), beta1, beta2, o.weight_decay(), o.maximize()};
  for (const auto& [dtype, params] : work.params_by_dtype) {
    check_lion_dtype(dtype, where);
    const detail::LowPrecisionPlan plan = lion_plan(o, dtype);
    using Rule = detail::engine::LionRule;
    detail::step_on_engine<Rule, FusedLionParamState>(
        {state_, plan, params, positions, grad_scale, found_inf, where}, o, hyper,
        [&](FusedLionParamState& state, const at::Tensor& param, detail::StepSlot& slot) {
          state.exp_avg(detail::state_tensor(state.exp_avg(), param, plan.state_dtype));
          slot.state[Rule::kExpAvg] = state.exp_avg();
        });
  }
}

std::unique_ptr<FusedLionParamState> FusedLion::loaded_state(const at::Tensor& param,
                                                             const FusedLionParamState& saved,
                                                             const FusedLionOptions& options,
                                                             const std::string& where) const {
  TORCH_CHECK(saved.exp_avg().defined(), where,
              " lacks exp_avg; the checkpoint is not a FusedLion checkpoint. The optimizer is "
              "unchanged.");
  const detail::LowPrecisionPlan plan = lion_plan(options, param.scalar_type());
  auto state = std::make_unique<FusedLionParamState>();
  state->step(saved.step().to(param.device(), at::kFloat, false, /*copy=*/true));
  state->exp_avg(
      detail::loaded_state_tensor(saved.exp_avg(), param, plan.state_dtype, "exp_avg", where));
  detail::load_write_back_state(*state, saved, param, plan, where);
  return state;
}

}  // namespace amp::optim
