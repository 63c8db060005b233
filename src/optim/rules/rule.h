// What an optimizer's update rule provides to amp's step engine (src/optim/step.h): the engine
// runs it over every element of every parameter, on the CPU (a loop per instruction set) and on
// CUDA (one multi-tensor launch), with the same bits, for every storage dtype and write-back.
//
// A rule is a struct in namespace amp::optim::detail::lp (in the anonymous namespace, like
// element.h) with:
//   using Hyper = ...;    plain data, the optimizer's hyper-parameters for one group (it travels
//                         to CUDA kernels by value); defined outside the anonymous namespace
//   using Scalars = ...;  the float32 constants of one parameter's step, the same way
//   static constexpr const char* kName;          for errors
//   static constexpr bool kHasFlag;              whether flag() selects an instantiation
//   static bool flag(const Hyper&);              (Adam: amsgrad; SGD: momentum)
//   static constexpr bool kCountsSteps;          whether the step count feeds the arithmetic
//   static AMP_HOST_DEVICE_INLINE Scalars scalars(const Hyper&, float count, bool first,
//                                                 float scale);
//       count: the step count after this step's increment; first: the state is new (SGD's
//       momentum copies the gradient); scale: the gradients' loss scale (1 when unscaled)
//   template <typename P, typename S, WriteBack W, bool kFlag>
//   static AMP_HOST_DEVICE_INLINE void element(const Pointers<P, S>& p, const Scalars& c,
//                                              uint64_t key, int64_t i, int64_t index);
//       one element: read the gradient (unscaled_grad), the weight (read_weight) and the state
//       (state0..2 in S), store the state, and hand the update to apply_update<P, W>
// and is listed once in rules/all.h.
#pragma once

#include "optim/element.h"
