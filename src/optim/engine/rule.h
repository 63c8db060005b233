// What an optimizer's update rule provides to amp's step engine (engine/step.h): the engine runs
// it over every element of every parameter, on the CPU (a loop per instruction set) and on CUDA
// (one multi-tensor launch), with the same bits, for every instantiation engine/instances.h
// allows.
//
// A rule is a struct in namespace amp::optim::detail::engine (in the anonymous namespace, like
// element.h) with:
//   using Hyper = ...;    plain data, the optimizer's hyper-parameters for one group (it travels
//                         to CUDA kernels by value); defined outside the anonymous namespace
//   using Scalars = ...;  the float32 constants of one parameter's step, the same way; its first
//                         member is `float scale` (the gradients' loss scale)
//   static constexpr const char* kName;          for errors
//   enum StateSlot : int { ... };                its state tensors' names, as ATen names them
//                                                (Adam: kExpAvg, kExpAvgSq, kMaxExpAvgSq), at
//                                                most kMaxStateSlots; Pointers::state[slot] and
//                                                StepSlot::state[slot] hold them
//   static constexpr bool kHasVariant;           whether the rule has a second instantiation,
//   static bool variant(const Hyper&);           chosen by variant() (Adam: amsgrad, the third
//                                                state slot; SGD: momentum, its only slot)
//   static constexpr bool kCountsSteps;          whether the step count feeds the arithmetic
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
