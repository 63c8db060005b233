// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") as an update rule of
// the step engine (engine/rule.h), with the arithmetic of the lion-pytorch package on PyTorch:
//   p = p * (1 - lr * weight_decay)                        (decoupled weight decay)
//   p = p - lr * sign(beta1 * m + (1 - beta1) * g)         (the interpolated momentum's sign)
//   m = beta2 * m + (1 - beta2) * g
// in float32, where ATen's `x.add(y, alpha=a)` is one fused multiply-add (fmadd) and sign(NaN)
// is 0, as torch.sgn gives.
#pragma once

#include <type_traits>

#include "optim/engine/rule.h"

namespace amp::optim::detail {

struct LionHyper {
  double lr, beta1, beta2, weight_decay;
  bool maximize;
};

struct LionScalars : GradScalars {
  Betas betas;
  float neg_lr, decay;
};

namespace engine {
namespace {

struct LionRule : RuleOf<LionHyper, LionScalars> {
  static constexpr const char* kName = "Lion";
  enum StateSlot : int { kExpAvg };

  static AMP_HOST_DEVICE_INLINE Scalars scalars(const Hyper& h, float, bool, float scale) {
    // Each constant as Python forms it (a double) and ATen passes it to a float32 kernel.
    Scalars c;
    set_grad_scalars(c, scale, h.maximize);
    c.betas = betas(h.beta1, h.beta2);
    c.neg_lr = static_cast<float>(-h.lr);
    c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
    return c;
  }

  template <typename P, typename S, WriteBack W, bool>
  static AMP_HOST_DEVICE_INLINE void element(const Pointers<P, S>& p, const Scalars& c,
                                             uint64_t key, int64_t i, int64_t index) {
    const float g = unscaled_grad<P>(p, i, c);
    const float w = read_weight<P, W>(p, i);
    const float m = S::load(p.state[kExpAvg][i]);
    const float interpolated = fmadd(g, c.betas.one_minus_beta1, m * c.betas.beta1);
    const float direction =
        static_cast<float>(interpolated > 0.0f) - static_cast<float>(interpolated < 0.0f);
    // The decayed weight and the step along the sign: two roundings, as lion-pytorch's mul_ then
    // add_ (the product direction * lr is exact).
    const float next = fmadd(direction, c.neg_lr, w * c.decay);
    p.state[kExpAvg][i] = S::store(fmadd(g, c.betas.one_minus_beta2, m * c.betas.beta2));
    if constexpr (std::is_same_v<P, F32> && W == WriteBack::kRoundNearest) {
      p.param[i] = next;  // float32 parameters: lion-pytorch's value itself
    } else {
      // A low-precision parameter: the float32 update goes through the write-back.
      apply_update<P, W>(p, key, i, index, w, next - w);
    }
  }
};

}  // namespace
}  // namespace engine
}  // namespace amp::optim::detail
