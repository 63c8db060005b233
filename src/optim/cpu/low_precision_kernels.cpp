// The low-precision optimizer kernels on the CPU: one pass over a list of parameters, split into
// balanced element ranges across threads, each element updated in float32 arithmetic (one
// rounding per operation: this file is built with -ffp-contract=off so no multiply-add is fused)
// and written back in its storage dtype.
#include "optim/cpu/low_precision_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

namespace amp::optim::detail {
namespace {

// Below this many elements in the whole list the pass runs on the calling thread (as amp's list
// kernels: a parallel region costs milliseconds on a busy machine).
constexpr int64_t kSerialBelowElems = 1 << 23;
constexpr int64_t kGrainElems = 1 << 15;

// ---- storage dtypes: load as float32, round to the dtype (round to nearest even) ----

struct Bf16 {
  using Raw = uint16_t;
  static float load(Raw raw) { return std::bit_cast<float>(static_cast<uint32_t>(raw) << 16); }
  static Raw store(float value) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return value != value ? Raw{0x7FC0} : static_cast<Raw>(rounded);  // NaN as c10 writes it
  }
};

struct F16 {
  using Raw = c10::Half;
  static float load(Raw raw) { return static_cast<float>(raw); }
  static Raw store(float value) { return c10::Half(value); }
};

struct F32 {
  using Raw = float;
  static float load(Raw raw) { return raw; }
  static Raw store(float value) { return value; }
};

template <typename S>
typename S::Raw* data(const at::Tensor& t) {
  return t.defined() ? static_cast<typename S::Raw*>(t.data_ptr()) : nullptr;
}

// ---- stochastic rounding's bits ----

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// One key per parameter and step; the element's bits are two rounds of mix32 over its index.
inline uint64_t tensor_key(uint64_t seed, uint64_t stream, uint64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
}

inline uint32_t element_bits(uint64_t key, uint32_t index) {
  return mix32(mix32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32)) >> 16;
}

inline uint16_t sr_bf16(float value, uint32_t bits) {
  return static_cast<uint16_t>((std::bit_cast<uint32_t>(value) + bits) >> 16);
}

// ---- the write-back, shared by both families ----

// The pointers one range works on. __restrict: no two alias (each is its own tensor), which lets
// the compiler vectorise the element loops without run-time overlap checks.
template <typename P, typename S>
struct Pointers {
  typename P::Raw* __restrict param;
  typename P::Raw* __restrict grad;
  float* __restrict master;
  typename P::Raw* __restrict comp;
  typename S::Raw* __restrict state0;
  typename S::Raw* __restrict state1;
  typename S::Raw* __restrict state2;

  explicit Pointers(const LowPrecisionSlot& slot)
      : param(data<P>(slot.param)),
        grad(data<P>(slot.grad)),
        master(data<F32>(slot.master)),
        comp(data<P>(slot.comp)),
        state0(data<S>(slot.state0)),
        state1(data<S>(slot.state1)),
        state2(data<S>(slot.state2)) {}
};

// The parameter's current value as the arithmetic reads it.
template <typename P, WriteBack W, typename Ptr>
inline float read_weight(const Ptr& p, int64_t i) {
  if constexpr (W == WriteBack::kMasterWeights) {
    return p.master[i];
  } else {
    return P::load(p.param[i]);
  }
}

// Applies `update` to element i whose value `w` read_weight() returned.
template <typename P, WriteBack W, typename Ptr>
inline void apply_update(const Ptr& p, uint64_t key, int64_t i, float w, float update) {
  if constexpr (W == WriteBack::kMasterWeights) {
    const float next = w + update;
    p.master[i] = next;
    p.param[i] = P::store(next);
  } else if constexpr (W == WriteBack::kRoundNearest) {
    p.param[i] = P::store(w + update);
  } else if constexpr (W == WriteBack::kStochastic) {
    static_assert(std::is_same_v<P, Bf16>, "stochastic rounding writes bfloat16 only");
    p.param[i] = sr_bf16(w + update, element_bits(key, static_cast<uint32_t>(i)));
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

// Float32 constants, each rounded once from its double value (the reference does the same).
struct Scalars {
  float scale = 1.0f;  // 1 when the gradients are not scaled: dividing by it is exact
  bool unscale = false;
  float sign = 1.0f;   // -1 with maximize
};

// With a scale, the unscaled gradients are written back (as ATen's fused kernels do) in a pass of
// their own, so that the update loop has no conditional store.
template <typename P>
void write_unscaled(typename P::Raw* __restrict grad, float scale, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) grad[i] = P::store(P::load(grad[i]) / scale);
}

// ---- Adam ----

struct AdamScalars : Scalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, lr_weight_decay;
  float step_size, bias_correction2_sqrt;
  bool l2, decoupled;
};

