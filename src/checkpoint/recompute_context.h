// What amp::checkpoint offers the layers above it without knowing them (float8 casts, src/fp8):
// thread-local state that a checkpointed forward captures and its recomputation re-enters, and
// values that the forward records and the recomputation takes back in the same order. The layers
// above call in; amp::checkpoint includes none of their headers.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>

namespace amp::detail {

/// Re-enters captured state for a recomputation; the returned guard leaves it when destroyed.
using ReenterState = std::function<std::shared_ptr<void>()>;
/// Called at every checkpointed forward: captures the state and returns how to re-enter it.
using CaptureState = std::function<ReenterState()>;

/// Registers one kind of state (float8 autocast: src/fp8/float8_region.cpp, at load time).
/// Returns true, so that a static initializer can call it.
bool register_recomputed_state(CaptureState capture);

/// In a recomputation: the value the forward recorded at this position (throws c10::Error naming
/// `what`, e.g. "casts to float8 with delayed scaling", when the recomputation asks for more
/// values than the forward recorded). nullopt outside a recomputation.
std::optional<at::Tensor> replayed_in_recomputation(const char* what);

/// In a checkpointed forward (not a recomputation): records `value` for the recomputation to take
/// back. Does nothing elsewhere.
void record_for_recomputation(const at::Tensor& value);

}  // namespace amp::detail
