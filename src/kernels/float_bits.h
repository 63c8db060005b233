// A float32's bits as a uint32 and back, for element code that nvcc and the host compiler both
// read (the optimizer rules' rounding, the float8 casts' conversion and amax keys).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace amp::kernels {
// Internal linkage, as the element code that includes it: a CPU loop built once per instruction
// set must not share an out-of-line copy with another build (src/kernels/dtype.h,
// src/optim/engine/element.h).
namespace {

AMP_HOST_DEVICE_INLINE uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

AMP_HOST_DEVICE_INLINE float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

}  // namespace
}  // namespace amp::kernels
