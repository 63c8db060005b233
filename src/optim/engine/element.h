// The element vocabulary of amp's optimizer steps, written once for the CPU loops and the CUDA
// kernel so that both give the same bits: the stored element types (kernels/dtype.h), the
// write-backs that keep a low-precision parameter's updates, stochastic rounding's counter-based
// bits, and one parameter's pointers with its rule's named state slots. An update rule
// (rules/*.h) states its arithmetic in these terms: float32 operations, one rounding each (the
// CPU files are built with -ffp-contract=off and the .cu file with --fmad=false, so nothing is
// fused unless a rule asks for fmadd()). No ATen here: nvcc compiles this header too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"
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

/// The most state tensors a rule keeps per parameter (Adam with amsgrad: three).
constexpr int kMaxStateSlots = 3;

// Everything below has internal linkage in each file that includes it: the CPU loops are built
// once per instruction set, and an out-of-line copy of a shared inline function built with
// AVX-512 must never be the one the linker keeps for the baseline build. (The rules' hyper-
// parameter structs, outside, are plain data.)
namespace engine {
namespace {

using amp::kernels::Bf16;
using amp::kernels::bits_float;
using amp::kernels::F16;
using amp::kernels::F32;
using amp::kernels::float_bits;

AMP_HOST_DEVICE_INLINE float square_root(float value) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(value);
#else
  return __builtin_sqrtf(value);
#endif
}

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
/// `state` holds the rule's state tensors by the slot names the rule declares (AdamRule::kExpAvg,
/// SgdRule::kMomentumBuffer, ...); a slot the step keeps no tensor for is null.
template <typename P, typename S>
struct Pointers {
  typename P::Raw* __restrict param;
  typename P::Raw* __restrict grad;
  float* __restrict master;
  typename P::Raw* __restrict comp;
  typename S::Raw* __restrict state[kMaxStateSlots];
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
}  // namespace engine
}  // namespace amp::optim::detail
