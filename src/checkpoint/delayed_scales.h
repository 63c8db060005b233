// What amp::checkpoint tells a float8 delayed-scaling cast (src/fp8/scaling.cpp): inside a
// checkpointed forward each cast's scale is recorded, and in the recomputation the same casts
// take those scales back, in order, without touching the amax histories, so that a recomputed
// float8 tensor is bit for bit the forward's and the histories advance once per forward (as
// Transformer Engine's fp8 activation recompute does).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace amp::detail {

/// In a recomputation: the scale the forward's cast at this position used (throws c10::Error
/// when the recomputation casts more than the forward did). nullopt elsewhere.
std::optional<at::Tensor> replayed_delayed_scale();

/// In a checkpointed forward (not a recomputation): records the scale of the cast about to run.
/// Does nothing elsewhere.
void record_delayed_scale(const at::Tensor& scale);

}  // namespace amp::detail
