// One operand's delayed-scaling state and the rule that moves its amax history and scale
// (Transformer Engine's update, on device tensors). The bottom of fp8's delayed scaling: the
// casts (scaling.cpp) and the batched amax reductions (amax_batch.cpp) both apply this rule, and
// it calls neither.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <amp/fp8.h>

namespace amp::fp8::detail {

/// One operand's delayed-scaling state: float32 history [len] and scale [], updated in place.
struct DelayedState {
  at::Tensor amax_history;
  at::Tensor scale;
};

/// The largest finite value of a float8 dtype (448 for e4m3fn, 57344 for e5m2); any other dtype
/// is refused with a sentence.
double fp8_max(c10::ScalarType fp8_dtype);

/// The history-and-scale update of a delayed cast whose (reduced) amax is already in history[0].
void update_delayed_scale(DelayedState& state, c10::ScalarType fp8_dtype,
                          const DelayedScalingOptions& options);

}  // namespace amp::fp8::detail
