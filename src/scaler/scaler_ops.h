// The scaler's single seam to gradient and scale kernels: check-and-unscale, norm and clip over a
// list, and the scale update. GradScaler calls nothing else to touch gradients or the scale.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <amp/ops.h>

namespace amp::detail {

/// Multiplies every tensor of `grads` by `inv_scale` in place and sets `found_inf` to 1.0 when any
/// element is inf or NaN (never resets it: the caller zeroes it).
/// Args: grads: dense floating tensors on one device, dtypes may be mixed;
///       found_inf, inv_scale: 1-element float32 tensors on the grads' device.
void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale);

/// Reads `grads` once: sets `found_inf` as above and returns the L2 norm of grads * inv_scale
/// (0-dim float32 on the grads' device) without writing the gradients.
at::Tensor unscale_norm_(at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// Writes each gradient once as grad * inv_scale * min(max_norm / (total_norm + eps), 1).
void clip_unscaled_(at::TensorList grads, const at::Tensor& inv_scale, const at::Tensor& total_norm,
                    double max_norm, double eps);

/// torch.amp's update rule on the device (no sync): back off when found_inf != 0, else count a
/// clean step and grow (to a finite value only) every growth_interval clean steps.
/// Args: scale (0-dim float32), growth_tracker (0-dim int32), found_inf (0-dim float32), all on
///       one device; the factors and interval as in GradScalerOptions.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

/// The update rule with hysteresis and min/max bounds on the scale's device (no sync). With
/// hysteresis 1 and no bounds it gives the same values as update_scale_.
/// Args: as update_scale_, plus hysteresis_remaining (0-dim int32) and, when defined, counters
///       (int64 [steps taken, steps skipped, consecutive skips]) advanced by this iteration.
void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                            at::Tensor& hysteresis_remaining, at::Tensor& counters,
                            const at::Tensor& found_inf, const ScaleUpdateOptions& options);

/// Advances the counters (int64 [taken, skipped, consecutive]) from found_inf without a sync.
void advance_counters_(at::Tensor& counters, const at::Tensor& found_inf);

}  // namespace amp::detail
