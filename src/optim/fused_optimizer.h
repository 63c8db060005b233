// The definitions of detail::FusedOptimizer (declared in amp/detail/fused_optimizer.h), included
// only by the source file of each optimizer, which instantiates the base for its own types.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include <amp/detail/fused_optimizer.h>

#include "optim/archive_io.h"
#include "optim/low_precision.h"
#include "optim/param_groups.h"

namespace amp::optim::detail {

/// The scale and flag handed over by GradScaler for this step, moved to each device at most once
/// (no copy when already there). Both empty when no scaler is involved.
class StepScaling {
 public:
  explicit StepScaling(const SupportsAmpScaling& optimizer);
  std::optional<at::Tensor> grad_scale(const c10::Device& device);
  std::optional<at::Tensor> found_inf(const c10::Device& device);

 private:
  static std::optional<at::Tensor> on(const at::Tensor& source,
                                      std::vector<std::pair<c10::Device, at::Tensor>>& copies,
                                      const c10::Device& device);
  at::Tensor grad_scale_;
  at::Tensor found_inf_;
  std::vector<std::pair<c10::Device, at::Tensor>> grad_scale_copies_;
  std::vector<std::pair<c10::Device, at::Tensor>> found_inf_copies_;
};

/// Capturable mode: entry `group_index` of `cache` as a 0-dim float32 tensor on `device` holding
/// `lr`. Created once and then updated in place (a CUDA graph keeps its address) when `lr`
/// changes.
const at::Tensor& capturable_lr(std::vector<std::pair<double, at::Tensor>>& cache,
                                size_t group_index, double lr, const c10::Device& device);

/// "<name> (param group <g>)", how option errors name a group.
std::string group_where(const char* name, size_t group_index);

// ---- FusedOptimizer's members ----

template <typename Options, typename ParamState>
FusedOptimizer<Options, ParamState>::FusedOptimizer(const char* name, const Options& defaults)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<Options>(defaults)),
      name_(name) {}

template <typename Options, typename ParamState>
void FusedOptimizer<Options, ParamState>::add_param_groups(
    std::vector<torch::optim::OptimizerParamGroup> groups) {
  const auto& defaults = static_cast<const Options&>(this->defaults());
  check_options(defaults, name_);
  check_low_precision_options(defaults, name_);
  // Group g of `groups` becomes param group `first + g`.
  const size_t first = param_groups_.size();
  deduplicate_params(param_groups_, groups, first, name_);
  for (size_t i = 0; i < groups.size(); ++i) {
    const size_t g = first + i;
    auto& group = groups[i];
    if (group.has_options()) {
      const auto* given = dynamic_cast<const Options*>(&group.options());
      TORCH_CHECK(given != nullptr, name_, ": the options of param group ", g, " are not ", name_,
                  "Options; a group's options must be of the optimizer's own options type. Pass ",
                  name_, "Options, or leave the group's options out to use the defaults.");
      group.set_options(std::make_unique<Options>(merge_options(*given, defaults)));
    } else {
      group.set_options(std::make_unique<Options>(defaults));
    }
    const auto& options = static_cast<const Options&>(group.options());
    check_options(options, group_where(name_, g));
    check_low_precision_options(options, group_where(name_, g));
    check_params(group, g, name_, options.capturable());
    check_low_precision_params(options, group.params(), group_where(name_, g));
  }
  check_some_low_precision<Options>({&param_groups_, &groups}, name_);
  adopt_groups(*this, std::move(groups));
  adopted_groups_ = param_groups_.size();
}

template <typename Options, typename ParamState>
void FusedOptimizer<Options, ParamState>::add_param_group(
    const torch::optim::OptimizerParamGroup& param_group) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(param_group.params());
  if (param_group.has_options()) groups.back().set_options(param_group.options().clone());
  add_param_groups(std::move(groups));
}

