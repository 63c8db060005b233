// The step engine's element loops, compiled once per instruction set by amp_isa_sources
// (cmake/AmpKernels.cmake; AMP_ISA_FN names the export): every rule of rules/all.h through
// rule_loop.h. Everything here has internal linkage but the one exported function; errors go
// through unsupported_range_kind(), defined in a baseline file.
#include "optim/engine/cpu/rule_loop.h"
#include "optim/engine/cpu/rule_loops.h"
#include "optim/rules/all.h"

namespace amp::optim::detail::cpu {

void AMP_ISA_FN(rule_range)(const StepKind& kind, const RangePointers& r, const void* scalars,
                            uint64_t key, bool unscale, int64_t begin, int64_t end) {
  bool ran = false;
  const bool known = engine::with_rule(kind.rule, [&](auto rule) {
    ran = rule_range<decltype(rule)>(kind, r, scalars, key, unscale, begin, end);
  });
  if (!known || !ran) unsupported_range_kind(kind);
}

}  // namespace amp::optim::detail::cpu
