// The step engine's element loops, compiled once per instruction set by amp_isa_sources
// (cmake/AmpKernels.cmake; AMP_ISA_FN names the export). Everything here has internal linkage
// but the one exported function, and nothing may instantiate an inline function of another header
// (c10's string helpers behind TORCH_CHECK, say): the linker could keep this file's AVX-512 copy
// of it for the whole library. Errors go through unsupported_range_kind(), defined in a baseline
// file.
#include <type_traits>

#include "optim/cpu/rule_loops.h"
#include "optim/rules/all.h"

namespace amp::optim::detail::cpu {
namespace {

template <typename P, typename S>
lp::Pointers<P, S> typed(const RangePointers& r) {
  return {static_cast<typename P::Raw*>(r.param),
          static_cast<typename P::Raw*>(r.grad),
          r.master,
          static_cast<typename P::Raw*>(r.comp),
          static_cast<typename S::Raw*>(r.state0),
          static_cast<typename S::Raw*>(r.state1),
          static_cast<typename S::Raw*>(r.state2)};
}

// With a scale, the unscaled gradients are written back (as ATen's fused kernels do) in a pass of
// their own, so that the update loop has no conditional store.
template <typename P>
void write_unscaled(typename P::Raw* __restrict grad, float scale, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) grad[i] = P::store(P::load(grad[i]) / scale);
}

// The pointers and constants are copied into locals: the vectoriser cannot otherwise tell that
// the stores through the state pointers leave them unchanged.
template <typename Rule, typename P, typename S, WriteBack W, bool kFlag>
void loop(const RangePointers& r, const void* scalars, uint64_t key, int64_t begin, int64_t end) {
  const lp::Pointers<P, S> p = typed<P, S>(r);
  const typename Rule::Scalars c = *static_cast<const typename Rule::Scalars*>(scalars);
  for (int64_t i = begin; i < end; ++i) Rule::template element<P, S, W, kFlag>(p, c, key, i, i);
}

// Calls fn(P{}, S{}, write-back constant, flag constant) for the kind's instantiation. Float32
// parameters have float32 state and the plain write-back; stochastic rounding writes bfloat16.
template <typename Rule, typename Fn>
void dispatch(const RangeKind& kind, const Fn& fn) {
  const auto with_flag = [&](auto p, auto s, auto w) {
    if constexpr (Rule::kHasFlag) {
      if (kind.flag) return fn(p, s, w, std::true_type{});
    }
    return fn(p, s, w, std::false_type{});
  };
  const auto with_write_back = [&](auto p, auto s) {
    using P = decltype(p);
    switch (kind.write_back) {
      case WriteBack::kRoundNearest:
        return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kRoundNearest>{});
      case WriteBack::kMasterWeights:
        if constexpr (!std::is_same_v<P, lp::F32>) {
          return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kMasterWeights>{});
        }
        break;
      case WriteBack::kKahan:
        if constexpr (!std::is_same_v<P, lp::F32>) {
          return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kKahan>{});
        }
        break;
      case WriteBack::kStochastic:
        if constexpr (std::is_same_v<P, lp::Bf16>) {
          return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kStochastic>{});
        }
        break;
    }
    unsupported_range_kind(kind);
  };
  const auto with_state = [&](auto p) {
    switch (kind.state_dtype) {
      case c10::kFloat:
        return with_write_back(p, lp::F32{});
      case c10::kBFloat16:
        if constexpr (!std::is_same_v<decltype(p), lp::F32>) return with_write_back(p, lp::Bf16{});
        break;
      case c10::kHalf:
        if constexpr (!std::is_same_v<decltype(p), lp::F32>) return with_write_back(p, lp::F16{});
        break;
      default:
        break;
    }
    unsupported_range_kind(kind);
  };
  switch (kind.param_dtype) {
    case c10::kBFloat16:
      return with_state(lp::Bf16{});
    case c10::kHalf:
      return with_state(lp::F16{});
    case c10::kFloat:
      return with_state(lp::F32{});
    default:
      break;
  }
  unsupported_range_kind(kind);
}

void maybe_unscale(const RangeKind& kind, const RangePointers& r, bool unscale, float scale,
                   int64_t begin, int64_t end) {
  if (!unscale) return;
  if (kind.param_dtype == c10::kBFloat16) {
    write_unscaled<lp::Bf16>(static_cast<uint16_t*>(r.grad), scale, begin, end);
  } else if (kind.param_dtype == c10::kHalf) {
    write_unscaled<lp::F16>(static_cast<uint16_t*>(r.grad), scale, begin, end);
  } else {
    write_unscaled<lp::F32>(static_cast<float*>(r.grad), scale, begin, end);
  }
}

}  // namespace

void AMP_ISA_FN(rule_range)(const RangeKind& kind, const RangePointers& r, const void* scalars,
                            uint64_t key, bool unscale, int64_t begin, int64_t end) {
  float scale = 1.0f;
  const bool known = lp::with_rule(kind.rule, [&](auto rule) {
    using Rule = decltype(rule);
    dispatch<Rule>(kind, [&](auto p, auto s, auto w, auto flag) {
      loop<Rule, decltype(p), decltype(s), decltype(w)::value, decltype(flag)::value>(
          r, scalars, key, begin, end);
    });
    scale = static_cast<const typename Rule::Scalars*>(scalars)->scale;
  });
  if (!known) unsupported_range_kind(kind);
  maybe_unscale(kind, r, unscale, scale, begin, end);
}

}  // namespace amp::optim::detail::cpu
