// The vocabulary amp's CPU and CUDA kernels share: element types, what a list pass does, and the
// clip factor. No ATen here but for the dtype mapping, which nvcc never sees.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define AMP_HOST_DEVICE __host__ __device__
#else
#define AMP_HOST_DEVICE
#include <c10/core/ScalarType.h>
#endif

namespace amp::detail {

/// Element types of the list kernels (float16/bfloat16 computed in float32, float64 in float64).
enum class ElemType : uint8_t { kFloat, kHalf, kBFloat16, kDouble };

/// One non-empty tensor of a list as a flat dense array (memory order: the ops are elementwise).
struct FlatTensor {
  void* data;
  int64_t numel;
  ElemType type;
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

#if !defined(__CUDACC__)
/// The element type of a dtype the ops' argument checks accepted (float32, float16, bfloat16,
/// float64).
inline ElemType elem_type(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Half:
      return ElemType::kHalf;
    case c10::ScalarType::BFloat16:
      return ElemType::kBFloat16;
    case c10::ScalarType::Double:
      return ElemType::kDouble;
    default:
      return ElemType::kFloat;
  }
}
#endif

}  // namespace amp::detail
