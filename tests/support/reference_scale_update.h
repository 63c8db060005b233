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

}  // namespace amp_test
