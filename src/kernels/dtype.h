// The one dtype vocabulary of amp's kernels (the list ops, the optimizer step engine, the float8
// casts), read by nvcc and the host compiler alike: the enum a launch carries, and the element
// types that load a stored value as float32 and round a float32 back, on bit patterns, so that
// the CPU loops and the CUDA kernels give the same bits. dtype_of.h maps ATen's ScalarType to it.
#pragma once

#include <cstdint>

#include "kernels/float_bits.h"
#include "kernels/host_device.h"

namespace amp::kernels {

/// The dtypes amp's kernels read and write. Each kernel family takes a subset (the step engine
/// and the float8 casts: the first three; the list ops: all four).
enum class Dtype : uint8_t { kFloat, kBFloat16, kHalf, kDouble };

// Internal linkage, as float_bits.h: the CPU loops are built once per instruction set, and an
// out-of-line copy of one of these built with AVX-512 must never serve the baseline build.
namespace {

/// `when ? yes : no` as bit masks: no branch for the vectoriser to give up on.
AMP_HOST_DEVICE_INLINE uint32_t select_bits(bool when, uint32_t yes, uint32_t no) {
  const uint32_t mask = 0u - static_cast<uint32_t>(when);
  return (yes & mask) | (no & ~mask);
}

// ---- stored element types: load as float32, round to the dtype (round to nearest even) ----
// Every branch below is a select on values, so the CPU loops stay vectorisable.

struct Bf16 {
  using Raw = uint16_t;
  static constexpr Dtype kDtype = Dtype::kBFloat16;
  static AMP_HOST_DEVICE_INLINE float load(Raw raw) {
    return bits_float(static_cast<uint32_t>(raw) << 16);
  }
  static AMP_HOST_DEVICE_INLINE Raw store(float value) {
    const uint32_t u = float_bits(value);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return value != value ? Raw{0x7FC0} : static_cast<Raw>(rounded);  // NaN as c10 writes it
  }
};

struct F16 {
  using Raw = uint16_t;
  static constexpr Dtype kDtype = Dtype::kHalf;
  static AMP_HOST_DEVICE_INLINE float load(Raw raw) {
    const uint32_t sign = static_cast<uint32_t>(raw & 0x8000u) << 16;
    const uint32_t exponent = (raw >> 10) & 0x1Fu;
    const uint32_t mantissa = raw & 0x3FFu;
    // Normal: rebias the exponent (15 -> 127); inf stays inf, NaN keeps its payload and is made
    // quiet (as c10 does); a subnormal is mantissa * 2^-24, exact in float32.
    const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
    const uint32_t special =
        0x7F800000u | (mantissa << 13) | select_bits(mantissa != 0, 0x400000u, 0u);
    const uint32_t subnormal =
        float_bits(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
    uint32_t magnitude = select_bits(exponent == 31, special, normal);
    magnitude = select_bits(exponent == 0, subnormal, magnitude);
    return bits_float(sign | magnitude);
  }
  static AMP_HOST_DEVICE_INLINE Raw store(float value) {
    const uint32_t u = float_bits(value);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7FFFFFFFu;
    // Normal range (|value| >= 2^-14): round the 13 dropped mantissa bits to nearest even, then
    // rebias; a carry out of the mantissa moves the exponent up, as it should.
    const uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    // Below 2^-14: adding 0.5 puts the float16 subnormal step (2^-24) at float32's last bit, so
    // the addition itself rounds to nearest even; the low bits are then the float16 pattern.
    const uint32_t subnormal = float_bits(bits_float(a) + 0.5f) - 0x3F000000u;
    // 65520 and above round to infinity; NaN becomes the quiet NaN c10 writes.
    uint32_t magnitude = select_bits(a < 0x38800000u, subnormal, normal);
    magnitude = select_bits(a >= 0x477FF000u, 0x7C00u, magnitude);
    magnitude = select_bits(a > 0x7F800000u, 0x7E00u, magnitude);
    return static_cast<Raw>(sign | magnitude);
  }
};

struct F32 {
  using Raw = float;
  static constexpr Dtype kDtype = Dtype::kFloat;
  static AMP_HOST_DEVICE_INLINE float load(Raw raw) { return raw; }
  static AMP_HOST_DEVICE_INLINE Raw store(float value) { return value; }
};

/// Calls fn(F32{}), fn(Bf16{}) or fn(F16{}) for `dtype` and returns true; false (calling
/// nothing) for kDouble, which the float32-computing kernels do not store. Host code: the
/// launches pick their instantiation with it.
template <typename Fn>
inline bool with_float_type(Dtype dtype, const Fn& fn) {
  switch (dtype) {
    case Dtype::kFloat:
      fn(F32{});
      return true;
    case Dtype::kBFloat16:
      fn(Bf16{});
      return true;
    case Dtype::kHalf:
      fn(F16{});
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace amp::kernels
