// What amp's CPU and CUDA list kernels share: a list's tensors as flat arrays of the kernels'
// dtypes (kernels/dtype.h), what a list pass does, and the clip factor. No ATen here: nvcc reads it
// too.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/host_device.h"

namespace amp::detail {

/// One non-empty tensor of a list as a flat dense array (memory order: the ops are elementwise).
struct FlatTensor {
  void* data;
  int64_t numel;
  /// float16/bfloat16 computed in float32, float64 in float64.
  kernels::Dtype type;
  /// Position in the caller's list (for attribution and per-tensor norms).
  int64_t index;
};

/// What one pass of a list kernel does to every element.
enum class ListMode : uint8_t {
  /// Non-finite check, then multiply by inv_scale and store; with inv_scale == 1 only the check
  /// runs and nothing is stored (as ATen's unscale does).
  kCheckScale,
  /// Non-finite check and the sum of squares of value * inv_scale; nothing is stored.
  kCheckNorm,
  /// Multiply by clip_factor(...) and store, without a check (the clip pass).
  kClip,
};

/// The factor the clip pass multiplies by: inv_scale * min(max_norm / (total_norm + eps), 1), in
/// float32 as torch::nn::utils::clip_grad_norm_ forms its coefficient from a float32 norm.
inline AMP_HOST_DEVICE float clip_factor(float inv_scale, float total_norm, float max_norm,
                                         float eps) {
  const float coef = max_norm / (total_norm + eps);
  return inv_scale * (coef < 1.0f ? coef : 1.0f);
}

}  // namespace amp::detail
