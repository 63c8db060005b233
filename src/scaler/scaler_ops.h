// The scaler's single seam to gradient and scale kernels: check-and-unscale over a list, update.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace amp::detail {

/// Multiplies every tensor of `grads` by `inv_scale` in place and sets `found_inf` to 1.0 when any
/// element is inf or NaN (never resets it: the caller zeroes it).
/// Args: grads: dense floating tensors, one device and (for the fast path) one dtype;
///       found_inf, inv_scale: 1-element float32 tensors on the grads' device.
/// Today this is ATen's _amp_foreach_non_finite_check_and_unscale_; amp's fused kernels replace
/// it here without GradScaler changing.
void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale);

/// torch.amp's update rule on the device (no sync): back off when found_inf != 0, else count a
/// clean step and grow (to a finite value only) every growth_interval clean steps.
/// Args: scale (0-dim float32), growth_tracker (0-dim int32), found_inf (0-dim float32), all on
///       one device; the factors and interval as in GradScalerOptions.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

/// Parameters of the extended update (GradScalerOptions' extensions).
struct ExtendedUpdate {
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int64_t hysteresis;           // allowance refilled to this value
  bool consecutive_hysteresis;  // refill after every clean step
  double min_scale;
  double max_scale;
};

/// The update rule with hysteresis and min/max bounds, in tensor ops on the scale's device (no
/// sync). With hysteresis 1 and no bounds it gives the same values as update_scale_.
/// Args: as update_scale_, plus hysteresis_remaining (0-dim int32) and, when defined, counters
///       (int64 [steps taken, steps skipped, consecutive skips]) advanced by this iteration.
void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                            at::Tensor& hysteresis_remaining, at::Tensor& counters,
                            const at::Tensor& found_inf, const ExtendedUpdate& params);

/// Advances the counters (int64 [taken, skipped, consecutive]) from found_inf without a sync.
void advance_counters_(at::Tensor& counters, const at::Tensor& found_inf);

}  // namespace amp::detail
