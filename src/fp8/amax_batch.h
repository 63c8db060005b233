// Delayed-scaling amaxes reduced across ranks in batches: a cast whose reduction is batched leaves
// its amax in history[0] and waits; a flush all-reduces every waiting amax of a process group in
// one collective and then updates each history and scale by the per-cast rule, so the results are
// the bits of one collective per cast with a fraction of the collectives.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <amp/export.h>
#include <amp/fp8.h>

namespace amp::fp8::detail {

struct DelayedState;

/// Reduces a 1-d float32 tensor of amaxes in place: the elementwise maximum across the ranks.
using AmaxesReduction = std::function<void(const at::Tensor& amaxes)>;

/// An AmaxReduction whose casts are batched. `ranks` identifies the ranks it reduces over (a
/// process group): the amaxes of all layers with the same `ranks` go into one call of `reduce`.
/// Called directly with one amax, it reduces that one. amp::distributed::amax_all_reduce
/// returns one.
AMP_EXPORT AmaxReduction batched_amax_reduction(const void* ranks, AmaxesReduction reduce);

/// Called before a delayed cast reads its scale: flushes when this state's previous amax still
/// waits, so that every cast sees the scale its predecessors left (as with an immediate update).
void flush_if_waiting(const DelayedState& state);

/// When `options` has a batched reduction: enters `amax` (local, 0-dim float32) into history[0]
/// to wait for the next flush and returns true. Otherwise returns false and does nothing.
bool defer_delayed_amax(DelayedState& state, const at::Tensor& amax, c10::ScalarType fp8_dtype,
                        const DelayedScalingOptions& options);

/// Called in a float8 layer's backward: when amaxes are waiting, makes sure a flush runs when the
/// current backward pass ends (one autograd final callback per pass).
void flush_delayed_amaxes_when_backward_ends();

/// How many batched reductions the flushes have issued in this process (for tests and
/// benchmarks: the collectives that per-cast reductions would have multiplied).
AMP_EXPORT int64_t batched_amax_reductions_issued();

}  // namespace amp::fp8::detail
