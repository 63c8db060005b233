// What an optimizer's update rule provides to amp's step engine (engine/step.h): the engine runs
// it over every element of every parameter, on the CPU (a loop per instruction set) and on CUDA
// (one multi-tensor launch), with the same bits, for every instantiation engine/instances.h
// allows.
//
// A rule is a struct in namespace amp::optim::detail::engine (in the anonymous namespace, like
// element.h) deriving from RuleOf<Hyper, Scalars> (below), which names its two types:
//   Hyper                 plain data, the optimizer's hyper-parameters for one group (it travels
//                         to CUDA kernels by value); defined outside the anonymous namespace
//   Scalars               the float32 constants of one parameter's step, the same way; it derives
//                         from GradScalars (below), so its first member is `float scale` (the
//                         gradients' loss scale), then maximize's sign
//   static constexpr const char* kName;          for errors
//   enum StateSlot : int { ... };                its state tensors' names, as ATen names them
//                                                (Adam: kExpAvg, kExpAvgSq, kMaxExpAvgSq), at
//                                                most kMaxStateSlots; Pointers::state[slot] and
//                                                StepSlot::state[slot] hold them
// and, where RuleOf's defaults (false) do not fit:
//   static constexpr bool kHasVariant;           whether the rule has a second instantiation,
//   static bool variant(const Hyper&);           chosen by variant() (Adam: amsgrad, the third
//                                                state slot; SGD: momentum, its only slot)
//   static constexpr bool kCountsSteps;          whether the step count feeds the arithmetic
// and always:
//   static AMP_HOST_DEVICE_INLINE Scalars scalars(const Hyper&, float count, bool first,
//                                                 float scale);
//       count: the step count after this step's increment; first: the state is new (SGD's
//       momentum copies the gradient); scale: the gradients' loss scale (1 when unscaled)
//   template <typename P, typename S, WriteBack W, bool kVariant>
//   static AMP_HOST_DEVICE_INLINE void element(const Pointers<P, S>& p, const Scalars& c,
//                                              uint64_t key, int64_t i, int64_t index);
//       one element: read the gradient (unscaled_grad), the weight (read_weight) and the state
//       (p.state[slot], stored as S), store the state, and hand the update to apply_update<P, W>
// A rule listed in rules/all.h (one line) gets the library's per-instruction-set CPU loops and
// its CUDA kernel; any rule, listed or not, runs on the CPU through engine/cpu/rule_step_here.h.
#pragma once

#include "optim/engine/element.h"

namespace amp::optim::detail {

/// How a rule reads its gradients: divided by the loss scale (1 when unscaled), then signed
/// (-1 under maximize). A rule's Scalars derive from it, so `scale` comes first.
struct GradScalars {
  float scale, sign;
};

/// Two moment coefficients and their complements, each rounded once from Python's double.
struct Betas {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
};

namespace engine {
namespace {

/// A rule's base: its Hyper and Scalars types, and the defaults of its traits (no variant; the
/// step count unused), which a rule overrides by declaring its own.
template <typename HyperT, typename ScalarsT>
struct RuleOf {
  using Hyper = HyperT;
  using Scalars = ScalarsT;
  static constexpr bool kHasVariant = false;
  static constexpr bool kCountsSteps = false;
  static bool variant(const Hyper&) { return false; }
};

AMP_HOST_DEVICE_INLINE void set_grad_scalars(GradScalars& c, float scale, bool maximize) {
  c.scale = scale;
  c.sign = maximize ? -1.0f : 1.0f;
}

AMP_HOST_DEVICE_INLINE Betas betas(double beta1, double beta2) {
  return Betas{static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
               static_cast<float>(beta2), static_cast<float>(1.0 - beta2)};
}

/// The gradient of element i, unscaled and signed as the rule's GradScalars say.
template <typename P, typename Ptr>
AMP_HOST_DEVICE_INLINE float unscaled_grad(const Ptr& p, int64_t i, const GradScalars& c) {
  return unscaled_grad<P>(p, i, c.scale, c.sign);
}

/// The gradient with L2 weight decay folded in where `l2` is set (PyTorch's
/// grad.add(param, alpha=weight_decay)). A select, not a branch: the CPU loop stays one straight
/// line for the vectoriser.
AMP_HOST_DEVICE_INLINE float with_l2(float g, float w, bool l2, float weight_decay) {
  return l2 ? g + w * weight_decay : g;
}

}  // namespace
}  // namespace engine
}  // namespace amp::optim::detail
