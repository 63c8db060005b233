// Which instantiations of a rule's element arithmetic the step engine builds, in one place: the
// legal matrix of parameter dtype, state dtype and write-back, checked by the host before a step
// (step.cpp) and used at compile time by the CPU loops and the CUDA kernel to instantiate exactly
// those. No ATen here: nvcc compiles this header too.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/dtype.h"
#include "optim/engine/element.h"

namespace amp::optim::detail {

/// StepKind::rule of a rule that rules/all.h does not list (run_rule_step_here).
constexpr size_t kUnlistedRule = static_cast<size_t>(-1);

/// The instantiation a step runs.
struct StepKind {
  size_t rule;                 // rule_id<Rule>(), or kUnlistedRule
  kernels::Dtype param_dtype;  // kFloat, kBFloat16 or kHalf
  kernels::Dtype state_dtype;  // kFloat, kBFloat16 or kHalf (kFloat for float32 parameters)
  WriteBack write_back;        // kRoundNearest for float32 parameters
  bool variant;                // Rule::variant(hyper): Adam's amsgrad, SGD's momentum
};

/// Whether the engine stores tensors of `dtype` (float32, bfloat16, float16; not float64).
AMP_HOST_DEVICE constexpr bool engine_stores(kernels::Dtype dtype) {
  return dtype == kernels::Dtype::kFloat || dtype == kernels::Dtype::kBFloat16 ||
         dtype == kernels::Dtype::kHalf;
}

/// The legal matrix: nullptr when the engine has a loop for these dtypes and write-back, else the
/// sentence saying why not.
AMP_HOST_DEVICE constexpr const char* unsupported_step(kernels::Dtype param, kernels::Dtype state,
                                                       WriteBack write_back) {
  using kernels::Dtype;
  if (!engine_stores(param)) {
    return "amp's optimizer step engine takes float32, bfloat16 or float16 parameters";
  }
  if (!engine_stores(state))
    return "amp's optimizer step engine keeps float32, bfloat16 or float16 state";
  if (param == Dtype::kFloat &&
      (state != Dtype::kFloat || write_back != WriteBack::kRoundNearest)) {
    return "float32 parameters keep float32 state and take their update as it is";
  }
  if (write_back == WriteBack::kStochastic && param != Dtype::kBFloat16) {
    return "stochastic rounding writes bfloat16 parameters only";
  }
  return nullptr;
}

namespace engine {
namespace {

/// Calls fn(std::integral_constant<WriteBack, w>{}) for `w`.
template <typename Fn>
inline void with_write_back(WriteBack w, const Fn& fn) {
  switch (w) {
    case WriteBack::kRoundNearest:
      return fn(std::integral_constant<WriteBack, WriteBack::kRoundNearest>{});
    case WriteBack::kMasterWeights:
      return fn(std::integral_constant<WriteBack, WriteBack::kMasterWeights>{});
    case WriteBack::kKahan:
      return fn(std::integral_constant<WriteBack, WriteBack::kKahan>{});
    case WriteBack::kStochastic:
      return fn(std::integral_constant<WriteBack, WriteBack::kStochastic>{});
  }
}

/// Calls fn(P{}, S{}, write-back constant, variant constant) for `kind`'s instantiation of
/// `Rule` and returns true; returns false, calling nothing, for a kind outside the legal matrix.
/// Only the legal combinations are instantiated.
template <typename Rule, typename Fn>
inline bool with_instance(const StepKind& kind, const Fn& fn) {
  bool ran = false;
  kernels::with_float_type(kind.param_dtype, [&](auto p) {
    kernels::with_float_type(kind.state_dtype, [&](auto s) {
      with_write_back(kind.write_back, [&](auto w) {
        using P = decltype(p);
        using S = decltype(s);
        if constexpr (unsupported_step(P::kDtype, S::kDtype, decltype(w)::value) == nullptr) {
          ran = true;
          if constexpr (Rule::kHasVariant) {
            if (kind.variant) return fn(p, s, w, std::true_type{});
          }
          fn(p, s, w, std::false_type{});
        }
      });
    });
  });
  return ran;
}

}  // namespace
}  // namespace engine
}  // namespace amp::optim::detail
