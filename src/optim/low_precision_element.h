// The element arithmetic of the fused optimizers' low-precision modes, written once for the CPU
// loops and the CUDA kernel so that both give the same bits: float32 operations, one rounding
// each (the CPU files are built with -ffp-contract=off and the .cu file with --fmad=false, so no
// multiply-add is fused), storage conversions done on the bit patterns (no library rounding
// whose NaN or subnormal handling could differ), and the stochastic-rounding bits from a
// counter-based hash. No ATen here: nvcc compiles this header too.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define AMP_LP_FN __host__ __device__ __forceinline__
#else
#define AMP_LP_FN inline
#endif

namespace amp::optim::detail {

/// How an updated value reaches a low-precision parameter.
enum class WriteBack {
  kRoundNearest,   ///< parameter = round(parameter + update)
  kMasterWeights,  ///< master += update (fp32); parameter = round(master)
  kKahan,          ///< the update goes through a compensation buffer in the parameter's dtype
  kStochastic,     ///< parameter = stochastic_round(parameter + update) (bfloat16 only)
};

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
};

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
};

/// Float32 constants of one parameter's step, each rounded once from its double value (the
/// reference does the same).
struct AdamScalars {
  float scale, sign;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, lr_weight_decay;
  float step_size, bias_correction2_sqrt;
  bool l2, decoupled;
};

struct SgdScalars {
  float scale, sign;
  float lr, momentum, one_minus_dampening, weight_decay;
  bool l2, nesterov, first;
};

