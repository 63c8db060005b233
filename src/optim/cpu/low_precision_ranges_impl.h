// The low-precision element loops, included once per instruction set: the including file defines
// AMP_LP_ADAM_RANGE and AMP_LP_SGD_RANGE (the names it exports) and is built with that set's
// flags. Everything else here has internal linkage (see low_precision_element.h), and nothing
// here may instantiate an inline function of another header (c10's string helpers behind
// TORCH_CHECK, say): the linker could keep this file's AVX-512 copy of it for the whole library.
// Errors go through unsupported_range_kind(), defined in low_precision_kernels.cpp (no ISA flags).
#include <type_traits>

#include "optim/cpu/low_precision_ranges.h"

namespace amp::optim::detail::cpu {
namespace {

template <typename P, typename S>
lp::Pointers<P, S> typed(const RangePointers& r) {
  return {static_cast<typename P::Raw*>(r.param), static_cast<typename P::Raw*>(r.grad), r.master,
          static_cast<typename P::Raw*>(r.comp),  static_cast<typename S::Raw*>(r.state0),
          static_cast<typename S::Raw*>(r.state1), static_cast<typename S::Raw*>(r.state2)};
}

// With a scale, the unscaled gradients are written back (as ATen's fused kernels do) in a pass of
// their own, so that the update loop has no conditional store.
template <typename P>
void write_unscaled(typename P::Raw* __restrict grad, float scale, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) grad[i] = P::store(P::load(grad[i]) / scale);
}

// The pointers and constants are copied into locals: the vectoriser cannot otherwise tell that
// the stores through the state pointers leave them unchanged.
template <typename P, typename S, WriteBack W, bool kFlag>
void adam_loop(const RangePointers& r, const AdamScalars& scalars, uint64_t key, int64_t begin,
               int64_t end) {
  const lp::Pointers<P, S> p = typed<P, S>(r);
  const AdamScalars c = scalars;
  for (int64_t i = begin; i < end; ++i) lp::adam_element<P, S, W, kFlag>(p, c, key, i, i);
}

template <typename P, typename S, WriteBack W, bool kFlag>
void sgd_loop(const RangePointers& r, const SgdScalars& scalars, uint64_t key, int64_t begin,
              int64_t end) {
  const lp::Pointers<P, S> p = typed<P, S>(r);
  const SgdScalars c = scalars;
  for (int64_t i = begin; i < end; ++i) lp::sgd_element<P, S, W, kFlag>(p, c, key, i, i);
}

// Calls fn(P{}, S{}, write-back constant, flag constant) for the kind's instantiation.
template <typename Fn>
void dispatch(const RangeKind& kind, const Fn& fn) {
  const auto with_flag = [&](auto p, auto s, auto w) {
    if (kind.flag) return fn(p, s, w, std::true_type{});
    return fn(p, s, w, std::false_type{});
  };
  const auto with_write_back = [&](auto p, auto s) {
    using P = decltype(p);
    switch (kind.write_back) {
      case WriteBack::kRoundNearest:
        return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kRoundNearest>{});
      case WriteBack::kMasterWeights:
        return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kMasterWeights>{});
      case WriteBack::kKahan:
        return with_flag(p, s, std::integral_constant<WriteBack, WriteBack::kKahan>{});
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
        return with_write_back(p, lp::Bf16{});
      case c10::kHalf:
        return with_write_back(p, lp::F16{});
      default:
        unsupported_range_kind(kind);
    }
  };
  if (kind.param_dtype == c10::kBFloat16) return with_state(lp::Bf16{});
  if (kind.param_dtype == c10::kHalf) return with_state(lp::F16{});
  unsupported_range_kind(kind);
}

void maybe_unscale(const RangeKind& kind, const RangePointers& r, bool unscale, float scale,
                   int64_t begin, int64_t end) {
  if (!unscale) return;
  if (kind.param_dtype == c10::kBFloat16) {
    write_unscaled<lp::Bf16>(static_cast<uint16_t*>(r.grad), scale, begin, end);
  } else {
    write_unscaled<lp::F16>(static_cast<uint16_t*>(r.grad), scale, begin, end);
  }
}

}  // namespace

void AMP_LP_ADAM_RANGE(const RangeKind& kind, const RangePointers& r, const AdamScalars& c,
                       uint64_t key, bool unscale, int64_t begin, int64_t end) {
  dispatch(kind, [&](auto p, auto s, auto w, auto flag) {
    adam_loop<decltype(p), decltype(s), decltype(w)::value, decltype(flag)::value>(r, c, key,
                                                                                    begin, end);
  });
  maybe_unscale(kind, r, unscale, c.scale, begin, end);
}

void AMP_LP_SGD_RANGE(const RangeKind& kind, const RangePointers& r, const SgdScalars& c,
                      uint64_t key, bool unscale, int64_t begin, int64_t end) {
  dispatch(kind, [&](auto p, auto s, auto w, auto flag) {
    sgd_loop<decltype(p), decltype(s), decltype(w)::value, decltype(flag)::value>(r, c, key,
                                                                                   begin, end);
  });
  maybe_unscale(kind, r, unscale, c.scale, begin, end);
}

}  // namespace amp::optim::detail::cpu
