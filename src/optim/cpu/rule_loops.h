// The step engine's element loops on the CPU: rule_loops_impl.h built once per instruction set
// (amp_isa_sources; baseline x86-64, AVX2+FMA+F16C, AVX-512), one function each that runs any
// rule of rules/all.h, picked at run time by rule_step_cpu.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include <c10/core/ScalarType.h>

#include "optim/element.h"

namespace amp::optim::detail::cpu {

/// Which instantiation of the loop a range runs.
struct RangeKind {
  size_t rule;                  // rule_id<Rule>()
  c10::ScalarType param_dtype;  // Float, BFloat16 or Half
  c10::ScalarType state_dtype;  // Float, BFloat16 or Half (Float for Float parameters)
  WriteBack write_back;         // kRoundNearest for Float parameters
  bool flag;                    // Rule::flag(hyper)
};

/// One parameter's data (null where the step keeps no such tensor).
struct RangePointers {
  void* param;
  void* grad;
  float* master;
  void* comp;
  void* state0;
  void* state1;
  void* state2;
};

/// Throws the sentence for a kind no loop is built for (defined in rule_step_cpu.cpp, so that
/// the per-instruction-set files instantiate none of c10's error helpers).
[[noreturn]] void unsupported_range_kind(const RangeKind& kind);

/// Elements [begin, end) of one parameter: the rule's update with `scalars` (a pointer to the
/// rule's Scalars), then (with `unscale`) the unscaled gradients written back.
using RuleRangeFn = void (*)(const RangeKind& kind, const RangePointers& pointers,
                             const void* scalars, uint64_t key, bool unscale, int64_t begin,
                             int64_t end);

void rule_range_default(const RangeKind&, const RangePointers&, const void*, uint64_t, bool,
                        int64_t, int64_t);
void rule_range_avx2(const RangeKind&, const RangePointers&, const void*, uint64_t, bool, int64_t,
                     int64_t);
void rule_range_avx512(const RangeKind&, const RangePointers&, const void*, uint64_t, bool, int64_t,
                       int64_t);

}  // namespace amp::optim::detail::cpu
