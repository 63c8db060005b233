// The element vocabulary of amp's optimizer steps, written once for the CPU loops and the CUDA
// kernel so that both give the same bits: storage dtypes loaded as float32 and rounded back on
// their bit patterns (no library rounding whose NaN or subnormal handling could differ), the
// write-backs that keep a low-precision parameter's updates, and stochastic rounding's
// counter-based bits. An update rule (rules/*.h) states its arithmetic in these terms: float32
// operations, one rounding each (the CPU files are built with -ffp-contract=off and the .cu file
// with --fmad=false, so nothing is fused unless a rule asks for fma()). No ATen here: nvcc
// compiles this header too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/float_bits.h"
#include "kernels/host_device.h"

namespace amp::optim::detail {

/// How an updated value reaches a parameter (kRoundNearest alone for float32 parameters).
enum class WriteBack {
  kRoundNearest,   ///< parameter = round(parameter + update)
  kMasterWeights,  ///< master += update (fp32); parameter = round(master)
  kKahan,          ///< the update goes through a compensation buffer in the parameter's dtype
  kStochastic,     ///< parameter = stochastic_round(parameter + update) (bfloat16 only)
};

// Everything below has internal linkage in each file that includes it: the CPU loops are built
// once per instruction set, and an out-of-line copy of a shared inline function built with
// AVX-512 must never be the one the linker keeps for the baseline build. (The rules' hyper-
// parameter structs, outside, are plain data.)
namespace lp {
namespace {

using amp::kernels::bits_float;
using amp::kernels::float_bits;

AMP_HOST_DEVICE_INLINE float square_root(float value) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(value);
#else
  return __builtin_sqrtf(value);
#endif
}

/// `when ? yes : no` as bit masks: no branch for the vectoriser to give up on.
AMP_HOST_DEVICE_INLINE uint32_t pick(bool when, uint32_t yes, uint32_t no) {
  const uint32_t mask = 0u - static_cast<uint32_t>(when);
  return (yes & mask) | (no & ~mask);
}

// ---- storage dtypes: load as float32, round to the dtype (round to nearest even) ----
// Every branch below is a select on values, so the CPU loops stay vectorisable.

struct Bf16 {
  using Raw = uint16_t;
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
  static AMP_HOST_DEVICE_INLINE float load(Raw raw) {
    const uint32_t sign = static_cast<uint32_t>(raw & 0x8000u) << 16;
    const uint32_t exponent = (raw >> 10) & 0x1Fu;
    const uint32_t mantissa = raw & 0x3FFu;
    // Normal: rebias the exponent (15 -> 127); inf stays inf, NaN keeps its payload and is made
    // quiet (as c10 does); a subnormal is mantissa * 2^-24, exact in float32.
    const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
    const uint32_t special = 0x7F800000u | (mantissa << 13) | pick(mantissa != 0, 0x400000u, 0u);
    const uint32_t subnormal =
        float_bits(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
    uint32_t magnitude = pick(exponent == 31, special, normal);
    magnitude = pick(exponent == 0, subnormal, magnitude);
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
    uint32_t magnitude = pick(a < 0x38800000u, subnormal, normal);
    magnitude = pick(a >= 0x477FF000u, 0x7C00u, magnitude);
    magnitude = pick(a > 0x7F800000u, 0x7E00u, magnitude);
    return static_cast<Raw>(sign | magnitude);
  }
};

struct F32 {
  using Raw = float;
  static AMP_HOST_DEVICE_INLINE float load(Raw raw) { return raw; }
  static AMP_HOST_DEVICE_INLINE Raw store(float value) { return value; }
};

// ---- stochastic rounding's bits ----

AMP_HOST_DEVICE_INLINE uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

AMP_HOST_DEVICE_INLINE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/// One key per parameter and step; the element's bits are two rounds of mix32 over its index.
AMP_HOST_DEVICE_INLINE uint64_t tensor_key(uint64_t seed, uint64_t stream, uint64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
}

AMP_HOST_DEVICE_INLINE uint32_t element_bits(uint64_t key, uint32_t index) {
  return mix32(mix32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32)) >> 16;
}

/// torchao's rule: add 16 random bits to the low half of the float32 pattern, then truncate.
AMP_HOST_DEVICE_INLINE uint16_t sr_bf16(float value, uint32_t bits) {
  return static_cast<uint16_t>((float_bits(value) + bits) >> 16);
}

// ---- one element's tensors ----

/// The pointers of one parameter's tensors. __restrict: no two alias (each is its own tensor).
template <typename P, typename S>
struct Pointers {
  typename P::Raw* __restrict param;
  typename P::Raw* __restrict grad;
  float* __restrict master;
  typename P::Raw* __restrict comp;
  typename S::Raw* __restrict state0;  // exp_avg, or SGD's momentum buffer
  typename S::Raw* __restrict state1;  // exp_avg_sq
  typename S::Raw* __restrict state2;  // max_exp_avg_sq
};

/// The parameter's current value as the arithmetic reads it.
template <typename P, WriteBack W, typename Ptr>
AMP_HOST_DEVICE_INLINE float read_weight(const Ptr& p, int64_t i) {
  if constexpr (W == WriteBack::kMasterWeights) {
    return p.master[i];
  } else {
    return P::load(p.param[i]);
  }
}

/// Applies `update` to element i whose value `w` read_weight() returned; `index` numbers the
/// element in its parameter (the stochastic-rounding bits are drawn for it).
template <typename P, WriteBack W, typename Ptr>
AMP_HOST_DEVICE_INLINE void apply_update(const Ptr& p, uint64_t key, int64_t i, int64_t index,
                                         float w, float update) {
  if constexpr (W == WriteBack::kMasterWeights) {
    const float next = w + update;
    p.master[i] = next;
    p.param[i] = P::store(next);
  } else if constexpr (W == WriteBack::kRoundNearest) {
    p.param[i] = P::store(w + update);
  } else if constexpr (W == WriteBack::kStochastic) {
    p.param[i] = sr_bf16(w + update, element_bits(key, static_cast<uint32_t>(index)));
  } else {
    // Kahan: comp += update; old = param; param += comp; comp += old - param, each operation
    // rounded to the parameter's dtype.
    const float c = P::load(P::store(P::load(p.comp[i]) + update));
    const typename P::Raw next = P::store(w + c);
    const float lost = P::load(P::store(w - P::load(next)));
    p.comp[i] = P::store(c + lost);
    p.param[i] = next;
  }
}

/// The gradient as the update reads it: unscaled and signed. Without a scale (1) the division is
/// left out: x / 1 is x, and on the GPU an IEEE division is dozens of instructions (the CPU loop
/// computes both sides of the select, with the same bits).
template <typename P, typename Ptr>
AMP_HOST_DEVICE_INLINE float unscaled_grad(const Ptr& p, int64_t i, float scale, float sign) {
  const float g = P::load(p.grad[i]);
  return (scale == 1.0f ? g : g / scale) * sign;
}

/// Fused multiply-add, one rounding: a rule uses it where the reference it matches fuses (ATen's
/// `add(x, y, alpha)` on CPU and CUDA computes x + alpha * y with an FMA).
AMP_HOST_DEVICE_INLINE float fmadd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

}  // namespace
}  // namespace lp
}  // namespace amp::optim::detail