// Everything below has internal linkage in each file that includes it: the CPU loops are built
// once per instruction set, and an out-of-line copy of a shared inline function built with
// AVX-512 must never be the one the linker keeps for the baseline build.
namespace lp {
namespace {

AMP_LP_FN uint32_t bits_of(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

AMP_LP_FN float float_of(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

AMP_LP_FN float square_root(float value) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(value);
#else
  return __builtin_sqrtf(value);
#endif
}

/// `when ? yes : no` as bit masks: no branch for the vectoriser to give up on.
AMP_LP_FN uint32_t pick(bool when, uint32_t yes, uint32_t no) {
  const uint32_t mask = 0u - static_cast<uint32_t>(when);
  return (yes & mask) | (no & ~mask);
}

// ---- storage dtypes: load as float32, round to the dtype (round to nearest even) ----
// Every branch below is a select on values, so the CPU loops stay vectorisable.

struct Bf16 {
  using Raw = uint16_t;
  static AMP_LP_FN float load(Raw raw) { return float_of(static_cast<uint32_t>(raw) << 16); }
  static AMP_LP_FN Raw store(float value) {
    const uint32_t u = bits_of(value);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return value != value ? Raw{0x7FC0} : static_cast<Raw>(rounded);  // NaN as c10 writes it
  }
};

struct F16 {
  using Raw = uint16_t;
  static AMP_LP_FN float load(Raw raw) {
    const uint32_t sign = static_cast<uint32_t>(raw & 0x8000u) << 16;
    const uint32_t exponent = (raw >> 10) & 0x1Fu;
    const uint32_t mantissa = raw & 0x3FFu;
    // Normal: rebias the exponent (15 -> 127); inf stays inf, NaN keeps its payload and is made
    // quiet (as c10 does); a subnormal is mantissa * 2^-24, exact in float32.
    const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
    const uint32_t special = 0x7F800000u | (mantissa << 13) | pick(mantissa != 0, 0x400000u, 0u);
    const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
    uint32_t magnitude = pick(exponent == 31, special, normal);
    magnitude = pick(exponent == 0, subnormal, magnitude);
    return float_of(sign | magnitude);
  }
  static AMP_LP_FN Raw store(float value) {
    const uint32_t u = bits_of(value);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7FFFFFFFu;
    // Normal range (|value| >= 2^-14): round the 13 dropped mantissa bits to nearest even, then
    // rebias; a carry out of the mantissa moves the exponent up, as it should.
    const uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    // Below 2^-14: adding 0.5 puts the float16 subnormal step (2^-24) at float32's last bit, so
    // the addition itself rounds to nearest even; the low bits are then the float16 pattern.
    const uint32_t subnormal = bits_of(float_of(a) + 0.5f) - 0x3F000000u;
    // 65520 and above round to infinity; NaN becomes the quiet NaN c10 writes.
    uint32_t magnitude = pick(a < 0x38800000u, subnormal, normal);
    magnitude = pick(a >= 0x477FF000u, 0x7C00u, magnitude);
    magnitude = pick(a > 0x7F800000u, 0x7E00u, magnitude);
    return static_cast<Raw>(sign | magnitude);
  }
};

struct F32 {
  using Raw = float;
  static AMP_LP_FN float load(Raw raw) { return raw; }
  static AMP_LP_FN Raw store(float value) { return value; }
};

// ---- stochastic rounding's bits ----

AMP_LP_FN uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

AMP_LP_FN uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/// One key per parameter and step; the element's bits are two rounds of mix32 over its index.
AMP_LP_FN uint64_t tensor_key(uint64_t seed, uint64_t stream, uint64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
}

AMP_LP_FN uint32_t element_bits(uint64_t key, uint32_t index) {
  return mix32(mix32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32)) >> 16;
}

/// torchao's rule: add 16 random bits to the low half of the float32 pattern, then truncate.
AMP_LP_FN uint16_t sr_bf16(float value, uint32_t bits) {
  return static_cast<uint16_t>((bits_of(value) + bits) >> 16);
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
AMP_LP_FN float read_weight(const Ptr& p, int64_t i) {
  if constexpr (W == WriteBack::kMasterWeights) {
    return p.master[i];
  } else {
    return P::load(p.param[i]);
  }
}

/// Applies `update` to element i whose value `w` read_weight() returned; `index` numbers the
/// element in its parameter (the stochastic-rounding bits are drawn for it).
template <typename P, WriteBack W, typename Ptr>
AMP_LP_FN void apply_update(const Ptr& p, uint64_t key, int64_t i, int64_t index, float w,
                            float update) {
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
AMP_LP_FN float unscaled_grad(const Ptr& p, int64_t i, float scale, float sign) {
  const float g = P::load(p.grad[i]);
  return (scale == 1.0f ? g : g / scale) * sign;
}

// ---- Adam ----

/// `count` is the step count after the increment; `scale` 1 when the gradients are not scaled.
AMP_LP_FN AdamScalars adam_scalars(const AdamHyper& h, double count, float scale) {
  AdamScalars c;
  c.scale = scale;
  c.sign = h.maximize ? -1.0f : 1.0f;
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.weight_decay = static_cast<float>(h.weight_decay);
  c.lr_weight_decay = static_cast<float>(h.lr * h.weight_decay);
  c.step_size = static_cast<float>(h.lr / (1.0 - pow(h.beta1, count)));
  c.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(h.beta2, count)));
  c.l2 = !h.decoupled && h.weight_decay != 0.0;
  c.decoupled = h.decoupled && h.weight_decay != 0.0;
  return c;
}

/// Element i of the pointers, the element `index` of its parameter (the two differ when the
/// pointers are a copy of some elements in registers, as in the CUDA kernel's vector path).
template <typename P, typename S, WriteBack W, bool kAmsgrad>
AMP_LP_FN void adam_element(const Pointers<P, S>& p, const AdamScalars& c, uint64_t key,
                            int64_t i, int64_t index) {
  // Selects rather than branches: the CPU loop stays one straight line for the vectoriser.
  float g = unscaled_grad<P>(p, i, c.scale, c.sign);
  const float w = read_weight<P, W>(p, i);
  g = c.l2 ? g + w * c.weight_decay : g;
  // The state is stored, and read back, in its own dtype before the update uses it.
  const auto m_raw = S::store(S::load(p.state0[i]) * c.beta1 + g * c.one_minus_beta1);
  const auto v_raw = S::store(S::load(p.state1[i]) * c.beta2 + (g * g) * c.one_minus_beta2);
  p.state0[i] = m_raw;
  p.state1[i] = v_raw;
  const float m = S::load(m_raw);
  float v = S::load(v_raw);
  if constexpr (kAmsgrad) {
    const float before = S::load(p.state2[i]);
    v = before < v ? v : before;
    p.state2[i] = S::store(v);
  }
  const float denom = square_root(v) / c.bias_correction2_sqrt + c.eps;
  float delta = (m / denom) * c.step_size;
  delta = c.decoupled ? delta + w * c.lr_weight_decay : delta;
  apply_update<P, W>(p, key, i, index, w, -delta);
}

// ---- SGD ----

/// `first`: the momentum buffer is new, so this step copies the gradient into it.
AMP_LP_FN SgdScalars sgd_scalars(const SgdHyper& h, bool first, float scale) {
  SgdScalars c;
  c.scale = scale;
  c.sign = h.maximize ? -1.0f : 1.0f;
  c.lr = static_cast<float>(h.lr);
  c.momentum = static_cast<float>(h.momentum);
  c.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
  c.weight_decay = static_cast<float>(h.weight_decay);
  c.l2 = h.weight_decay != 0.0;
  c.nesterov = h.nesterov;
  c.first = first;
  return c;
}

template <typename P, typename S, WriteBack W, bool kMomentum>
AMP_LP_FN void sgd_element(const Pointers<P, S>& p, const SgdScalars& c, uint64_t key,
                           int64_t i, int64_t index) {
  float g = unscaled_grad<P>(p, i, c.scale, c.sign);
  const float w = read_weight<P, W>(p, i);
  g = c.l2 ? g + w * c.weight_decay : g;
  float d = g;
  if constexpr (kMomentum) {
    const float continued = S::load(p.state0[i]) * c.momentum + g * c.one_minus_dampening;
    const auto b_raw = S::store(c.first ? g : continued);
    p.state0[i] = b_raw;
    const float b = S::load(b_raw);
    d = c.nesterov ? g + b * c.momentum : b;
  }
  apply_update<P, W>(p, key, i, index, w, -(d * c.lr));
}

}  // namespace
}  // namespace lp
}  // namespace amp::optim::detail
