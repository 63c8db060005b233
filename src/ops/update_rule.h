// The scale update rules on plain scalars, shared by the CPU kernels and the CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define AMP_HOST_DEVICE __host__ __device__
#else
#define AMP_HOST_DEVICE
#endif

namespace amp::detail {

/// Scalars of the extended update, as plain values a kernel can take by value.
struct ExtendedRule {
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int32_t hysteresis;
  bool consecutive_hysteresis;
  double min_scale;
  double max_scale;
};

/// torch.amp's update: *scale and *tracker in place from found_inf (NaN counts as found, as a
/// C++ truth test of a float does in ATen). Products are formed in double and rounded once.
inline AMP_HOST_DEVICE void apply_update_rule(float* scale, int32_t* tracker, float found_inf,
                                              double growth_factor, double backoff_factor,
                                              int64_t growth_interval) {
  if (found_inf != 0.0f) {
    *scale = static_cast<float>(*scale * backoff_factor);
    *tracker = 0;
    return;
  }
  const int32_t successful = *tracker + 1;
  if (successful == growth_interval) {
    const float candidate = static_cast<float>(*scale * growth_factor);
    // Never grow to inf: a scale that can no longer grow stays where it is.
    if (std::isfinite(candidate)) *scale = candidate;
    *tracker = 0;
  } else {
    *tracker = successful;
  }
}

/// NaN-propagating max/min with a float bound, as ATen's clamp_min/clamp_max on float tensors.
inline AMP_HOST_DEVICE float clamp_below(float value, float bound) {
  return std::isnan(value) ? value : (value < bound ? bound : value);
}
inline AMP_HOST_DEVICE float clamp_above(float value, float bound) {
  return std::isnan(value) ? value : (value > bound ? bound : value);
}

/// The extended update (hysteresis, min/max, counters); with hysteresis 1 and no bounds it equals
/// apply_update_rule. counters may be null, else [taken, skipped, consecutive skips].
inline AMP_HOST_DEVICE void apply_extended_rule(float* scale, int32_t* tracker, int32_t* remaining,
                                                int64_t* counters, float found_inf,
                                                const ExtendedRule& rule) {
  const bool found = found_inf != 0.0f;
  int32_t left = found ? *remaining - 1 : *remaining;
  if (left < 0) left = 0;
  // Only an exhausted allowance backs off; an overflow within it just spends one unit.
  const bool back_off = found && left <= 0;
  const int32_t successful = *tracker + 1;
  const bool grow = !found && successful == rule.growth_interval;

  float next = *scale;
  if (back_off) {
    next = static_cast<float>(*scale * rule.backoff_factor);
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
  const bool refill = rule.consecutive_hysteresis ? !found : grow;
  *remaining = refill ? rule.hysteresis : left;
  if (counters != nullptr) {
    const int64_t skipped = found ? 1 : 0;
    counters[0] += 1 - skipped;
    counters[1] += skipped;
    counters[2] = (counters[2] + 1) * skipped;
  }
}

}  // namespace amp::detail
