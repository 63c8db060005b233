// amp's fused gradient operations (non-finite check + unscale, scale update, unscale + norm and
// clip), also registered with the PyTorch dispatcher as torch.ops.amp.*. Opt-in: amp/amp.h does
// not include this header.
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
/// finite values: float16/bfloat16/float32 are multiplied in float32, float64 in float64. Values
/// are checked in their own precision on every device: a float64 1e300 is finite (ATen's CUDA
/// kernel, which checks in float32, flags it; its CPU kernel does not).
/// Stable: name, arguments and results are kept across minor versions.
/// Args: grads: strided floating tensors (any mix of float32, float16, bfloat16, float64) on one
///         device; empty lists and empty tensors are fine.
///       found_inf: 1-element float32 tensor on the grads' device; set to 1.0 (a plain store) when
///         any element is NaN or +-inf, never reset (zero it first).
///       inv_scale: 1-element float32 tensor on the grads' device; when it holds 1.0 the values
///         are left untouched (only checked). Values are unscaled even when an inf is found.
///       per_tensor_found_inf: opt-in overflow attribution: a float32 tensor of grads.size()
///         elements on the grads' device; element i is set to 1.0 when grads[i] held a non-finite
///         value (never reset).
/// Devices: amp's kernels on CPU and CUDA; on any other device the op runs ATen's
///   _amp_foreach_non_finite_check_and_unscale_ for that device (as Python's GradScaler does).
/// Errors: c10::Error naming the offending argument (device, dtype, element count, layout).
AMP_EXPORT void non_finite_check_and_unscale_(
    at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
    const std::optional<at::Tensor>& per_tensor_found_inf = std::nullopt);

/// The extensions of the scale update (GradScalerOptions' hysteresis and bounds); the defaults
/// give torch.amp's rule.
struct ScaleUpdateExtensions {
  /// Overflowing steps tolerated before backing off (>= 1); the allowance refills to this value.
  /// Above 1 the update needs a hysteresis_remaining tensor.
  int64_t hysteresis = 1;
  /// Refill the allowance after every clean step instead of after each growth.
  bool consecutive_hysteresis = false;
  /// Floor applied to a backed-off scale; 0 means none.
  double min_scale = 0.0;
  /// Cap applied to a grown scale; infinity means none.
  double max_scale = std::numeric_limits<double>::infinity();
};

/// The scale update on the scale's device (no host sync). With the default extensions it is
/// torch.amp's rule, bit-identical to ATen's _amp_update_scale_: back off by backoff_factor when
/// found_inf != 0, else count a clean step and multiply by growth_factor (only to a finite value)
/// every growth_interval clean steps. Products are formed in double and rounded to float32.
/// Stable without the optional arguments; the extensions may still change.
/// Args: scale: 1-element float32; growth_tracker: 1-element int32; found_inf: 1-element float32;
///       all on one device.
///       hysteresis_remaining: 1-element int32, the allowance carried between updates; required
///         when extensions.hysteresis > 1.
///       counters: 3-element int64 [steps taken, steps skipped, consecutive skips], advanced by
///         this update.
///       extensions: hysteresis and min/max bounds (see ScaleUpdateExtensions).
/// Devices: amp's kernels on CPU and CUDA; elsewhere ATen's _amp_update_scale_ (then only
///   without extensions and counters).
/// Errors: c10::Error naming the argument with a wrong dtype, element count or device, or an
///   option out of range.
AMP_EXPORT void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker,
                              const at::Tensor& found_inf, double growth_factor,
                              double backoff_factor, int64_t growth_interval,
                              const std::optional<at::Tensor>& hysteresis_remaining = std::nullopt,
                              const std::optional<at::Tensor>& counters = std::nullopt,
                              const ScaleUpdateExtensions& extensions = {});

/// Reads a list of (scaled) gradients once and returns the L2 norm of the unscaled gradients
/// (grad * inv_scale) without writing them, and sets found_inf as non_finite_check_and_unscale_
/// does. Squares are accumulated in float64 in a fixed order (the same bits on every run), so
/// finite gradients whose float32 sum of squares would overflow still give a finite norm.
/// Experimental: may change in a minor version.
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
/// torch::nn::utils::clip_grad_norm_ applies. After unscale_norm the two read the gradients twice
/// and write them once (GradScaler::unscale_and_clip_ is built on them).
/// Experimental: may change in a minor version.
/// Args: grads: as in non_finite_check_and_unscale_; inv_scale: 1-element float32;
///       total_norm: 1-element float32 (unscale_norm's first result); max_norm > 0; eps >= 0.
/// Errors: c10::Error naming the argument that is invalid.
AMP_EXPORT void clip_unscaled_(at::TensorList grads, const at::Tensor& inv_scale,
                               const at::Tensor& total_norm, double max_norm, double eps = 1e-6);

}  // namespace amp
