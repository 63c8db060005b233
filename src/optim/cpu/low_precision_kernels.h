// The fused optimizers' low-precision steps over a list of bfloat16/float16 parameters: one pass
// per optimizer family that unscales, updates the state and writes each value back by
// round-to-nearest, from an fp32 master copy, through Kahan compensation, or by stochastic
// rounding. The element arithmetic (low_precision_element.h) is stated in
// tests/parity/low_precision_reference.py, which the parity suite compares with it bit for bit;
// the CPU runs it here, CUDA in optim/cuda/low_precision_kernels.cu.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "optim/low_precision_element.h"

namespace amp::optim::detail {

/// One parameter's tensors for a step: all contiguous tensors on the parameter's device, shaped
/// like `param`. `state0` is exp_avg (Adam) or the momentum buffer (SGD, undefined without
/// momentum); `state1` exp_avg_sq and `state2` max_exp_avg_sq (Adam). `step` (0-dim float32, on
/// the parameter's device) counts the steps taken: Adam's bias corrections and the rounding bits
/// read it after the increment.
struct LowPrecisionSlot {
  at::Tensor param, grad, master, comp, state0, state1, state2, step;
  /// The parameter's position in its optimizer: which stream of rounding bits it draws.
  uint64_t stream = 0;
  /// SGD: the momentum buffer is new, so this step copies the gradient into it.
  bool first_momentum = false;
};

/// What every low-precision step needs besides the optimizer's own options.
struct LowPrecisionStep {
  WriteBack write_back = WriteBack::kRoundNearest;
  c10::ScalarType state_dtype = c10::kFloat;
  uint64_t seed = 0;
  /// The scale the gradients carry (0-dim float32 on the parameters' device) or undefined:
  /// divides them (and the unscaled values are written back to the gradients, as ATen's fused
  /// kernels do).
  at::Tensor grad_scale;
  /// The inf/NaN flag (0-dim float32 on the parameters' device) or undefined: non-zero leaves
  /// every tensor, step counts included, untouched.
  at::Tensor found_inf;
};

/// Adam (decoupled = false) and AdamW over `slots` (CPU tensors of one parameter dtype).
void adam_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& hyper,
                            const LowPrecisionStep& step);

/// SGD with momentum, dampening, Nesterov and weight decay over `slots` (CPU, one dtype).
void sgd_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& hyper,
                           const LowPrecisionStep& step);

/// The same steps on CUDA tensors, queued on the current stream with no host read (the skip and
/// the step counts stay on the device). Throws when amp was built without CUDA.
void adam_low_precision_cuda(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& hyper,
                             const LowPrecisionStep& step);
void sgd_low_precision_cuda(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& hyper,
                            const LowPrecisionStep& step);

}  // namespace amp::optim::detail
