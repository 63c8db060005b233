// amp's optimizer step engine: one update rule (rules/*.h, the contract in engine/rule.h) over a
// list of parameters of one dtype on one device, with the state dtype and write-back the options
// chose, unscaling by GradScaler's scale and skipping on its flag without a host read. The CPU
// runs it as one parallel loop (built per instruction set), CUDA as multi-tensor launches; both
// give the same bits. Adam and SGD use it for bfloat16/float16 parameters (ATen's fused kernels
// update their float32 ones), Lion for every dtype.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "kernels/dispatch.h"
#include "kernels/dtype_of.h"
#include "optim/engine/instances.h"
#include "optim/rules/all.h"

namespace amp::optim::detail {

/// One parameter's tensors for a step: all contiguous, on the parameter's device, shaped like
/// `param` (undefined where the step keeps no such tensor). `state` holds the rule's state by its
/// slot names (state[AdamRule::kExpAvgSq] is exp_avg_sq). `step` (0-dim float32 on the
/// parameter's device) counts the steps taken: the rule and the rounding bits read it after the
/// increment.
struct StepSlot {
  at::Tensor param, grad, master, comp;
  std::array<at::Tensor, kMaxStateSlots> state;
  at::Tensor step;
  /// master_weights with a float16 gradient that GradScaler unscaled into float32 (the master
  /// copy's grad()): the rule then updates `master` as a float32 parameter with this gradient, and
  /// `param` takes the rounded result.
  at::Tensor float32_grad;
  /// The parameter's position in its optimizer: which stream of rounding bits it draws.
  uint64_t stream = 0;
  /// The rule's state is new this step (SGD's momentum copies the gradient).
  bool first = false;
};

/// What every slot of a step shares besides the rule's hyper-parameters.
struct StepArgs {
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

/// A device's step: `rule` is rule_id<Rule>(), `hyper` points to that rule's Hyper.
using RuleStepFn = void (*)(size_t rule, const std::vector<StepSlot>& slots, const void* hyper,
                            const StepArgs& args);

/// The CPU step (cpu/rule_step_cpu.cpp) and, in a build with CUDA, the CUDA one
/// (cuda/rule_step_cuda.cpp registers it).
extern kernels::DeviceDispatch<RuleStepFn> rule_step;

/// Runs rule `rule` (rule_id<Rule>()) over `slots` (one device, one parameter dtype) on their
/// device. Slots with a float32_grad step their master copy as a float32 parameter (the
/// arithmetic of the master-weights write-back, which reads the gradient in float32 too) and copy
/// it, rounded, to the parameter unless the step is skipped; the float32 gradient is then let go.
/// (step.cpp)
void run_step(size_t rule, const std::vector<StepSlot>& slots, const void* hyper,
              const StepArgs& args);

/// Runs `Rule` over `slots` (see run_step).
template <typename Rule>
void run_rule_step(const std::vector<StepSlot>& slots, const typename Rule::Hyper& hyper,
                   const StepArgs& args) {
  if (slots.empty()) return;
  run_step(rule_id<Rule>(), slots, &hyper, args);
}

/// Whether `dtype` is a parameter dtype the engine updates (float32, bfloat16, float16).
inline bool engine_param_dtype(c10::ScalarType dtype) {
  const auto kernel_dtype = kernels::dtype_of(dtype);
  return kernel_dtype && engine_stores(*kernel_dtype);
}

/// The instantiation `slots` (not empty) run with: refused with the legal matrix's sentence
/// (engine/instances.h) when the engine builds none. `variant` is the rule's variant(hyper).
inline StepKind step_kind(size_t rule, const std::vector<StepSlot>& slots, const StepArgs& args,
                          bool variant) {
  const c10::ScalarType param = slots[0].param.scalar_type();
  const auto param_dtype = kernels::dtype_of(param);
  const auto state_dtype = kernels::dtype_of(args.state_dtype);
  TORCH_CHECK(param_dtype && engine_stores(*param_dtype),
              "amp's optimizer step engine takes float32, bfloat16 or float16 parameters, not ",
              param);
  TORCH_CHECK(state_dtype && engine_stores(*state_dtype),
              "amp's optimizer step engine keeps float32, bfloat16 or float16 state, not ",
              args.state_dtype);
  const char* unsupported = unsupported_step(*param_dtype, *state_dtype, args.write_back);
  TORCH_CHECK(unsupported == nullptr, unsupported, " (", param, " parameters, ", args.state_dtype,
              " state)");
  return StepKind{rule, *param_dtype, *state_dtype, args.write_back, variant};
}

}  // namespace amp::optim::detail
