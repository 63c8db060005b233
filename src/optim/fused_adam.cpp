// FusedAdam and FusedAdamW: Python's fused Adam step (torch/optim/adam.py, _fused_adam) over
// at::_fused_adam_ / at::_fused_adamw_, their options and state in LibTorch's Adam layout.
#include <cmath>
#include <type_traits>

#include <ATen/ATen.h>

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

template <typename T>
T pick(const T& group, const T& constructor_default, const T& optimizer_default) {
  return group == constructor_default ? optimizer_default : group;
}

template <typename AdamOptions>
AdamOptions merge_adam(const AdamOptions& group, const AdamOptions& defaults) {
  const AdamOptions fresh;
  AdamOptions merged = group;
  merged.lr(pick(group.lr(), fresh.lr(), defaults.lr()))
      .betas(pick(group.betas(), fresh.betas(), defaults.betas()))
      .eps(pick(group.eps(), fresh.eps(), defaults.eps()))
      .weight_decay(pick(group.weight_decay(), fresh.weight_decay(), defaults.weight_decay()))
      .amsgrad(pick(group.amsgrad(), fresh.amsgrad(), defaults.amsgrad()))
      .maximize(pick(group.maximize(), fresh.maximize(), defaults.maximize()))
      .capturable(pick(group.capturable(), fresh.capturable(), defaults.capturable()));
  return merged;
}

template <typename AdamOptions>
bool equal_adam(const AdamOptions& lhs, const AdamOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.amsgrad() == rhs.amsgrad() &&
         lhs.maximize() == rhs.maximize() && lhs.capturable() == rhs.capturable();
}

std::tuple<double, double> read_betas(InputArchive& archive) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read("betas", value), "the entry \"betas\" is missing");
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    items = value.toTupleRef().elements().vec();
  } else if (value.isList()) {
    items = value.toListRef().vec();
  }
  TORCH_CHECK(items.size() == 2 && items[0].isDouble() && items[1].isDouble(),
              "the entry \"betas\" is not a pair of floats");
  return {items[0].toDouble(), items[1].toDouble()};
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
}

template <typename AdamOptions>
void read_adam_options(AdamOptions& options, InputArchive& archive) {
  using detail::read_bool;
  using detail::read_double;
  options.lr(read_double(archive, "lr", true, 0.0))
      .betas(read_betas(archive))
      .eps(read_double(archive, "eps", true, 0.0))
      .weight_decay(read_double(archive, "weight_decay", true, 0.0))
      .amsgrad(read_bool(archive, "amsgrad", true, false))
      // Absent from LibTorch's checkpoints.
      .maximize(read_bool(archive, "maximize", false, false))
      .capturable(read_bool(archive, "capturable", false, false));
}

// ---- the step and the checkpoint state, for both types ----

// Zero state for a parameter's first step (Python's _init_group for fused=True).
FusedAdamParamState& state_for(
    ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>& states,
    const at::Tensor& param, bool amsgrad) {
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

// One group's step; `decoupled` is AdamW's weight decay, `lr_tensor` the capturable lr.
template <typename AdamOptions, typename LrTensor>
void adam_step_group(
    ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>& states,
    const AdamOptions& o, bool decoupled, const detail::GroupWork& work,
    const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
    LrTensor lr_tensor) {
  const auto [beta1, beta2] = o.betas();
  for (const auto& [dtype, params] : work.params_by_dtype) {
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

std::unique_ptr<FusedAdamParamState> adam_loaded_state(const at::Tensor& param,
                                                       const FusedAdamParamState& saved,
                                                       const std::string& where) {
  auto state = std::make_unique<FusedAdamParamState>();
  const auto moved = [&](const at::Tensor& t, const char* key) {
    if (!t.defined()) return at::Tensor();
    TORCH_CHECK(t.sizes() == param.sizes() && at::isFloatingType(t.scalar_type()), where, " has ",
                key, " of ", t.scalar_type(), " ", t.sizes(), " but the parameter is ",
                param.scalar_type(), " ", param.sizes(),
                "; the checkpoint belongs to another model. The optimizer is unchanged.");
    return t.to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
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
  return state;
}

}  // namespace

// ---- options and state ----

FusedAdamOptions::FusedAdamOptions(double lr) : lr_(lr) {}
FusedAdamWOptions::FusedAdamWOptions(double lr) : lr_(lr) {}

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
}

bool operator==(const FusedAdamParamState& lhs, const FusedAdamParamState& rhs) {
  return detail::same_tensor(lhs.step(), rhs.step()) &&
         detail::same_tensor(lhs.exp_avg(), rhs.exp_avg()) &&
         detail::same_tensor(lhs.exp_avg_sq(), rhs.exp_avg_sq()) &&
         detail::same_tensor(lhs.max_exp_avg_sq(), rhs.max_exp_avg_sq());
}

// ---- the optimizers ----

namespace detail {

template <typename Options>
void FusedAdamFamily<Options>::check_options(const Options& options,
                                             const std::string& where) const {
  check_adam(options, where);
}

template <typename Options>
Options FusedAdamFamily<Options>::merge_options(const Options& group,
                                                const Options& defaults) const {
  return merge_adam(group, defaults);
}

template <typename Options>
void FusedAdamFamily<Options>::step_group(size_t group_index, const Options& options,
                                          const GroupWork& work,
                                          const std::optional<at::Tensor>& grad_scale,
                                          const std::optional<at::Tensor>& found_inf) {
  constexpr bool decoupled = std::is_same_v<Options, FusedAdamWOptions>;
  adam_step_group(this->state_, options, decoupled, work, grad_scale, found_inf,
                  [&] { return this->lr_tensor(group_index, options.lr(), work.device); });
}

template <typename Options>
std::unique_ptr<FusedAdamParamState> FusedAdamFamily<Options>::loaded_state(
    const at::Tensor& param, const FusedAdamParamState& saved, const std::string& where) const {
  return adam_loaded_state(param, saved, where);
}

template class FusedOptimizer<FusedAdamOptions, FusedAdamParamState>;
template class FusedOptimizer<FusedAdamWOptions, FusedAdamParamState>;
template class FusedAdamFamily<FusedAdamOptions>;
template class FusedAdamFamily<FusedAdamWOptions>;

}  // namespace detail

FusedAdam::FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults)
    : FusedAdamFamily("FusedAdam", defaults) {
  add_param_groups(std::move(param_groups));
}

FusedAdam::FusedAdam(std::vector<at::Tensor> params, FusedAdamOptions defaults)
    : FusedAdam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       FusedAdamWOptions defaults)
    : FusedAdamFamily("FusedAdamW", defaults) {
  add_param_groups(std::move(param_groups));
}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults)
    : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

}  // namespace amp::optim
