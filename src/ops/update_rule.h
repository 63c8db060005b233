// The scale update rule on plain scalars: the one definition the CPU and CUDA kernels apply.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/kernel_common.h"

namespace amp::detail {

/// The update's scalar arguments, as plain values a kernel can take by value.
struct UpdateRule {
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  /// Overflowing steps tolerated before a back-off (1: torch.amp's rule).
  int32_t hysteresis;
  bool consecutive_hysteresis;
  /// Floor of a backed-off scale; 0 means none.
  double min_scale;
  /// Cap of a grown scale; infinity means none.
  double max_scale;
};

/// The smallest scale an update backs off to: float32's smallest normal value, 2^-126.
constexpr float kSmallestScale = 1.17549435082228750797e-38f;

/// The largest growth tracker (int32) and counter (int64); both saturate there.
constexpr int32_t kLargestTracker = 2147483647;
constexpr int64_t kLargestCount = 9223372036854775807LL;

inline AMP_HOST_DEVICE int64_t saturating_increment(int64_t count) {
  return count == kLargestCount ? count : count + 1;
}

/// NaN-propagating max/min with a float bound, as ATen's clamp_min/clamp_max on float tensors.
inline AMP_HOST_DEVICE float clamp_below(float value, float bound) {
  return std::isnan(value) ? value : (value < bound ? bound : value);
}
inline AMP_HOST_DEVICE float clamp_above(float value, float bound) {
  return std::isnan(value) ? value : (value > bound ? bound : value);
}

/// Updates *scale and *tracker in place from found_inf (NaN counts as found, as a C++ truth test
/// of a float does in ATen); products are formed in double and rounded once to float32.
/// With hysteresis 1 and no bounds this is torch.amp's rule (ATen's _amp_update_scale_), except
/// that a back-off stops at kSmallestScale where ATen's goes on to denormals and 0: back off
/// on an overflow, else count a clean step and grow, only to a finite value, every
/// growth_interval clean steps; and that the tracker and counters saturate instead of wrapping.
/// `remaining` (the hysteresis allowance) may be null when rule.hysteresis is 1; `counters` may
/// be null, else [steps taken, steps skipped, consecutive skips], advanced here so that the
/// counting rule lives in one place.
inline AMP_HOST_DEVICE void apply_update_rule(float* scale, int32_t* tracker, int32_t* remaining,
                                              int64_t* counters, float found_inf,
                                              const UpdateRule& rule) {
  const bool found = found_inf != 0.0f;
  const int32_t allowance = remaining != nullptr ? *remaining : 1;
  int32_t left = found ? allowance - 1 : allowance;
  if (left < 0) left = 0;
  // Only an exhausted allowance backs off; an overflow within it just spends one unit.
  const bool back_off = found && left <= 0;
  // The tracker saturates at int32's maximum instead of wrapping to -2^31 as ATen's does: a
  // wrapped tracker would be saved into a checkpoint that no loader accepts. At the maximum no
  // growth happens, as with ATen's wrapped value, so the rule differs only in the value kept.
  const bool saturated = *tracker == kLargestTracker;
  const int32_t successful = saturated ? *tracker : *tracker + 1;
  const bool grow = !found && !saturated && successful == rule.growth_interval;

  float next = *scale;
  if (back_off) {
    next = static_cast<float>(*scale * rule.backoff_factor);
    // Never below float32's smallest normal value (2^-126): below it 1/scale overflows to inf
    // and unscaling turns zero gradients into NaN without flagging them, so a long run of
    // overflows (or a tiny backoff_factor) would write NaN into the parameters, as torch.amp does.
    next = clamp_below(next, kSmallestScale);
    if (rule.min_scale > 0) next = clamp_below(next, static_cast<float>(rule.min_scale));
  } else if (grow) {
    float candidate = static_cast<float>(*scale * rule.growth_factor);
    // The finiteness test comes before the cap, so an overflowing growth keeps the old scale.
    const bool finite = std::isfinite(candidate);
    if (rule.max_scale < INFINITY) {
      candidate = clamp_above(candidate, static_cast<float>(rule.max_scale));
    }
    if (finite) next = candidate;
  }
  *scale = next;
  *tracker = (found || grow) ? 0 : successful;
  if (remaining != nullptr) {
    const bool refill = rule.consecutive_hysteresis ? !found : grow;
    *remaining = refill ? rule.hysteresis : left;
  }
  if (counters != nullptr) {
    // Saturating, as the tracker: a counter loaded at 2^63-1 stays there instead of wrapping.
    if (found) {
      counters[1] = saturating_increment(counters[1]);
      counters[2] = saturating_increment(counters[2]);
    } else {
      counters[0] = saturating_increment(counters[0]);
      counters[2] = 0;
    }
  }
}

}  // namespace amp::detail
