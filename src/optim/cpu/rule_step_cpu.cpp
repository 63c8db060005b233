// The step engine on the CPU: one pass over the list (kernels::for_each_list_range), each element
// range run by the widest build of the element loops the CPU has (rule_loops_impl.h), after the
// skip decision and the step counts, which are host values here.
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "kernels/cpu_capability.h"
#include "kernels/cpu_ranges.h"
#include "optim/cpu/rule_loops.h"
#include "optim/step.h"

namespace amp::optim::detail {
namespace {

bool skipped(const StepArgs& args) {
  return args.found_inf.defined() && *args.found_inf.data_ptr<float>() != 0.0f;
}

// Counts the step (when the slot keeps a count) and returns the count after the increment.
float count_step(const StepSlot& slot) {
  if (!slot.step.defined()) return 0.0f;
  float* count = slot.step.data_ptr<float>();
  *count += 1.0f;
  return *count;
}

template <typename T>
T* data(const at::Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

cpu::RangePointers pointers(const StepSlot& slot) {
  return {data<void>(slot.param), data<void>(slot.grad),   data<float>(slot.master),
          data<void>(slot.comp),  data<void>(slot.state0), data<void>(slot.state1),
          data<void>(slot.state2)};
}

// One rule's step: skip on the flag, count each slot's step, take its constants, then run every
// element range.
template <typename Rule>
void run_rule(const std::vector<StepSlot>& slots, const typename Rule::Hyper& hyper,
              const StepArgs& args) {
  static const cpu::RuleRangeFn range_fn =
      kernels::CpuKernels<cpu::RuleRangeFn>{cpu::rule_range_default, cpu::rule_range_avx2,
                                            cpu::rule_range_avx512}
          .pick();
  if (slots.empty() || skipped(args)) return;
  const bool unscale = args.grad_scale.defined();
  const float scale = unscale ? *args.grad_scale.data_ptr<float>() : 1.0f;
  std::vector<typename Rule::Scalars> scalars;
  std::vector<uint64_t> keys;
  std::vector<cpu::RangePointers> ptrs;
  std::vector<int64_t> numels;
  for (const StepSlot& slot : slots) {
    const float count = count_step(slot);
    scalars.push_back(Rule::scalars(hyper, count, slot.first, scale));
    keys.push_back(lp::tensor_key(args.seed, slot.stream, static_cast<uint64_t>(count)));
    ptrs.push_back(pointers(slot));
    numels.push_back(slot.param.numel());
  }
  const cpu::RangeKind kind{rule_id<Rule>(), slots[0].param.scalar_type(), args.state_dtype,
                            args.write_back, Rule::flag(hyper)};
  kernels::for_each_list_range(numels, [&](int, size_t k, int64_t begin, int64_t end) {
    range_fn(kind, ptrs[k], &scalars[k], keys[k], unscale, begin, end);
  });
}

void rule_step_cpu(size_t rule, const std::vector<StepSlot>& slots, const void* hyper,
                   const StepArgs& args) {
  const bool known = lp::with_rule(rule, [&](auto r) {
    using Rule = decltype(r);
    run_rule<Rule>(slots, *static_cast<const typename Rule::Hyper*>(hyper), args);
  });
  TORCH_INTERNAL_ASSERT(known, "amp: no update rule at position ", rule);
}

}  // namespace

constinit kernels::DeviceDispatch<RuleStepFn> rule_step("the optimizer step engine", rule_step_cpu);

namespace cpu {

void unsupported_range_kind(const RangeKind& kind) {
  TORCH_CHECK(kind.param_dtype == c10::kFloat || kind.param_dtype == c10::kBFloat16 ||
                  kind.param_dtype == c10::kHalf,
              "amp's optimizer step engine takes float32, bfloat16 or float16 parameters, not ",
              kind.param_dtype);
  TORCH_CHECK(kind.write_back != WriteBack::kStochastic || kind.param_dtype == c10::kBFloat16,
              "stochastic rounding writes bfloat16 parameters only");
  TORCH_CHECK(kind.param_dtype != c10::kFloat ||
                  (kind.state_dtype == c10::kFloat && kind.write_back == WriteBack::kRoundNearest),
              "float32 parameters keep float32 state and take their update as it is");
  TORCH_CHECK(false, "amp's optimizer step engine has no loop for state of dtype ",
              kind.state_dtype, " (rule ", kind.rule, ")");
}

}  // namespace cpu
}  // namespace amp::optim::detail