template <typename Options, typename ParamState>
const Options& FusedOptimizer<Options, ParamState>::checked_options(size_t group_index) const {
  // A group's options are ours when add_param_groups or load() set them; LibTorch's base
  // add_param_group, reached through a torch::optim::Optimizer&, sets the defaults instead.
  TORCH_CHECK(group_index < adopted_groups_, name_, ": param group ", group_index,
              " was added through torch::optim::Optimizer::add_param_group, which is not "
              "virtual and gave the group ",
              name_,
              "'s default options instead of its own. Nothing was stepped; call "
              "add_param_group on the ",
              name_,
              " itself (not through a "
              "torch::optim::Optimizer reference).");
  const auto& options = static_cast<const Options&>(param_groups_[group_index].options());
  // Rechecked every step: options may have been changed through param_groups() since.
  check_options(options, group_where(name_, group_index));
  check_low_precision_options(options, group_where(name_, group_index));
  return options;
}

template <typename Options, typename ParamState>
at::Tensor FusedOptimizer<Options, ParamState>::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  StepScaling scaling(*this);
  // A float32 master gradient whose float16 gradient has since been replaced, changed or
  // dropped is stale: the step reads the float16 gradient instead.
  if (gave_float32_gradients_) {
    for (const auto& group : param_groups_) {
      for (const auto& param : group.params()) {
        const auto found = state_.find(param.unsafeGetTensorImpl());
        if (found == state_.end()) continue;
        const at::Tensor& master = static_cast<const ParamState&>(*found->second).master_weight();
        if (master.defined() && master.grad().defined() && !has_current_float32_gradient(param)) {
          master.mutable_grad() = at::Tensor();
        }
      }
    }
  }
  float32_gradient_sources_.clear();
  // Every group's options are checked before the first group steps: a refusal changes nothing.
  for (size_t g = 0; g < param_groups_.size(); ++g) checked_options(g);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const Options& options = checked_options(g);
    const GroupWork work = collect_group(param_groups_[g], g, name_, options.capturable());
    if (work.empty()) continue;
    step_group(g, options, work, scaling.grad_scale(work.device), scaling.found_inf(work.device));
    // Every stepped parameter's version counter moves, whichever kernel wrote it (ATen's fused
    // kernels do not move it, amp's engine writes through pointers): a graph that saved the
    // parameter, or a float8 weight cast kept for WeightCasts::reuse, sees that it changed.
    for (const auto& [dtype, params] : work.params_by_dtype) {
      for (const auto& param : params) param.unsafeGetTensorImpl()->bump_version();
    }
  }
  return loss;
}

template <typename Options, typename ParamState>
bool FusedOptimizer<Options, ParamState>::keeps_float32_gradient(const at::Tensor& param) const {
  if (param.scalar_type() != at::kHalf) return false;
  for (size_t g = 0; g < param_groups_.size() && g < adopted_groups_; ++g) {
    for (const auto& p : param_groups_[g].params()) {
      if (!p.is_same(param)) continue;
      const auto plan =
          low_precision_plan(static_cast<const Options&>(param_groups_[g].options()), at::kHalf);
      // The float32 update runs the rule on the master copy as a float32 parameter, whose state
      // is float32.
      return plan && plan->write_back == WriteBack::kMasterWeights &&
             plan->state_dtype == at::kFloat;
    }
  }
  return false;
}

template <typename Options, typename ParamState>
at::Tensor FusedOptimizer<Options, ParamState>::float32_gradient(const at::Tensor& param) {
  TORCH_CHECK(keeps_float32_gradient(param), name_,
              "::float32_gradient: this parameter has no float32 master copy; only float16 "
              "parameters of groups with master_weights(true) have one.");
  auto& entry = state_[param.unsafeGetTensorImpl()];
  if (!entry) entry = std::make_unique<ParamState>();
  auto& state = static_cast<ParamState&>(*entry);
  if (!state.master_weight().defined()) {
    // What the first step would create (fit_write_back_state).
    state.master_weight(
        param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous());
  }
  at::Tensor master = state.master_weight();
  master.mutable_grad() = at::empty_like(master);
  gave_float32_gradients_ = true;
  const at::Tensor& grad = param.grad();
  float32_gradient_sources_.insert_or_assign(
      param.unsafeGetTensorImpl(),
      std::make_pair(c10::weak_intrusive_ptr<c10::TensorImpl>(grad.getIntrusivePtr()),
                     grad._version()));
  return master.grad();
}