template <typename P, typename S, WriteBack W, bool kAmsgrad>
void adam_range(const LowPrecisionSlot& slot, const AdamScalars& c, uint64_t key, int64_t begin,
                int64_t end) {
  const Pointers<P, S> p(slot);
  for (int64_t i = begin; i < end; ++i) {
    // Selects rather than branches: the loop stays one straight line for the vectoriser.
    float g = (P::load(p.grad[i]) / c.scale) * c.sign;
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
    const float denom = __builtin_sqrtf(v) / c.bias_correction2_sqrt + c.eps;
    float delta = (m / denom) * c.step_size;
    delta = c.decoupled ? delta + w * c.lr_weight_decay : delta;
    apply_update<P, W>(p, key, i, w, -delta);
  }
  if (c.unscale) write_unscaled<P>(p.grad, c.scale, begin, end);
}

// ---- SGD ----

struct SgdScalars : Scalars {
  float lr, momentum, one_minus_dampening, weight_decay;
  bool l2, nesterov, first;
};

template <typename P, typename S, WriteBack W, bool kMomentum>
void sgd_range(const LowPrecisionSlot& slot, const SgdScalars& c, uint64_t key, int64_t begin,
               int64_t end) {
  const Pointers<P, S> p(slot);
  for (int64_t i = begin; i < end; ++i) {
    float g = (P::load(p.grad[i]) / c.scale) * c.sign;
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
    apply_update<P, W>(p, key, i, w, -(d * c.lr));
  }
  if (c.unscale) write_unscaled<P>(p.grad, c.scale, begin, end);
}

// ---- the pass over the list ----

// Runs range(slot index, begin, end) over all elements of all slots, in balanced ranges.
template <typename Range>
void for_each_range(const std::vector<LowPrecisionSlot>& slots, const Range& range) {
  std::vector<int64_t> offsets(slots.size() + 1, 0);
  for (size_t k = 0; k < slots.size(); ++k) offsets[k + 1] = offsets[k] + slots[k].param.numel();
  const int64_t total = offsets.back();
  if (total == 0) return;
  const int64_t grain = total < kSerialBelowElems ? total : kGrainElems;
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    size_t k = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    for (int64_t pos = begin; pos < end; ++k) {
      const int64_t stop = std::min(end, offsets[k + 1]);
      if (stop > pos) range(k, pos - offsets[k], stop - offsets[k]);
      pos = std::max(pos, stop);
    }
  });
}

bool skipped(const LowPrecisionStep& step) {
  return step.found_inf.defined() && *step.found_inf.data_ptr<float>() != 0.0f;
}

// Counts the step (when the slot keeps a count) and returns the count after the increment.
double count_step(const LowPrecisionSlot& slot) {
  if (!slot.step.defined()) return 0.0;
  float* count = slot.step.data_ptr<float>();
  *count += 1.0f;
  return *count;
}

void fill_common(Scalars& c, const LowPrecisionStep& step, bool maximize) {
  c.unscale = step.grad_scale.defined();
  if (c.unscale) c.scale = *step.grad_scale.data_ptr<float>();
  c.sign = maximize ? -1.0f : 1.0f;
}

// Calls fn with the storage types and write-back as template arguments.
template <typename Fn>
void dispatch(c10::ScalarType param_dtype, c10::ScalarType state_dtype, WriteBack write_back,
              const Fn& fn) {
  const auto with_state = [&](auto p) {
    switch (state_dtype) {
      case c10::kFloat:
        return fn(p, F32{});
      case c10::kBFloat16:
        return fn(p, Bf16{});
      case c10::kHalf:
        return fn(p, F16{});
      default:
        TORCH_CHECK(false, "low-precision optimizer state of dtype ", state_dtype,
                    " is not supported");
    }
  };
  if (param_dtype == c10::kBFloat16) {
    with_state(Bf16{});
  } else {
    TORCH_CHECK(param_dtype == c10::kHalf, "low-precision optimizer kernels take bfloat16 or ",
                "float16 parameters, not ", param_dtype);
    TORCH_CHECK(write_back != WriteBack::kStochastic,
                "stochastic rounding writes bfloat16 parameters only");
    with_state(F16{});
  }
}

