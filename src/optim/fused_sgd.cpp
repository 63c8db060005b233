// FusedSGD: Python's fused SGD step (torch/optim/sgd.py, _fused_sgd) over at::_fused_sgd_, with
// zero-initialised momentum buffers; its options and state in LibTorch's SGD layout.
#include <cmath>

#include <ATen/ATen.h>

#include <amp/optim/sgd.h>

#include "optim/field_list.h"
#include "optim/fused_optimizer.h"

namespace amp::optim {

// ---- options and state ----

FusedSGDOptions::FusedSGDOptions(double lr) { this->lr(lr); }

namespace {

// FusedSGDOptions' fields: LibTorch's SGDOptions entries first (torch::optim::SGD reads them),
// then maximize and capturable, which its archives lack.
const auto& sgd_fields() {
  static const detail::OptionList fields(
      AMP_OPTIMIZER_FIELDS(FusedSGDOptions, kYes, lr, momentum, dampening, weight_decay, nesterov),
      AMP_OPTIMIZER_FIELDS(FusedSGDOptions, kNo, maximize, capturable));
  return fields;
}

// FusedSGDParamState's tensors: LibTorch's SGDParamState entry, then the low-precision options'
// (LibTorch's SGD reads past them; the step count, a tensor here, exists only under them).
const auto& sgd_state_fields() {
  static const detail::StateList fields(AMP_STATE_FIELDS(
      FusedSGDParamState, kTensor, momentum_buffer, step, master_weight, kahan_comp));
  return fields;
}

}  // namespace

AMP_SERIALIZE_FROM_FIELDS(FusedSGDOptions, sgd_fields)
AMP_SERIALIZE_FROM_FIELDS(FusedSGDParamState, sgd_state_fields)

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
  return sgd_fields().merge(group, defaults);
}

namespace {

// One dtype bucket of bfloat16/float16 parameters through amp's step engine under the
// low-precision options.
void sgd_low_precision(const detail::EngineBucket& bucket, const FusedSGDOptions& o) {
  using Rule = detail::engine::SgdRule;
  const detail::SgdHyper hyper{o.lr(),           o.momentum(), o.dampening(),
                               o.weight_decay(), o.nesterov(), o.maximize()};
  detail::step_on_engine<Rule, FusedSGDParamState>(
      bucket, o, hyper,
      [&](FusedSGDParamState& state, const at::Tensor& param, detail::StepSlot& slot) {
        // A new buffer starts at zeros (as on the ATen path): a skipped first step leaves zeros.
        slot.first = o.momentum() != 0.0 && !state.momentum_buffer().defined();
        if (o.momentum() != 0.0) {
          state.momentum_buffer(
              detail::state_tensor(state.momentum_buffer(), param, bucket.plan.state_dtype));
        }
        slot.state[Rule::kMomentumBuffer] = state.momentum_buffer();
      });
}

}  // namespace

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
  std::optional<detail::ParamPositions> positions;
  for (const auto& [dtype, params] : work.params_by_dtype) {
    if (const auto plan = detail::low_precision_plan(o, dtype)) {
      if (!positions) positions.emplace(param_groups_, param_positions());
      const std::string where = detail::group_where(name(), group_index);
      sgd_low_precision({state_, *plan, params, *positions, grad_scale, found_inf, where}, o);
      continue;
    }
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
                                                           const FusedSGDOptions& options,
                                                           const std::string& where) const {
  auto state = std::make_unique<FusedSGDParamState>();
  const auto plan = detail::low_precision_plan(options, param.scalar_type());
  state->momentum_buffer(detail::loaded_state_tensor(
      saved.momentum_buffer(), param, detail::state_dtype_for(options, param.scalar_type()),
      "momentum_buffer", where));
  if (!plan) return state;
  // The low-precision entries, kept where the loaded options use them.
  if (saved.step().defined()) {
    const at::Tensor& count = saved.step();
    TORCH_CHECK(count.numel() == 1 && count.is_floating_point(), where,
                " has a step entry that is not a 1-element float tensor; the checkpoint is not "
                "a FusedSGD checkpoint. The optimizer is unchanged.");
    const float value = count.item<float>();
    TORCH_CHECK(std::isfinite(value) && value >= 0 && value == std::floor(value), where,
                " has a step count of ", value,
                "; a count is a whole number >= 0. The optimizer is unchanged.");
    state->step(count.reshape({}).to(param.device(), at::kFloat, false, /*copy=*/true));
  }
  detail::load_write_back_state(*state, saved, param, plan, where);
  return state;
}

}  // namespace amp::optim
