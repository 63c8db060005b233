// The step engine's element loops on the CPU: rule_loops_impl.h built once per instruction set
// (amp_isa_sources; baseline x86-64, AVX2+FMA+F16C, AVX-512), one function each that runs any
// rule of rules/all.h, picked at run time by rule_step_cpu.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/engine/instances.h"

namespace amp::optim::detail::cpu {

/// One parameter's data (null where the step keeps no such tensor); `state` by the rule's slots.
struct RangePointers {
  void* param;
  void* grad;
  float* master;
  void* comp;
  void* state[kMaxStateSlots];
};

/// Throws the sentence for a kind no loop is built for (defined in rule_step_cpu.cpp, so that
/// the per-instruction-set files instantiate none of c10's error helpers).
[[noreturn]] void unsupported_range_kind(const StepKind& kind);

/// Elements [begin, end) of one parameter: the rule's update with `scalars` (a pointer to the
/// rule's Scalars), then (with `unscale`) the unscaled gradients written back.
using RuleRangeFn = void (*)(const StepKind& kind, const RangePointers& pointers,
                             const void* scalars, uint64_t key, bool unscale, int64_t begin,
                             int64_t end);

void rule_range_default(const StepKind&, const RangePointers&, const void*, uint64_t, bool, int64_t,
                        int64_t);
void rule_range_avx2(const StepKind&, const RangePointers&, const void*, uint64_t, bool, int64_t,
                     int64_t);
void rule_range_avx512(const StepKind&, const RangePointers&, const void*, uint64_t, bool, int64_t,
                       int64_t);

}  // namespace amp::optim::detail::cpu
