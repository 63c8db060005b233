// FusedLion: the Lion rule (rules/lion.h) on amp's step engine for every parameter dtype, its
// options and state.
#include <amp/optim/lion.h>

#include <cmath>

#include <ATen/ATen.h>

#include "optim/fused_optimizer.h"

namespace amp::optim {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// ---- options and state ----

FusedLionOptions::FusedLionOptions(double lr) { this->lr(lr); }

void FusedLionOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("betas", c10::IValue(betas()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("maximize", c10::IValue(maximize()));
  detail::write_low_precision(*this, archive);
}

void FusedLionOptions::serialize(InputArchive& archive) {
  using detail::read_bool;
  using detail::read_double;
  lr(read_double(archive, "lr", true, 0.0))
      .betas(detail::read_betas(archive))
      .weight_decay(read_double(archive, "weight_decay", true, 0.0))
      .maximize(read_bool(archive, "maximize", false, false));
  detail::read_low_precision(*this, archive);
}

bool operator==(const FusedLionOptions& lhs, const FusedLionOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.maximize() == rhs.maximize() &&
         detail::equal_low_precision(lhs, rhs);
}

void FusedLionParamState::serialize(OutputArchive& archive) const {
  archive.write("step", c10::IValue(step().defined() ? static_cast<int64_t>(step().item<float>())
                                                     : int64_t{0}));
  detail::write_tensor(archive, "exp_avg", exp_avg());
  detail::write_tensor(archive, "master_weight", master_weight());
  detail::write_tensor(archive, "kahan_comp", kahan_comp());
}

void FusedLionParamState::serialize(InputArchive& archive) {
  const int64_t count = detail::read_int(archive, "step", true, 0);
  TORCH_CHECK(count >= 0 && count <= (int64_t{1} << 24), "a state entry's step count ", count,
              " is outside [0, 2^24]");
  step(at::full({}, static_cast<double>(count), at::kFloat));
  exp_avg(detail::read_tensor(archive, "exp_avg"));
  master_weight(detail::read_tensor(archive, "master_weight"));
  kahan_comp(detail::read_tensor(archive, "kahan_comp"));
}

bool operator==(const FusedLionParamState& lhs, const FusedLionParamState& rhs) {
  return detail::same_tensor(lhs.step(), rhs.step()) &&
         detail::same_tensor(lhs.exp_avg(), rhs.exp_avg()) &&
         detail::same_tensor(lhs.master_weight(), rhs.master_weight()) &&
         detail::same_tensor(lhs.kahan_comp(), rhs.kahan_comp());
}

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
  // Python's rule: each option the group set, the others from the optimizer's defaults.
  FusedLionOptions merged = defaults;
  AMP_TAKE_IF_SET(merged, group, lr);
  AMP_TAKE_IF_SET(merged, group, betas);
  AMP_TAKE_IF_SET(merged, group, weight_decay);
  AMP_TAKE_IF_SET(merged, group, maximize);
  detail::merge_low_precision(merged, group);
  return merged;
}

void FusedLion::step_group(size_t group_index, const FusedLionOptions& o,
                           const detail::GroupWork& work,
                           const std::optional<at::Tensor>& grad_scale,
                           const std::optional<at::Tensor>& found_inf) {
  const std::string where = detail::group_where(name(), group_index);
  const detail::ParamPositions positions(param_groups_);
  const auto [beta1, beta2] = o.betas();
  const detail::LionHyper hyper{o.lr(), beta1, beta2, o.weight_decay(), o.maximize()};
  for (const auto& [dtype, params] : work.params_by_dtype) {
    check_lion_dtype(dtype, where);
    const detail::LowPrecisionPlan plan = lion_plan(o, dtype);
    std::vector<detail::StepSlot> slots;
    for (const at::Tensor& param : params) {
      detail::check_low_precision_param(param, positions.of(param), where);
      auto& entry = state_[param.unsafeGetTensorImpl()];
      if (!entry) entry = std::make_unique<FusedLionParamState>();
      auto& state = static_cast<FusedLionParamState&>(*entry);
      at::Tensor step = state.step(), master = state.master_weight(), comp = state.kahan_comp();
      detail::StepSlot slot =
          detail::engine_slot(param, positions.of(param), step, master, comp, plan);
      state.step(step).master_weight(master).kahan_comp(comp);
      state.exp_avg(detail::state_tensor(state.exp_avg(), param, plan.state_dtype));
      slot.state0 = state.exp_avg();
      slots.push_back(std::move(slot));
    }
    detail::run_rule_step<detail::lp::LionRule>(slots, hyper,
                                                detail::step_args(o, plan, grad_scale, found_inf));
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
  if (plan.write_back == detail::WriteBack::kMasterWeights) {
    state->master_weight(detail::loaded_state_tensor(saved.master_weight(), param, at::kFloat,
                                                     "master_weight", where));
  }
  if (plan.write_back == detail::WriteBack::kKahan) {
    state->kahan_comp(detail::loaded_state_tensor(saved.kahan_comp(), param, param.scalar_type(),
                                                  "kahan_comp", where));
  }
  return state;
}

}  // namespace amp::optim
