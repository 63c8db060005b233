// The fused optimizers' low-precision state: checks of the parameters a low-precision step runs
// on, and the state tensors (moments, master copies, compensation) created, converted or loaded
// in the dtypes the options give them.
#include "optim/low_precision.h"

#include <ATen/ATen.h>

#include "amp/version.h"

namespace amp::optim::detail {

void check_low_precision_param(const at::Tensor& param, uint64_t position,
                               const std::string& where) {
  TORCH_CHECK(param.device().is_cpu() || (AMP_BUILT_WITH_CUDA && param.device().is_cuda()), where,
              ": the parameter at position ", position, " (counting all groups) is on ",
              param.device(),
              ", but master_weights, kahan_summation, stochastic_rounding and state_dtype run on "
              "the CPU",
              (AMP_BUILT_WITH_CUDA ? " and CUDA" : " only in this build of amp (AMP_WITH_CUDA=OFF)"),
              "; move the model, or leave these options unset.");
  TORCH_CHECK(param.is_contiguous() && param.grad().is_contiguous(), where,
              ": the parameter at position ", position, " (counting all groups) or its gradient is not contiguous, and the low-precision kernels walk both "
              "element by element; make the parameter contiguous before building the optimizer.");
}

namespace {

// Picks the kernels of the parameters' device.
template <typename Hyper, typename Cpu, typename Cuda>
void run_on_device(const std::vector<LowPrecisionSlot>& slots, const Hyper& hyper,
                   const LowPrecisionStep& step, Cpu cpu, Cuda cuda) {
  if (slots.empty()) return;
  if (slots[0].param.is_cuda()) {
    cuda(slots, hyper, step);
  } else {
    cpu(slots, hyper, step);
  }
}

}  // namespace

void adam_low_precision(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& hyper,
                        const LowPrecisionStep& step) {
  run_on_device(slots, hyper, step, adam_low_precision_cpu, adam_low_precision_cuda);
}

void sgd_low_precision(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& hyper,
                       const LowPrecisionStep& step) {
  run_on_device(slots, hyper, step, sgd_low_precision_cpu, sgd_low_precision_cuda);
}

#if !AMP_BUILT_WITH_CUDA
// Without CUDA, check_low_precision_param has refused CUDA parameters before these are reached.
void adam_low_precision_cuda(const std::vector<LowPrecisionSlot>&, const AdamHyper&,
                             const LowPrecisionStep&) {
  TORCH_CHECK(false, "amp was built without CUDA (AMP_WITH_CUDA=OFF)");
}

void sgd_low_precision_cuda(const std::vector<LowPrecisionSlot>&, const SgdHyper&,
                            const LowPrecisionStep&) {
  TORCH_CHECK(false, "amp was built without CUDA (AMP_WITH_CUDA=OFF)");
}
#endif

at::Tensor loaded_state_tensor(const at::Tensor& saved, const at::Tensor& param,
                               c10::ScalarType dtype, const char* key, const std::string& where) {
  if (!saved.defined()) return at::Tensor();
  TORCH_CHECK(saved.sizes() == param.sizes() && at::isFloatingType(saved.scalar_type()), where,
              " has ", key, " of ", saved.scalar_type(), " ", saved.sizes(),
              " but the parameter is ", param.scalar_type(), " ", param.sizes(),
              "; the checkpoint belongs to another model. The optimizer is unchanged.");
  return saved.to(param.device(), dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
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
