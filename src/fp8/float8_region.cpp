// The float8 region: per-thread flags (enabled, what to do with weight casts) that
// Float8AutocastGuard sets and restores, which Float8Linear reads at forward time, and which a
// checkpoint's recomputation re-enters as its forward saw them.
#include <memory>

#include <amp/fp8.h>

#include "checkpoint/recompute_context.h"

namespace amp::fp8 {
namespace {

thread_local bool float8_enabled = false;
thread_local WeightCasts weight_casts_mode = WeightCasts::fresh;

// A checkpointed float8 forward recomputes in float8 with the same weight casts.
[[maybe_unused]] const bool registered_with_checkpoint = amp::detail::register_recomputed_state([] {
  return amp::detail::ReenterState([enabled = float8_enabled, casts = weight_casts_mode] {
    return std::shared_ptr<void>(std::make_shared<Float8AutocastGuard>(enabled, casts));
  });
});

}  // namespace

Float8AutocastGuard::Float8AutocastGuard(bool enabled, WeightCasts weight_casts)
    : previous_(float8_enabled), previous_weight_casts_(weight_casts_mode) {
  float8_enabled = enabled;
  weight_casts_mode = weight_casts;
}

Float8AutocastGuard::~Float8AutocastGuard() {
  float8_enabled = previous_;
  weight_casts_mode = previous_weight_casts_;
}

bool is_float8_enabled() { return float8_enabled; }

WeightCasts current_weight_casts() { return weight_casts_mode; }

}  // namespace amp::fp8
