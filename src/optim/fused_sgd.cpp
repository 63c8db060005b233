// FusedSGD: Python's fused SGD step (torch/optim/sgd.py, _fused_sgd) over at::_fused_sgd_, with
// zero-initialised momentum buffers; its options and state in LibTorch's SGD layout.
#include <ATen/ATen.h>

#include "optim/fused_optimizer.h"

namespace amp::optim {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// ---- options and state ----

FusedSGDOptions::FusedSGDOptions(double lr) : lr_(lr) {}

void FusedSGDOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("momentum", c10::IValue(momentum()));
  archive.write("dampening", c10::IValue(dampening()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("nesterov", c10::IValue(nesterov()));
  archive.write("maximize", c10::IValue(maximize()));
  archive.write("capturable", c10::IValue(capturable()));
}

void FusedSGDOptions::serialize(InputArchive& archive) {
  using detail::read_bool;
  using detail::read_double;
  lr(read_double(archive, "lr", true, 0.0))
      .momentum(read_double(archive, "momentum", true, 0.0))
      .dampening(read_double(archive, "dampening", true, 0.0))
      .weight_decay(read_double(archive, "weight_decay", true, 0.0))
      .nesterov(read_bool(archive, "nesterov", true, false))
      // Absent from LibTorch's checkpoints.
      .maximize(read_bool(archive, "maximize", false, false))
      .capturable(read_bool(archive, "capturable", false, false));
}

bool operator==(const FusedSGDOptions& lhs, const FusedSGDOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.momentum() == rhs.momentum() &&
         lhs.dampening() == rhs.dampening() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.nesterov() == rhs.nesterov() && lhs.maximize() == rhs.maximize() &&
         lhs.capturable() == rhs.capturable();
}

void FusedSGDParamState::serialize(OutputArchive& archive) const {
  detail::write_tensor(archive, "momentum_buffer", momentum_buffer());
}

void FusedSGDParamState::serialize(InputArchive& archive) {
  momentum_buffer(detail::read_tensor(archive, "momentum_buffer"));
}

bool operator==(const FusedSGDParamState& lhs, const FusedSGDParamState& rhs) {
  return detail::same_tensor(lhs.momentum_buffer(), rhs.momentum_buffer());
}

// ---- the optimizer ----

template class detail::FusedOptimizer<FusedSGDOptions, FusedSGDParamState>;

FusedSGD::FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   FusedSGDOptions defaults)
    : FusedOptimizer("FusedSGD", defaults) {
  add_param_groups(std::move(param_groups));
}

FusedSGD::FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults)
    : FusedSGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

void FusedSGD::check_options(const FusedSGDOptions& options, const std::string& where) const {
  detail::check_finite_at_least(options.lr(), 0.0, "lr", where,
                                "pass a learning rate such as 0.01.");
  detail::check_finite_at_least(options.momentum(), 0.0, "momentum", where,
                                "pass 0 for no momentum.");
  detail::check_finite_at_least(options.weight_decay(), 0.0, "weight_decay", where,
                                "pass 0 for no weight decay.");
  TORCH_CHECK(std::isfinite(options.dampening()), where,
              ": dampening must be finite. Got dampening=", options.dampening(),
              "; the default is 0.");
  TORCH_CHECK(!options.nesterov() || (options.momentum() > 0.0 && options.dampening() == 0.0),
              where, ": Nesterov momentum requires a momentum and zero dampening. Got momentum=",
              options.momentum(), " and dampening=", options.dampening(),
              "; set momentum > 0 and dampening 0, or nesterov(false).");
}

FusedSGDOptions FusedSGD::merge_options(const FusedSGDOptions& group,
                                        const FusedSGDOptions& defaults) const {
  // lr has no constructor default in SGDOptions: a group always states its own.
  const FusedSGDOptions fresh(group.lr());
  const auto pick = [](const auto& value, const auto& fresh_value, const auto& default_value) {
    return value == fresh_value ? default_value : value;
  };
  FusedSGDOptions merged = group;
  merged.momentum(pick(group.momentum(), fresh.momentum(), defaults.momentum()))
      .dampening(pick(group.dampening(), fresh.dampening(), defaults.dampening()))
      .weight_decay(pick(group.weight_decay(), fresh.weight_decay(), defaults.weight_decay()))
      .nesterov(pick(group.nesterov(), fresh.nesterov(), defaults.nesterov()))
      .maximize(pick(group.maximize(), fresh.maximize(), defaults.maximize()))
      .capturable(pick(group.capturable(), fresh.capturable(), defaults.capturable()));
  return merged;
}

void FusedSGD::step_group(size_t group_index, const FusedSGDOptions& o,
                          const detail::GroupWork& work,
                          const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf) {
  const auto run = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& bufs,
                       bool is_first_step) {
    std::vector<at::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    const auto call = [&](const auto& lr) {
      at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), lr, o.dampening(),
                      o.nesterov(), o.maximize(), is_first_step, grad_scale, found_inf);
    };
    if (o.capturable()) {
      call(lr_tensor(group_index, o.lr(), work.device));
    } else {
      call(o.lr());
    }
  };
  for (const auto& [dtype, params] : work.params_by_dtype) {
    if (o.momentum() == 0.0) {
      run(params, {}, /*is_first_step=*/false);
      continue;
    }
    // Parameters with a buffer continue their momentum; new ones start it (is_first_step copies
    // the gradient into the buffer). Python decides this once per group; per parameter gives the
    // same numbers and also covers parameters that get a gradient later.
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

std::unique_ptr<FusedSGDParamState> FusedSGD::loaded_state(const at::Tensor& param,
                                                           const FusedSGDParamState& saved,
                                                           const std::string& where) const {
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
}

}  // namespace amp::optim
