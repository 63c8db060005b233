// amp's fused gradient operations (unscale, scale update, unscale + norm for clipping), also
// registered with the PyTorch dispatcher as torch.ops.amp.*.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <amp/export.h>

namespace amp {

/// Checks a list of gradients for non-finite values and unscales them in place, in one read and
/// one write per element. Bit-identical to ATen's _amp_foreach_non_finite_check_and_unscale_ on
/// finite values: float16/bfloat16/float32 are multiplied in float32, float64 in float64.
/// Args: grads: strided floating tensors (any mix of float32, float16, bfloat16, float64) on one
///         device; empty lists and empty tensors are fine.
///       found_inf: 1-element float32 tensor on the grads' device; set to 1.0 (a plain store) when
///         any element is NaN or +-inf, never reset (zero it first).
///       inv_scale: 1-element float32 tensor on the grads' device; when it holds 1.0 the values
///         are left untouched (only checked). Values are unscaled even when an inf is found.
///       per_tensor_found_inf: opt-in overflow attribution: a float32 tensor of grads.size()
///         elements on the grads' device; element i is set to 1.0 when grads[i] held a non-finite
///         value (never reset).
/// Errors: c10::Error naming the offending argument (device, dtype, element count, layout).
AMP_EXPORT void non_finite_check_and_unscale_(
    at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
    const std::optional<at::Tensor>& per_tensor_found_inf = std::nullopt);

/// torch.amp's scale update on the scale's device (no host sync), bit-identical to ATen's
/// _amp_update_scale_: back off by backoff_factor when found_inf != 0, else count a clean step and
/// multiply by growth_factor (only to a finite value) every growth_interval clean steps.
/// Args: scale: 1-element float32; growth_tracker: 1-element int32; found_inf: 1-element float32;
///       all on one device. Products are formed in double and rounded to float32.
/// Errors: c10::Error naming the argument with a wrong dtype, element count or device.
AMP_EXPORT void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker,
                              const at::Tensor& found_inf, double growth_factor,
                              double backoff_factor, int64_t growth_interval);

/// Parameters of the extended scale update (GradScalerOptions' extensions).
struct ScaleUpdateOptions {
  /// Factor applied every growth_interval clean steps.
  double growth_factor = 2.0;
  /// Factor applied when backing off.
  double backoff_factor = 0.5;
  /// Clean steps between growths.
  int64_t growth_interval = 2000;
  /// Overflowing steps tolerated before backing off; the allowance refills to this value.
  int64_t hysteresis = 1;
  /// Refill the allowance after every clean step instead of after each growth.
  bool consecutive_hysteresis = false;
  /// Floor applied to a backed-off scale; 0 means none.
  double min_scale = 0.0;
  /// Cap applied to a grown scale; infinity means none.
  double max_scale = std::numeric_limits<double>::infinity();
};

/// The scale update with hysteresis, min/max bounds and step counters, on the device (no sync).
/// With hysteresis 1 and no bounds it equals update_scale_ bit for bit.
/// Args: scale (1-element float32), growth_tracker and hysteresis_remaining (1-element int32),
///       counters (undefined, or 3-element int64 [steps taken, steps skipped, consecutive skips]
///       advanced by this iteration), found_inf (1-element float32); all on one device.
/// Errors: c10::Error naming the argument with a wrong dtype, element count or device, or an
///         option out of range (growth_interval or hysteresis < 1).
AMP_EXPORT void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                                       at::Tensor& hysteresis_remaining, at::Tensor& counters,
                                       const at::Tensor& found_inf,
                                       const ScaleUpdateOptions& options);

/// Reads a list of (scaled) gradients once and returns the L2 norm of the unscaled gradients
/// (grad * inv_scale) without writing them, and sets found_inf as non_finite_check_and_unscale_
/// does. Squares are accumulated in float64, so finite gradients whose float32 sum of squares
/// would overflow still give a finite norm.
/// Args: grads, found_inf, inv_scale: as in non_finite_check_and_unscale_.
///       per_tensor: also return each tensor's norm.
/// Returns: (total_norm: 0-dim float32 on the grads' device, per_tensor_norms: float32 tensor of
///          grads.size() elements, or an empty tensor when per_tensor is false).
/// Errors: as non_finite_check_and_unscale_.
AMP_EXPORT std::tuple<at::Tensor, at::Tensor> unscale_norm(at::TensorList grads,
                                                           at::Tensor& found_inf,
                                                           const at::Tensor& inv_scale,
                                                           bool per_tensor = false);

/// Writes each gradient once: grad * (inv_scale * clip_coef) with clip_coef =
/// min(max_norm / (total_norm + eps), 1) computed in float32 on the device (no sync), the clip
/// torch::nn::utils::clip_grad_norm_ applies. Use after unscale_norm; together they read the
/// gradients twice and write them once.
/// Args: grads: as in non_finite_check_and_unscale_; inv_scale: 1-element float32;
///       total_norm: 1-element float32 (unscale_norm's first result); max_norm > 0; eps >= 0.
/// Errors: c10::Error naming the argument that is invalid.
AMP_EXPORT void clip_unscaled_(at::TensorList grads, const at::Tensor& inv_scale,
                               const at::Tensor& total_norm, double max_norm, double eps = 1e-6);

/// Unscale + clip in one call: unscale_norm followed by clip_unscaled_.
/// Returns: the total norm of the unscaled gradients (0-dim float32, before clipping).
AMP_EXPORT at::Tensor unscale_and_clip_(at::TensorList grads, at::Tensor& found_inf,
                                        const at::Tensor& inv_scale, double max_norm,
                                        double eps = 1e-6);

}  // namespace amp
