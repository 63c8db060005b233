// The CPU kernels of the fused optimizers' low-precision modes: one pass per optimizer family over
// a list of bfloat16/float16 parameters that unscales, updates the state and writes each value
// back by round-to-nearest, from an fp32 master copy, through Kahan compensation, or by
// stochastic rounding. The arithmetic is stated element by element in
// tests/parity/low_precision_reference.py (summarised in docs/GUIDE.md), which the parity suite
// compares with this kernel bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace amp::optim::detail {

/// How an updated value reaches a low-precision parameter.
enum class WriteBack {
  kRoundNearest,   ///< parameter = round(parameter + update)
  kMasterWeights,  ///< master += update (fp32); parameter = round(master)
  kKahan,          ///< the update goes through a compensation buffer in the parameter's dtype
  kStochastic,     ///< parameter = stochastic_round(parameter + update) (bfloat16 only)
};

/// One parameter's tensors for a step: all contiguous CPU tensors shaped like `param`.
/// `state0` is exp_avg (Adam) or the momentum buffer (SGD, undefined without momentum);
/// `state1` exp_avg_sq and `state2` max_exp_avg_sq (Adam). `step` (0-dim float32) counts the
/// steps taken: Adam's bias corrections and the rounding bits read it after the increment.
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
  /// The scale the gradients carry (0-dim float32 CPU tensor) or undefined: divides them (and
  /// the unscaled values are written back to the gradients, as ATen's fused kernels do).
  at::Tensor grad_scale;
  /// The inf/NaN flag (0-dim float32 CPU tensor) or undefined: non-zero leaves every tensor,
  /// step counts included, untouched.
  at::Tensor found_inf;
};

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
};

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
};

/// Adam (decoupled = false) and AdamW over `slots` (one parameter dtype); see the file header.
void adam_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& hyper,
                            const LowPrecisionStep& step);

/// SGD with momentum, dampening, Nesterov and weight decay over `slots` (one parameter dtype).
void sgd_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& hyper,
                           const LowPrecisionStep& step);

/// The 16 random bits stochastic rounding adds to element `index` of the parameter at position
/// `stream` on step `step` (the count after the increment), for `seed`. A counter-based hash:
/// no generator state, so any element of any step can be recomputed (tests, resumes).
uint32_t rounding_bits(uint64_t seed, uint64_t stream, uint64_t step, uint64_t index);

/// `value` stochastically rounded to bfloat16 with the random 16 bits `bits` (torchao's rule:
/// add them to the low half of the float32 pattern, then truncate); returns the bfloat16 bits.
uint16_t stochastic_round_bf16(float value, uint32_t bits);

}  // namespace amp::optim::detail
