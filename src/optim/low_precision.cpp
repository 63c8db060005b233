// The optimizers' low-precision state: checks of the parameters the step engine runs on, and the
// state tensors (moments, master copies, compensation) created, converted or loaded in the dtypes
// the options give them.
#include "optim/low_precision.h"

#include <ATen/ATen.h>

#include "amp/version.h"

namespace amp::optim::detail {

void check_low_precision_param(const at::Tensor& param, uint64_t position,
                               const std::string& where) {
  TORCH_CHECK(
      param.device().is_cpu() || (AMP_BUILT_WITH_CUDA && param.device().is_cuda()), where,
      ": the parameter at position ", position, " (counting all groups) is on ", param.device(),
      ", but amp's step engine (Lion; Adam and SGD with master_weights, kahan_summation, "
      "stochastic_rounding or state_dtype) runs on the CPU",
      (AMP_BUILT_WITH_CUDA ? " and CUDA" : " only in this build of amp (AMP_WITH_CUDA=OFF)"),
      "; move the model, or leave these options unset.");
  TORCH_CHECK(param.is_contiguous() && param.grad().is_contiguous(), where,
              ": the parameter at position ", position,
              " (counting all groups) or its gradient is not contiguous, and the step engine walks "
              "both element by element; make the parameter contiguous before building the "
              "optimizer.");
}

at::Tensor loaded_state_tensor(const at::Tensor& saved, const at::Tensor& param,
                               c10::ScalarType dtype, const char* key, const std::string& where) {
  if (!saved.defined()) return at::Tensor();
  TORCH_CHECK(saved.sizes() == param.sizes() && at::isFloatingType(saved.scalar_type()), where,
              " has ", key, " of ", saved.scalar_type(), " ", saved.sizes(),
              " but the parameter is ", param.scalar_type(), " ", param.sizes(),
              "; the checkpoint belongs to another model. The optimizer is unchanged.");
  // In the parameter's layout (channels-last stays channels-last): ATen's fused CPU kernels walk
  // a parameter and its state by one linear index, so their strides must agree, as they do for
  // the state a first step creates (zeros_like the parameter).
  at::Tensor state =
      at::empty_like(param, param.options().dtype(dtype), at::MemoryFormat::Preserve);
  state.copy_(saved);
  return state;
}

at::Tensor state_tensor(const at::Tensor& current, const at::Tensor& param, c10::ScalarType dtype) {
  if (!current.defined()) {
    return at::zeros(param.sizes(), param.options().dtype(dtype));
  }
  if (current.scalar_type() == dtype) return current;
  return current.to(dtype);
}

void fit_write_back_state(at::Tensor& master, at::Tensor& comp, const at::Tensor& param,
                          const std::optional<LowPrecisionPlan>& plan) {
  const bool wants_master = plan && plan->write_back == WriteBack::kMasterWeights;
  const bool wants_comp = plan && plan->write_back == WriteBack::kKahan;
  if (!wants_master) {
    master = at::Tensor();
  } else if (!master.defined()) {
    master = param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  if (!wants_comp) {
    comp = at::Tensor();
  } else if (!comp.defined()) {
    comp = at::zeros_like(param, at::MemoryFormat::Contiguous);
  }
}

}  // namespace amp::optim::detail

namespace amp::optim::detail {

StepSlot engine_slot(const at::Tensor& param, uint64_t position, at::Tensor& step,
                     at::Tensor& master, at::Tensor& comp, const LowPrecisionPlan& plan) {
  // On the parameter's device: the CUDA kernels count steps there, with no host read.
  if (!step.defined()) step = at::zeros({}, param.options().dtype(at::kFloat));
  fit_write_back_state(master, comp, param, plan);
  StepSlot slot;
  slot.param = param;
  slot.grad = param.grad();
  slot.master = master;
  slot.comp = comp;
  // GradScaler unscaled the float16 gradient into the master copy's float32 gradient.
  if (master.defined() && master.grad().defined()) slot.float32_grad = master.grad();
  slot.step = step;
  slot.stream = position;
  return slot;
}

}  // namespace amp::optim::detail
