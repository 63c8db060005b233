// The element types amp's list kernels handle, shared by the CPU and CUDA kernels (no ATen here:
// CUDA sources include it too).
#pragma once

#include <cstdint>

namespace amp::detail {

/// Element types of the list kernels (float16/bfloat16 computed in float32, float64 in float64).
enum class ElemType : uint8_t { kFloat, kHalf, kBFloat16, kDouble };

}  // namespace amp::detail
