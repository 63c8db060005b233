// One rule's element loop over a range of one parameter, as templates with internal linkage: the
// per-instruction-set builds (rule_loops_impl.h) instantiate it for every listed rule, and
// rule_step_here.h for a rule of the including file. Nothing here may instantiate an inline
// function of another header (c10's string helpers behind TORCH_CHECK, say): the linker could
// keep an AVX-512 copy of it for the whole library.
#pragma once

#include <cstdint>

#include "optim/engine/cpu/rule_loops.h"
#include "optim/engine/instances.h"

namespace amp::optim::detail::cpu {
namespace {

template <typename P, typename S>
engine::Pointers<P, S> typed(const RangePointers& r) {
  engine::Pointers<P, S> p{static_cast<typename P::Raw*>(r.param),
                           static_cast<typename P::Raw*>(r.grad),
                           r.master,
                           static_cast<typename P::Raw*>(r.comp),
                           {}};
  for (int s = 0; s < kMaxStateSlots; ++s) p.state[s] = static_cast<typename S::Raw*>(r.state[s]);
  return p;
}

// With a scale, the unscaled gradients are written back (as ATen's fused kernels do) in a pass of
// their own, so that the update loop has no conditional store.
template <typename P>
void write_unscaled(typename P::Raw* __restrict grad, float scale, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) grad[i] = P::store(P::load(grad[i]) / scale);
}

// The pointers and constants are copied into locals: the vectoriser cannot otherwise tell that
// the stores through the state pointers leave them unchanged.
template <typename Rule, typename P, typename S, WriteBack W, bool kVariant>
void loop(const RangePointers& r, const void* scalars, uint64_t key, int64_t begin, int64_t end) {
  const engine::Pointers<P, S> p = typed<P, S>(r);
  const typename Rule::Scalars c = *static_cast<const typename Rule::Scalars*>(scalars);
  for (int64_t i = begin; i < end; ++i) Rule::template element<P, S, W, kVariant>(p, c, key, i, i);
}

/// Elements [begin, end) of one parameter under `Rule` (see RuleRangeFn); false, touching
/// nothing, for a kind outside the legal matrix.
template <typename Rule>
bool rule_range(const StepKind& kind, const RangePointers& r, const void* scalars, uint64_t key,
                bool unscale, int64_t begin, int64_t end) {
  const bool ran = engine::with_instance<Rule>(kind, [&](auto p, auto s, auto w, auto variant) {
    loop<Rule, decltype(p), decltype(s), decltype(w)::value, decltype(variant)::value>(
        r, scalars, key, begin, end);
    if (unscale) {
      const float scale = static_cast<const typename Rule::Scalars*>(scalars)->scale;
      write_unscaled<decltype(p)>(static_cast<typename decltype(p)::Raw*>(r.grad), scale, begin,
                                  end);
    }
  });
  return ran;
}

}  // namespace
}  // namespace amp::optim::detail::cpu
