// FusedSGD: Python's fused SGD step (torch/optim/sgd.py, _fused_sgd) over at::_fused_sgd_, with
// the scale and inf flag taken from GradScaler and zero-initialised momentum buffers.
#include <amp/optim.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include "optim/fused_step.h"

namespace amp::optim {

namespace {

constexpr const char* kName = "FusedSGD";

const FusedSGDOptions& checked(const torch::optim::OptimizerOptions& options,
                               const std::string& where) {
  const auto& o = static_cast<const FusedSGDOptions&>(options);
  detail::check_sgd_options(o, where);
  return o;
}

std::string group_where(size_t g) {
  return std::string(kName) + " (param group " + std::to_string(g) + ")";
}

std::vector<torch::optim::OptimizerParamGroup> prepared_groups(
    std::vector<torch::optim::OptimizerParamGroup> groups, const FusedSGDOptions& defaults) {
  detail::check_sgd_options(defaults, kName);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].has_options()) {
      groups[g].set_options(detail::merge_group_options(groups[g].options(), defaults));
    } else {
      groups[g].set_options(std::make_unique<FusedSGDOptions>(defaults));
    }
    detail::check_params(groups[g], g, kName,
                         checked(groups[g].options(), group_where(g)).capturable());
  }
  return groups;
}

}  // namespace

FusedSGD::FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   FusedSGDOptions defaults)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<FusedSGDOptions>(defaults)) {
  detail::adopt_groups(*this, prepared_groups(std::move(param_groups), defaults));
}

FusedSGD::FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults)
    : FusedSGD(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                   std::move(params))},
               std::move(defaults)) {}

at::Tensor FusedSGD::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  detail::StepScaling scaling(*this);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const FusedSGDOptions o = checked(param_groups_[g].options(), group_where(g));
    const detail::GroupWork work =
        detail::collect_group(param_groups_[g], g, kName, o.capturable());
    if (work.empty()) continue;
    const auto grad_scale = scaling.grad_scale(work.device);
    const auto found_inf = scaling.found_inf(work.device);
    const auto run = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& bufs,
                         bool is_first_step) {
      std::vector<at::Tensor> grads;
      for (const auto& p : params) grads.push_back(p.grad());
      const auto call = [&](const auto& lr) {
        at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), lr, o.dampening(),
                        o.nesterov(), o.maximize(), is_first_step, grad_scale, found_inf);
      };
      if (o.capturable()) {
        call(detail::capturable_lr(lr_tensors_, g, o.lr(), work.device));
      } else {
        call(o.lr());
      }
    };
    for (const auto& [dtype, params] : work.params_by_dtype) {
      if (o.momentum() == 0.0) {
        run(params, {}, /*is_first_step=*/false);
        continue;
      }
      // Parameters with a buffer continue their momentum; new ones start it (is_first_step
      // copies the gradient into the buffer). Python decides this once per group; per parameter
      // gives the same numbers and also covers parameters that get a gradient later.
      std::vector<at::Tensor> continuing, continuing_bufs, starting, starting_bufs;
      for (const at::Tensor& param : params) {
        auto& slot = state_[param.unsafeGetTensorImpl()];
        auto* state = static_cast<FusedSGDParamState*>(slot.get());
        if (state != nullptr && state->momentum_buffer().defined()) {
          continuing.push_back(param);
          continuing_bufs.push_back(state->momentum_buffer());
        } else {
          // Zeros, not uninitialised memory: a skipped first step must leave a usable buffer.
          auto fresh = std::make_unique<FusedSGDParamState>();
          fresh->momentum_buffer(at::zeros_like(param.grad(), at::MemoryFormat::Preserve));
          starting.push_back(param);
          starting_bufs.push_back(fresh->momentum_buffer());
          slot = std::move(fresh);
        }
      }
      if (!continuing.empty()) run(continuing, continuing_bufs, /*is_first_step=*/false);
      if (!starting.empty()) run(starting, starting_bufs, /*is_first_step=*/true);
    }
  }
  return loss;
}

void FusedSGD::sync_capturable_lr() { detail::sync_capturable_lrs(lr_tensors_, param_groups_); }

void FusedSGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedSGDParamState, torch::optim::OptimizerOptions>(archive, *this);
}

void FusedSGD::load(torch::serialize::InputArchive& archive) {
  // Everything is read and checked before the first write: a failed load changes nothing.
  auto contents = detail::read_archive<FusedSGDOptions, FusedSGDParamState>(archive, kName);
  for (size_t g = 0; g < contents.groups.size(); ++g) {
    detail::check_sgd_options(
        contents.groups[g].options,
        std::string(kName) + "::load (param group " + std::to_string(g) + ")");
  }
  auto state = detail::match_state(
      contents, *this, kName,
      [](const at::Tensor& param, const FusedSGDParamState& saved, const std::string& where) {
        auto state = std::make_unique<FusedSGDParamState>();
        const at::Tensor& buf = saved.momentum_buffer();
        if (buf.defined()) {
          TORCH_CHECK(buf.sizes() == param.sizes() && at::isFloatingType(buf.scalar_type()), where,
                      " has momentum_buffer of ", buf.scalar_type(), " ", buf.sizes(),
                      " but the parameter is ", param.scalar_type(), " ", param.sizes(),
                      "; the checkpoint belongs to another model. The optimizer is unchanged.");
          state->momentum_buffer(
              buf.to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
        }
        return state;
      });
  for (size_t g = 0; g < contents.groups.size(); ++g) {
    param_groups_[g].set_options(std::make_unique<FusedSGDOptions>(contents.groups[g].options));
  }
  state_ = std::move(state);
}

}  // namespace amp::optim
