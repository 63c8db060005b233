// Input checks shared by amp's ops on every device: sentences that name the argument and the fix.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <optional>

#include "ops/elem_type.h"
#include "ops/update_rule.h"

namespace amp::detail {

/// The list kernels' element type of a dtype that check_grads accepted.
ElemType elem_type(c10::ScalarType dtype);

/// Checks that `tensor` (called `name` in op `op`) is a defined 1-element tensor of `dtype` on
/// `device`.
void check_scalar_tensor(const char* op, const char* name, const at::Tensor& tensor,
                         c10::ScalarType dtype, c10::Device device);

/// Checks that every grad is a defined strided float32/float16/bfloat16/float64 tensor on
/// `device` (the device of the op's found_inf/inv_scale).
void check_grads(const char* op, at::TensorList grads, c10::Device device);

/// Checks the optional per-tensor flag output: float32, grads.size() elements, on `device`.
void check_per_tensor_output(const char* op, const char* name, const at::Tensor& out, int64_t count,
                             c10::Device device);

/// The checks of non_finite_check_and_unscale_ / unscale_norm (per_tensor may be null).
void check_unscale_args(const char* op, at::TensorList grads, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale, const at::Tensor* per_tensor);

/// The checks of update_scale_ and update_scale_extended_ (hysteresis_remaining and counters may
/// be null for the plain update).
void check_update_args(const char* op, const at::Tensor& scale, const at::Tensor& growth_tracker,
                       const at::Tensor& found_inf, int64_t growth_interval,
                       const at::Tensor* hysteresis_remaining, const at::Tensor* counters);

/// The checks of update_scale_extended_ (every device), and the rule its kernels apply.
ExtendedRule check_extended_update_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                                        const at::Tensor& hysteresis_remaining,
                                        const std::optional<at::Tensor>& counters,
                                        const at::Tensor& found_inf, double growth_factor,
                                        double backoff_factor, int64_t growth_interval,
                                        int64_t hysteresis, bool consecutive_hysteresis,
                                        double min_scale, double max_scale);

/// The checks of clip_unscaled_.
void check_clip_args(const char* op, at::TensorList grads, const at::Tensor& inv_scale,
                     const at::Tensor& total_norm, double max_norm, double eps);

}  // namespace amp::detail
