// The element arithmetic of amp's fused float8 casts, read by nvcc and the host compiler alike (no
// ATen, no c10): the amax keys, torchao's scale from an amax, the saturated conversion to
// e4m3fn/e5m2, and the tile walk of the cast + transpose. The CPU loops (fused_cast.cpp) and the
// CUDA kernels (cuda/cast_kernels.cu) both run these functions, so the CPU tests of the fused path
// test the GPU's arithmetic and index math too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/float_bits.h"
#include "kernels/host_device.h"

namespace amp::fp8::cast_element {

/// The float8 formats of a cast.
enum class Format : int32_t { kE4M3, kE5M2 };

/// Along which axis an amax or a scale varies over a 2-d view.
enum class ScaleAxis : int32_t {
  kTensor,  ///< one value
  kRow,     ///< one per row (torchao's rowwise along -1)
  kColumn,  ///< one per column (rowwise along 0)
};

// The functions have internal linkage in each file that includes them, as the optimizer rules'
// element code does (src/kernels/dtype.h, src/optim/engine/element.h), and as the bit helpers they
// call.
namespace {

/// The largest finite value of the format (448 for e4m3fn, 57344 for e5m2).
AMP_HOST_DEVICE_INLINE float format_max(Format format) {
  return format == Format::kE4M3 ? 448.0f : 57344.0f;
}

using amp::kernels::bits_float;
using amp::kernels::float_bits;

// ---- amax ----
// An amax is kept as the bits of |x| read as an unsigned integer: for non-negative floats the
// integer order is the float order, and a NaN (any payload, sign cleared) is above +inf. So the
// integer maximum of the keys is max(|x|) with NaN propagating (torch.max, the dynamic recipes),
// and one atomicMax on the GPU reduces a whole tensor.

/// The key of |x| (NaN propagates through the maximum).
AMP_HOST_DEVICE_INLINE uint32_t amax_key(float x) { return float_bits(x) & 0x7fffffffu; }

/// The key of |x| with NaN counted as 0 (Transformer Engine's fmaxf: delayed scaling ignores NaN).
AMP_HOST_DEVICE_INLINE uint32_t amax_key_ignoring_nan(float x) {
  const uint32_t key = float_bits(x) & 0x7fffffffu;
  return key > 0x7f800000u ? 0u : key;
}

/// The amax a key stands for. NaN keys come back as the canonical positive NaN: what
/// torch.max(torch.abs(x)) returns for a NaN input is a positive NaN as well, and every NaN
/// scale casts to the same float8 bits.
AMP_HOST_DEVICE_INLINE float key_amax(uint32_t key) {
  return key > 0x7f800000u ? bits_float(0x7fc00000u) : bits_float(key);
}

// ---- scale ----

/// torchao's amax_to_scale for one amax: fp8_max / clamp(amax, 1e-12) evaluated as Python
/// evaluates `fp8_max / tensor` on a float64 tensor (the reciprocal, then a multiply: two
/// roundings), stored as float32; with power_of_2, rounded down to a power of two as
/// exp2(floor(log2(scale))) in float32 (the same library calls ATen's kernels make on the
/// device, so the same bits). NaN propagates.
AMP_HOST_DEVICE_INLINE float scale_from_amax(float amax, Format format, bool power_of_2) {
  double a = static_cast<double>(amax);
  if (!(a != a) && a < 1e-12) a = 1e-12;  // at::clamp keeps NaN
  const double reciprocal = 1.0 / a;
  float scale = static_cast<float>(reciprocal * static_cast<double>(format_max(format)));
  if (power_of_2) scale = exp2f(floorf(log2f(scale)));
  return scale;
}

// ---- the conversion ----

/// float32 -> float8 e4m3fn bits, rounding to nearest even (c10::Float8_e4m3fn's conversion:
/// beyond the largest finite value, and NaN, give the NaN pattern, keeping the sign).
AMP_HOST_DEVICE_INLINE uint8_t to_e4m3fn(float value) {
  uint32_t bits = float_bits(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t result;
  if (bits >= (1087u << 20)) {  // |value| >= 480, inf or NaN (the casts clamp to 448 first)
    result = 0x7f;
  } else if (bits < (121u << 23)) {  // below 2^-6: a subnormal of e4m3fn (or zero)
    // Adding 2^14 (exponent 141) puts e4m3fn's subnormal steps (2^-9) in the float's last
    // mantissa bits; the float addition rounds to nearest even.
    const uint32_t denorm = 141u << 23;
    bits = float_bits(bits_float(bits) + bits_float(denorm));
    result = static_cast<uint8_t>(bits - denorm);
  } else {
    const uint32_t odd = (bits >> 20) & 1u;
    bits += ((7u - 127u) << 23) + 0x7ffffu + odd;  // rebias the exponent, round to nearest even
    result = static_cast<uint8_t>(bits >> 20);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

/// float32 -> float8 e5m2 bits, rounding to nearest even (c10::Float8_e5m2's conversion: beyond
/// the largest finite value gives inf, NaN gives NaN, keeping the sign).
AMP_HOST_DEVICE_INLINE uint8_t to_e5m2(float value) {
  uint32_t bits = float_bits(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t result;
  if (bits >= (143u << 23)) {  // |value| >= 65536: inf or NaN
    result = bits > 0x7f800000u ? 0x7f : 0x7c;
  } else if (bits < (113u << 23)) {      // below 2^-14: a subnormal of e5m2 (or zero)
    const uint32_t denorm = 134u << 23;  // 2^7: e5m2's subnormal steps (2^-16) in the last bits
    bits = float_bits(bits_float(bits) + bits_float(denorm));
    result = static_cast<uint8_t>(bits - denorm);
  } else {
    const uint32_t odd = (bits >> 21) & 1u;
    bits += ((15u - 127u) << 23) + 0xfffffu + odd;
    result = static_cast<uint8_t>(bits >> 21);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

/// torchao's saturated cast of one element: clamp(x * scale, -max, max) converted to the format
/// (NaN stays NaN: at::clamp keeps it).
AMP_HOST_DEVICE_INLINE uint8_t quantize(float x, float scale, Format format) {
  const float max = format_max(format);
  float scaled = x * scale;
#if !defined(__CUDA_ARCH__)
  // On the CPU a NaN input keeps its own sign through ATen's multiply (x86 returns the first
  // operand's NaN); which operand the compiler puts first here is not fixed, so say it. (A GPU's
  // multiply gives the canonical positive NaN either way.)
  if (x != x) scaled = x;
#endif
  if (scaled < -max) scaled = -max;  // comparisons are false for NaN: it passes through
  if (scaled > max) scaled = max;
  return format == Format::kE4M3 ? to_e4m3fn(scaled) : to_e5m2(scaled);
}

}  // namespace

// ---- tiles of the cast + transpose ----

/// The square tile the cast + transpose works in: the GPU stages a tile's float8 values in
/// shared memory so that both the row-major and the transposed copy are written in whole rows.
constexpr int64_t kTile = 32;

/// The tile grid of a rows x cols matrix: how many tiles along each dim (the last ones partial).
struct TileGrid {
  int64_t rows, cols;
  AMP_HOST_DEVICE_INLINE int64_t tile_rows() const { return (rows + kTile - 1) / kTile; }
  AMP_HOST_DEVICE_INLINE int64_t tile_cols() const { return (cols + kTile - 1) / kTile; }
  AMP_HOST_DEVICE_INLINE int64_t tiles() const { return tile_rows() * tile_cols(); }
  /// The first row and column of tile `t` (tiles numbered row-major over the grid).
  AMP_HOST_DEVICE_INLINE int64_t row0(int64_t t) const { return (t / tile_cols()) * kTile; }
  AMP_HOST_DEVICE_INLINE int64_t col0(int64_t t) const { return (t % tile_cols()) * kTile; }
  /// Rows and columns of tile `t` inside the matrix (kTile except at the far edges).
  AMP_HOST_DEVICE_INLINE int64_t height(int64_t t) const {
    const int64_t r = rows - row0(t);
    return r < kTile ? r : kTile;
  }
  AMP_HOST_DEVICE_INLINE int64_t width(int64_t t) const {
    const int64_t c = cols - col0(t);
    return c < kTile ? c : kTile;
  }
};

/// A 2-d view of the input as the casts read it: element (r, c) at data[offset + r * row_stride
/// + c * col_stride] (any strides: a transposed or sliced input needs no copy first).
struct MatrixView {
  int64_t offset, row_stride, col_stride;
  AMP_HOST_DEVICE_INLINE int64_t at(int64_t r, int64_t c) const {
    return offset + r * row_stride + c * col_stride;
  }
};

}  // namespace amp::fp8::cast_element
