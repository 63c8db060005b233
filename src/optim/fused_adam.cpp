// FusedAdam and FusedAdamW: Python's fused Adam step (torch/optim/adam.py, _fused_adam) over
// at::_fused_adam_ / at::_fused_adamw_, with the scale and inf flag taken from GradScaler.
#include <amp/optim.h>

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include "optim/fused_step.h"

namespace amp::optim {

namespace {

// The hyper-parameters of one group, whichever of the two options types holds them.
struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, capturable;
};

template <typename AdamOptions>
AdamHyper hyper_of(const AdamOptions& o) {
  return {o.lr(),      std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
          o.amsgrad(), o.maximize(),           o.capturable()};
}

const char* name_of(bool decoupled) { return decoupled ? "FusedAdamW" : "FusedAdam"; }

AdamHyper checked_hyper(const torch::optim::OptimizerOptions& options, bool decoupled,
                        const std::string& where) {
  if (decoupled) {
    const auto& o = static_cast<const FusedAdamWOptions&>(options);
    detail::check_adam_options(o, where);
    return hyper_of(o);
  }
  const auto& o = static_cast<const FusedAdamOptions&>(options);
  detail::check_adam_options(o, where);
  return hyper_of(o);
}

// Merged, checked groups for the base constructor (which only merges LibTorch's own types).
std::vector<torch::optim::OptimizerParamGroup> prepared_groups(
    std::vector<torch::optim::OptimizerParamGroup> groups,
    const torch::optim::OptimizerOptions& defaults, bool decoupled) {
  const char* name = name_of(decoupled);
  checked_hyper(defaults, decoupled, name);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].has_options()) {
      groups[g].set_options(detail::merge_group_options(groups[g].options(), defaults));
    } else {
      groups[g].set_options(defaults.clone());
    }
    const std::string where = std::string(name) + " (param group " + std::to_string(g) + ")";
    const AdamHyper h = checked_hyper(groups[g].options(), decoupled, where);
    detail::check_params(groups[g], g, name, h.capturable);
  }
  return groups;
}

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

}  // namespace

namespace detail {

FusedAdamBase::FusedAdamBase(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                             std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                             bool decoupled)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{}, defaults->clone()),
      decoupled_(decoupled) {
  adopt_groups(*this, prepared_groups(std::move(param_groups), *defaults, decoupled));
}

at::Tensor FusedAdamBase::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  const char* name = name_of(decoupled_);
  StepScaling scaling(*this);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    auto& group = param_groups_[g];
    const AdamHyper h =
        checked_hyper(group.options(), decoupled_,
                      std::string(name) + " (param group " + std::to_string(g) + ")");
    const GroupWork work = collect_group(group, g, name, h.capturable);
    if (work.empty()) continue;
    const auto grad_scale = scaling.grad_scale(work.device);
    const auto found_inf = scaling.found_inf(work.device);
    for (const auto& [dtype, params] : work.params_by_dtype) {
      std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
      for (const at::Tensor& param : params) {
        auto& state = state_for(state_, param, h.amsgrad);
        grads.push_back(param.grad());
        exp_avgs.push_back(state.exp_avg());
        exp_avg_sqs.push_back(state.exp_avg_sq());
        if (h.amsgrad) max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
        steps.push_back(state.step());
      }
      // Python's sequence: count the step, run the kernel (which unscales the gradients and
      // skips everything when found_inf is 1), then take the count back by found_inf.
      at::_foreach_add_(steps, 1);
      const auto run = [&](const auto& lr) {
        if (decoupled_) {
          at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr,
                            h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad, h.maximize,
                            grad_scale, found_inf);
        } else {
          at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr,
                           h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad, h.maximize,
                           grad_scale, found_inf);
        }
      };
      if (h.capturable) {
        run(capturable_lr(lr_tensors_, g, h.lr, work.device));
      } else {
        run(h.lr);
      }
      if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
    }
  }
  return loss;
}

void FusedAdamBase::sync_capturable_lr() { sync_capturable_lrs(lr_tensors_, param_groups_); }

void FusedAdamBase::save(torch::serialize::OutputArchive& archive) const {
  // LibTorch's own writer (its layout), calling this library's option and state entries.
  torch::optim::serialize<FusedAdamParamState, torch::optim::OptimizerOptions>(archive, *this);
}

void FusedAdamBase::load(torch::serialize::InputArchive& archive) {
  const std::string name = name_of(decoupled_);
  const auto check_state = [](const at::Tensor& param, const FusedAdamParamState& saved,
                              const std::string& where) {
    auto state = std::make_unique<FusedAdamParamState>();
    const auto moved = [&](const at::Tensor& t, const char* key) {
      if (!t.defined()) return at::Tensor();
      TORCH_CHECK(t.sizes() == param.sizes() && at::isFloatingType(t.scalar_type()), where, " has ",
                  key, " of ", t.scalar_type(), " ", t.sizes(), " but the parameter is ",
                  param.scalar_type(), " ", param.sizes(),
                  "; the checkpoint belongs to another "
                  "model. The optimizer is unchanged.");
      return t.to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    };
    TORCH_CHECK(saved.exp_avg().defined() && saved.exp_avg_sq().defined(), where,
                " lacks exp_avg or exp_avg_sq; the checkpoint is not an Adam checkpoint. The "
                "optimizer is unchanged.");
    const float count = saved.step().item<float>();
    TORCH_CHECK(std::isfinite(count) && count >= 0 && count == std::floor(count), where,
                " has a step count of ", count,
                "; a count is a whole number >= 0. The "
                "optimizer is unchanged.");
    state->step(saved.step().to(param.device(), at::kFloat, false, /*copy=*/true));
    state->exp_avg(moved(saved.exp_avg(), "exp_avg"));
    state->exp_avg_sq(moved(saved.exp_avg_sq(), "exp_avg_sq"));
    state->max_exp_avg_sq(moved(saved.max_exp_avg_sq(), "max_exp_avg_sq"));
    return state;
  };
  // Everything is read and checked before the first write: a failed load changes nothing.
  const auto apply = [&](auto options_tag) {
    using Options = decltype(options_tag);
    auto contents = read_archive<Options, FusedAdamParamState>(archive, name);
    for (size_t g = 0; g < contents.groups.size(); ++g) {
      check_adam_options(contents.groups[g].options,
                         name + "::load (param group " + std::to_string(g) + ")");
    }
    auto state = match_state(contents, *this, name, check_state);
    for (size_t g = 0; g < contents.groups.size(); ++g) {
      param_groups_[g].set_options(std::make_unique<Options>(contents.groups[g].options));
    }
    state_ = std::move(state);
  };
  if (decoupled_) {
    apply(FusedAdamWOptions());
  } else {
    apply(FusedAdamOptions());
  }
}

}  // namespace detail

FusedAdam::FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults)
    : FusedAdamBase(std::move(param_groups), std::make_unique<FusedAdamOptions>(defaults),
                    /*decoupled=*/false) {}

FusedAdam::FusedAdam(std::vector<at::Tensor> params, FusedAdamOptions defaults)
    : FusedAdam(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                    std::move(params))},
                std::move(defaults)) {}

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       FusedAdamWOptions defaults)
    : FusedAdamBase(std::move(param_groups), std::make_unique<FusedAdamWOptions>(defaults),
                    /*decoupled=*/true) {}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults)
    : FusedAdamW(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                     std::move(params))},
                 std::move(defaults)) {}

}  // namespace amp::optim
