// SGD as an update rule of the step engine (engine/rule.h): PyTorch's SGD arithmetic in float32
// with momentum, dampening, Nesterov, L2 weight decay and maximize.
#pragma once

#include "optim/engine/rule.h"

namespace amp::optim::detail {

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
};

struct SgdScalars : GradScalars {
  float lr, momentum, one_minus_dampening, weight_decay;
  bool l2, nesterov, first;
};

namespace engine {
namespace {

struct SgdRule : RuleOf<SgdHyper, SgdScalars> {
  static constexpr const char* kName = "SGD";
  enum StateSlot : int { kMomentumBuffer };
  static constexpr bool kHasVariant = true;  // momentum: a buffer to keep
  static bool variant(const Hyper& h) { return h.momentum != 0.0; }

  template <typename P, typename S, WriteBack W, bool kMomentum>
  static AMP_HOST_DEVICE_INLINE void element(const Pointers<P, S>& p, const Scalars& c,
                                             uint64_t key, int64_t i, int64_t index) {
    const float w = read_weight<P, W>(p, i);
    const float g = with_l2(unscaled_grad<P>(p, i, c), w, c.l2, c.weight_decay);
    float d = g;
    if constexpr (kMomentum) {
      const float continued =
          S::load(p.state[kMomentumBuffer][i]) * c.momentum + g * c.one_minus_dampening;
      const auto b_raw = S::store(c.first ? g : continued);
      p.state[kMomentumBuffer][i] = b_raw;
      const float b = S::load(b_raw);
      d = c.nesterov ? g + b * c.momentum : b;
    }
    apply_update<P, W>(p, key, i, index, w, -(d * c.lr));
  }

  /// `first`: the momentum buffer is new, so this step copies the gradient into it.
  static AMP_HOST_DEVICE_INLINE Scalars scalars(const Hyper& h, float, bool first, float scale) {
    Scalars c;
    set_grad_scalars(c, scale, h.maximize);
    c.lr = static_cast<float>(h.lr);
    c.momentum = static_cast<float>(h.momentum);
    c.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
    c.weight_decay = static_cast<float>(h.weight_decay);
    c.l2 = h.weight_decay != 0.0;
    c.nesterov = h.nesterov;
    c.first = first;
    return c;
  }
};

}  // namespace
}  // namespace engine
}  // namespace amp::optim::detail
