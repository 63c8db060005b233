// The interfaces through which other code plugs into GradScaler: an optimizer that unscales and
// skips on the device (optim::SupportsAmpScaling), and a combiner of inf/NaN flags across
// processes (FoundInfSync). Neither needs the rest of amp, so implementing one costs one include.
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <amp/export.h>

namespace amp {

struct GradScalerOptions;

namespace optim {

/// An optimizer whose step() unscales the gradients and skips itself on the device (Python's
/// `_step_supports_amp_scaling`). Derive from it next to torch::optim::Optimizer and GradScaler
/// recognises the optimizer: GradScaler::step checks the gradients for inf/NaN without unscaling
/// them (unless unscale_ was already called), hands the optimizer the scale and the flag through
/// set_grad_scaling(), calls step() without reading anything back to the host, and clears both.
/// In step(), divide the gradients by grad_scale() when it is defined and leave parameters and
/// state untouched when found_inf() holds 1 (ATen's _fused_* kernels do both).
class AMP_EXPORT SupportsAmpScaling {
 public:
  virtual ~SupportsAmpScaling() = default;

  /// The scale the gradients carry in the next step(): a 0-dim float32 tensor, or undefined when
  /// they are already unscaled (unscale_ was called) or no scaler is involved.
  const at::Tensor& grad_scale() const { return grad_scale_; }
  /// The inf/NaN flag for the next step(): a 0-dim float32 tensor holding exactly 0 or 1 (1 =
  /// leave everything untouched), or undefined when no scaler is involved.
  const at::Tensor& found_inf() const { return found_inf_; }

  /// Sets an extra scale before GradScaler::step, which then hands over the product of its own
  /// scale and this one (Python's `optimizer.grad_scale` set by the user). Cleared after step.
  void set_grad_scale(at::Tensor grad_scale) { grad_scale_ = std::move(grad_scale); }
  /// Called by GradScaler::step before step(): the scale (undefined when the gradients are
  /// already unscaled) and the flag.
  void set_grad_scaling(at::Tensor grad_scale, at::Tensor found_inf) {
    grad_scale_ = std::move(grad_scale);
    found_inf_ = std::move(found_inf);
  }
  /// Called by GradScaler::step after step() (also when step() throws).
  void clear_grad_scaling() {
    grad_scale_ = at::Tensor();
    found_inf_ = at::Tensor();
  }

  /// Whether this optimizer updates `param` (whose gradient is float16) through a float32 master
  /// copy and takes its gradient in float32 (Apex O2's master gradients). GradScaler::unscale_
  /// and unscale_and_clip_, which refuse to unscale float16 gradients in place as Python does
  /// (small ones would flush to zero), then copy the gradient into float32_gradient(param) and
  /// unscale it there. amp's fused optimizers do so for master_weights(true); the default says no.
  virtual bool keeps_float32_gradient(const at::Tensor& param) const { return false; }
  /// For a parameter keeps_float32_gradient accepts: a float32 tensor shaped like it, which the
  /// next step() reads as its gradient (the caller fills it).
  virtual at::Tensor float32_gradient(const at::Tensor& param) { return at::Tensor(); }

 private:
  at::Tensor grad_scale_;
  at::Tensor found_inf_;
};

}  // namespace optim

/// Combines GradScaler's inf/NaN flags across processes (GradScalerOptions::found_inf_sync).
/// amp::distributed implements it over a c10d process group; the interface keeps the core
/// library free of c10d. Every rank must make the same calls in the same order (SPMD).
class AMP_EXPORT FoundInfSync {
 public:
  virtual ~FoundInfSync();
  /// Replaces `flag` (a 0-dim float32 tensor on the scaler's device, >= 0) in place by its
  /// maximum over all ranks, without reading it on the host.
  virtual void all_reduce_max_(at::Tensor& flag) = 0;
  /// Called by GradScaler's constructor on every rank (enabled or not): throws on every rank,
  /// with a sentence naming the option and the ranks, when the ranks' device types or options
  /// differ, or when this rank cannot combine flags on tensors of `device`.
  virtual void check_same_configuration(c10::DeviceType device,
                                        const GradScalerOptions& options) = 0;
};

}  // namespace amp