template <typename P, typename Fn>
void with_write_back(WriteBack write_back, const Fn& fn) {
  switch (write_back) {
    case WriteBack::kRoundNearest:
      return fn(std::integral_constant<WriteBack, WriteBack::kRoundNearest>{});
    case WriteBack::kMasterWeights:
      return fn(std::integral_constant<WriteBack, WriteBack::kMasterWeights>{});
    case WriteBack::kKahan:
      return fn(std::integral_constant<WriteBack, WriteBack::kKahan>{});
    case WriteBack::kStochastic:
      if constexpr (std::is_same_v<P, Bf16>) {
        return fn(std::integral_constant<WriteBack, WriteBack::kStochastic>{});
      }
      break;
  }
}

// One family's step: skip on the flag, count each slot's step, fill its constants
// (`fill(scalars, slot, count)`), then run the element ranges of the instantiation
// `pick_range(P{}, S{}, write-back constant)` returns.
template <typename Scalars, typename Fill, typename PickRange>
void run_family(const std::vector<LowPrecisionSlot>& slots, const LowPrecisionStep& step,
                bool maximize, const Fill& fill, const PickRange& pick_range) {
  if (slots.empty() || skipped(step)) return;
  std::vector<Scalars> scalars(slots.size());
  std::vector<uint64_t> keys(slots.size());
  for (size_t k = 0; k < slots.size(); ++k) {
    fill_common(scalars[k], step, maximize);
    const double count = count_step(slots[k]);
    fill(scalars[k], slots[k], count);
    keys[k] = tensor_key(step.seed, slots[k].stream, static_cast<uint64_t>(count));
  }
  dispatch(slots[0].param.scalar_type(), step.state_dtype, step.write_back, [&](auto p, auto s) {
    with_write_back<decltype(p)>(step.write_back, [&](auto w) {
      const auto range = pick_range(p, s, w);
      for_each_range(slots, [&](size_t k, int64_t begin, int64_t end) {
        range(slots[k], scalars[k], keys[k], begin, end);
      });
    });
  });
}

}  // namespace

uint32_t rounding_bits(uint64_t seed, uint64_t stream, uint64_t step, uint64_t index) {
  return element_bits(tensor_key(seed, stream, step), static_cast<uint32_t>(index));
}

uint16_t stochastic_round_bf16(float value, uint32_t bits) { return sr_bf16(value, bits); }

void adam_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& h,
                            const LowPrecisionStep& step) {
  run_family<AdamScalars>(
      slots, step, h.maximize,
      [&](AdamScalars& c, const LowPrecisionSlot&, double count) {
        c.beta1 = static_cast<float>(h.beta1);
        c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
        c.beta2 = static_cast<float>(h.beta2);
        c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
        c.eps = static_cast<float>(h.eps);
        c.weight_decay = static_cast<float>(h.weight_decay);
        c.lr_weight_decay = static_cast<float>(h.lr * h.weight_decay);
        c.step_size = static_cast<float>(h.lr / (1.0 - std::pow(h.beta1, count)));
        c.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, count)));
        c.l2 = !h.decoupled && h.weight_decay != 0.0;
        c.decoupled = h.decoupled && h.weight_decay != 0.0;
      },
      [&](auto p, auto s, auto w) {
        using P = decltype(p);
        using S = decltype(s);
        constexpr WriteBack W = decltype(w)::value;
        return h.amsgrad ? adam_range<P, S, W, true> : adam_range<P, S, W, false>;
      });
}

void sgd_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& h,
                           const LowPrecisionStep& step) {
  run_family<SgdScalars>(
      slots, step, h.maximize,
      [&](SgdScalars& c, const LowPrecisionSlot& slot, double) {
        c.lr = static_cast<float>(h.lr);
        c.momentum = static_cast<float>(h.momentum);
        c.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
        c.weight_decay = static_cast<float>(h.weight_decay);
        c.l2 = h.weight_decay != 0.0;
        c.nesterov = h.nesterov;
        c.first = slot.first_momentum;
      },
      [&](auto p, auto s, auto w) {
        using P = decltype(p);
        using S = decltype(s);
        constexpr WriteBack W = decltype(w)::value;
        return h.momentum != 0.0 ? sgd_range<P, S, W, true> : sgd_range<P, S, W, false>;
      });
}

}  // namespace amp::optim::detail
