// Input checks of amp's ops, shared by every device's kernels: sentences that name the argument
// and the fix.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include "ops/update_rule.h"

namespace amp::detail {

/// The checks of non_finite_check_and_unscale_ and unscale_norm: found_inf and inv_scale are
/// 1-element float32 tensors on one device, every grad a strided float32/float16/bfloat16/float64
/// tensor on that device, and per_tensor (when given) a contiguous float32 tensor of one element
/// per grad there.
void check_unscale_args(const char* op, at::TensorList grads, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale, const std::optional<at::Tensor>& per_tensor);

/// update_scale_'s tensors: the scale state it updates in place and the flag it reads.
struct UpdateState {
  const at::Tensor& scale;
  const at::Tensor& growth_tracker;
  const at::Tensor& found_inf;
  const std::optional<at::Tensor>& hysteresis_remaining;
  const std::optional<at::Tensor>& counters;
};

/// The checks of update_scale_ (its tensors and its scalars); returns the rule its kernels apply.
UpdateRule check_update_args(const UpdateState& state, double growth_factor, double backoff_factor,
                             int64_t growth_interval, int64_t hysteresis,
                             bool consecutive_hysteresis, double min_scale,
                             std::optional<double> max_scale);

/// The checks of clip_unscaled_.
void check_clip_args(at::TensorList grads, const at::Tensor& inv_scale,
                     const at::Tensor& total_norm, double max_norm, double eps);

}  // namespace amp::detail