template <typename Options, typename ParamState>
bool FusedOptimizer<Options, ParamState>::has_current_float32_gradient(
    const at::Tensor& param) const {
  const auto source = float32_gradient_sources_.find(param.unsafeGetTensorImpl());
  if (source == float32_gradient_sources_.end()) return false;
  const at::Tensor& grad = param.grad();
  return grad.defined() &&
         source->second.first._unsafe_get_target() == grad.unsafeGetTensorImpl() &&
         source->second.second == grad._version();
}

template <typename Options, typename ParamState>
std::vector<at::Tensor> FusedOptimizer<Options, ParamState>::master_params() {
  std::vector<at::Tensor> tensors;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& group : param_groups_) {
    for (const auto& param : group.params()) {
      if (!param.grad().defined() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
      const auto found = state_.find(param.unsafeGetTensorImpl());
      if (found != state_.end() && has_current_float32_gradient(param)) {
        const at::Tensor& master = static_cast<const ParamState&>(*found->second).master_weight();
        if (master.defined() && master.grad().defined()) {
          tensors.push_back(master);
          continue;
        }
      }
      tensors.push_back(param);
    }
  }
  return tensors;
}

template <typename Options, typename ParamState>
const at::Tensor& FusedOptimizer<Options, ParamState>::lr_tensor(size_t group_index, double lr,
                                                                 const c10::Device& device) {
  return capturable_lr(lr_tensors_, group_index, lr, device);
}

template <typename Options, typename ParamState>
void FusedOptimizer<Options, ParamState>::sync_capturable_lr() {
  for (size_t g = 0; g < lr_tensors_.size() && g < param_groups_.size(); ++g) {
    const at::Tensor& tensor = lr_tensors_[g].second;
    if (tensor.defined()) lr_tensor(g, param_groups_[g].options().get_lr(), tensor.device());
  }
}

template <typename Options, typename ParamState>
void FusedOptimizer<Options, ParamState>::save(torch::serialize::OutputArchive& archive) const {
  // LibTorch's own writer (its layout), calling this library's option and state entries.
  torch::optim::serialize<ParamState, torch::optim::OptimizerOptions>(archive, *this);
}

template <typename Options, typename ParamState>
void FusedOptimizer<Options, ParamState>::load(torch::serialize::InputArchive& archive) {
  // Everything is read and checked before the first write: a failed load changes nothing.
  const std::string name = name_;
  auto contents = read_archive<Options, ParamState>(archive, name);
  for (size_t g = 0; g < contents.groups.size(); ++g) {
    const std::string where = name + "::load (param group " + std::to_string(g) + ")";
    check_options(contents.groups[g].options, where);
    check_low_precision_options(contents.groups[g].options, where);
    if (g < param_groups_.size()) {  // a count mismatch is reported by match_state below
      check_low_precision_params(contents.groups[g].options, param_groups_[g].params(), where);
    }
  }
  auto state = match_state(
      contents, *this, name,
      [&](const at::Tensor& param, const ParamState& saved, size_t g, const std::string& where) {
        return loaded_state(param, saved, contents.groups[g].options, where);
      });
  for (size_t g = 0; g < contents.groups.size(); ++g) {
    param_groups_[g].set_options(std::make_unique<Options>(contents.groups[g].options));
  }
  adopted_groups_ = param_groups_.size();  // every group now has options of this type
  state_ = std::move(state);
}

}  // namespace amp::optim::detail
