// A reference for amp's extended scale update, written with plain tensor ops (no fused kernel):
// the fused op and GradScaler are compared with it, on the CPU and on CUDA alike.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <amp/ops.h>

#include <cstdint>
#include <limits>
#include <optional>

namespace amp_test {

/// All arguments of the scale update in one place (the factors and interval, and the extensions).
struct UpdateOptions {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;
  bool consecutive_hysteresis = false;
  double min_scale = 0.0;
  double max_scale = std::numeric_limits<double>::infinity();
};

/// The extended update rule (hysteresis, min/max bounds, counters) in ATen tensor ops, with the
/// same results as amp::update_scale_ given a hysteresis_remaining tensor and counters.
void reference_update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                                      at::Tensor& hysteresis_remaining, at::Tensor& counters,
                                      const at::Tensor& found_inf, const UpdateOptions& options);

/// amp::update_scale_ with every extension argument given (counters may be undefined).
inline void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                                   at::Tensor& hysteresis_remaining, at::Tensor& counters,
                                   const at::Tensor& found_inf, const UpdateOptions& o) {
  amp::update_scale_(
      scale, growth_tracker, found_inf, o.growth_factor, o.backoff_factor, o.growth_interval,
      hysteresis_remaining, counters.defined() ? std::optional<at::Tensor>(counters) : std::nullopt,
      amp::ScaleUpdateExtensions{o.hysteresis, o.consecutive_hysteresis, o.min_scale, o.max_scale});
}

/// From GradScaler's 0-dim state on `device` (scale 64, tracker 0, a full hysteresis allowance,
/// three zero counters), runs `steps` updates through update_scale_extended_ and through the
/// reference with found_inf drawn at random (probability 0.4, from the CPU generator), and
/// REQUIREs the same scale bits, tracker, allowance and counters after every step.
void require_random_updates_match_reference(const UpdateOptions& o, int steps, c10::Device device);

/// One plain update (no extensions) of 0-dim `scale`/`tracker` by the backend under test.
using PlainUpdate = void (*)(at::Tensor& scale, at::Tensor& tracker, const at::Tensor& found_inf,
                             int64_t growth_interval);

/// Checks `update` on `device` against ATen's _amp_update_scale_ (on the CPU) at the top of the
/// int32 tracker: equal up to 2^31-1; a clean step there keeps 2^31-1 (ATen wraps to -2^31) and
/// the scale ATen computes (no growth); an overflow resets both; an interval of 2^31-1 still
/// grows; a tracker above the interval stalls growth as in ATen.
void require_tracker_saturates(PlainUpdate update, c10::Device device);

/// Checks amp::update_scale_'s counters on `device` at 2^63-1: a clean step keeps steps_taken
/// there and zeroes the consecutive skips; an overflow keeps steps_skipped and the consecutive
/// skips there.
void require_counters_saturate(c10::Device device);

}  // namespace amp_test
