// The step engine on the CPU for the listed rules (rules/all.h): rule_step_here.h's pass, each
// element range run by the widest build of the element loops the CPU has (rule_loops_impl.h).
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "kernels/cpu_capability.h"
#include "optim/engine/cpu/rule_loops.h"
#include "optim/engine/cpu/rule_step_here.h"
#include "optim/engine/step.h"

namespace amp::optim::detail {
namespace {

// The widest build of the element loops this CPU runs.
cpu::RuleRangeFn widest_rule_range() {
  static const cpu::RuleRangeFn range_fn =
      kernels::CpuKernels<cpu::RuleRangeFn>{cpu::rule_range_default, cpu::rule_range_avx2,
                                            cpu::rule_range_avx512}
          .for_this_cpu();
  return range_fn;
}

void rule_step_cpu(size_t rule, const std::vector<StepSlot>& slots, const void* hyper,
                   const StepArgs& args) {
  const cpu::RuleRangeFn range_fn = widest_rule_range();
  const bool known = engine::with_rule(rule, [&](auto r) {
    using Rule = decltype(r);
    cpu::run_rule_on_cpu<Rule>(rule, slots, *static_cast<const typename Rule::Hyper*>(hyper), args,
                               range_fn);
  });
  TORCH_INTERNAL_ASSERT(known, "amp: no update rule at position ", rule);
}

}  // namespace

constinit kernels::DeviceDispatch<RuleStepFn> rule_step("the optimizer step engine", rule_step_cpu);

namespace cpu {

void unsupported_range_kind(const StepKind& kind) {
  // step_kind() refused every kind outside the legal matrix before the loops ran.
  TORCH_INTERNAL_ASSERT(false, "amp's optimizer step engine has no loop for rule ", kind.rule,
                        " with dtypes ", static_cast<int>(kind.param_dtype), "/",
                        static_cast<int>(kind.state_dtype), " and write-back ",
                        static_cast<int>(kind.write_back));
}

}  // namespace cpu
}  // namespace amp::optim::detail
