// Adam and AdamW as an update rule of the step engine (engine/rule.h): PyTorch's Adam arithmetic
// in float32, one rounding per operation, L2 or decoupled weight decay, amsgrad, maximize.
#pragma once

#include "optim/engine/rule.h"

namespace amp::optim::detail {

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
};

/// Float32 constants of one parameter's step, each rounded once from its double value (the
/// reference does the same).
struct AdamScalars : GradScalars {
  Betas betas;
  float eps, weight_decay, lr_weight_decay;
  float step_size, bias_correction2_sqrt;
  bool l2, decoupled;
};

namespace engine {
namespace {

struct AdamRule : RuleOf<AdamHyper, AdamScalars> {
  static constexpr const char* kName = "Adam";
  enum StateSlot : int { kExpAvg, kExpAvgSq, kMaxExpAvgSq };
  static constexpr bool kHasVariant = true;  // amsgrad: the running maximum of exp_avg_sq
  static constexpr bool kCountsSteps = true;
  static bool variant(const Hyper& h) { return h.amsgrad; }

  static AMP_HOST_DEVICE_INLINE Scalars scalars(const Hyper& h, float count, bool, float scale) {
    Scalars c;
    set_grad_scalars(c, scale, h.maximize);
    c.betas = betas(h.beta1, h.beta2);
    c.eps = static_cast<float>(h.eps);
    c.weight_decay = static_cast<float>(h.weight_decay);
    c.lr_weight_decay = static_cast<float>(h.lr * h.weight_decay);
    c.step_size = static_cast<float>(h.lr / (1.0 - pow(h.beta1, static_cast<double>(count))));
    c.bias_correction2_sqrt =
        static_cast<float>(sqrt(1.0 - pow(h.beta2, static_cast<double>(count))));
    c.l2 = !h.decoupled && h.weight_decay != 0.0;
    c.decoupled = h.decoupled && h.weight_decay != 0.0;
    return c;
  }

  /// Element i of the pointers, the element `index` of its parameter (the two differ when the
  /// pointers are a copy of some elements in registers, as in the CUDA kernel's vector path).
  template <typename P, typename S, WriteBack W, bool kAmsgrad>
  static AMP_HOST_DEVICE_INLINE void element(const Pointers<P, S>& p, const Scalars& c,
                                             uint64_t key, int64_t i, int64_t index) {
    const float w = read_weight<P, W>(p, i);
    const float g = with_l2(unscaled_grad<P>(p, i, c), w, c.l2, c.weight_decay);
    // The state is stored, and read back, in its own dtype before the update uses it.
    const auto m_raw =
        S::store(S::load(p.state[kExpAvg][i]) * c.betas.beta1 + g * c.betas.one_minus_beta1);
    const auto v_raw = S::store(S::load(p.state[kExpAvgSq][i]) * c.betas.beta2 +
                                (g * g) * c.betas.one_minus_beta2);
    p.state[kExpAvg][i] = m_raw;
    p.state[kExpAvgSq][i] = v_raw;
    const float m = S::load(m_raw);
    float v = S::load(v_raw);
    if constexpr (kAmsgrad) {
      const float before = S::load(p.state[kMaxExpAvgSq][i]);
      v = before < v ? v : before;
      p.state[kMaxExpAvgSq][i] = S::store(v);
    }
    const float denom = square_root(v) / c.bias_correction2_sqrt + c.eps;
    float delta = (m / denom) * c.step_size;
    delta = c.decoupled ? delta + w * c.lr_weight_decay : delta;
    apply_update<P, W>(p, key, i, index, w, -delta);
  }
};

}  // namespace
}  // namespace engine
}  // namespace amp::optim::detail
