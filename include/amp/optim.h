// amp::optim: Adam, AdamW and SGD for LibTorch over ATen's fused kernels, and the scaling
// protocol through which GradScaler hands an optimizer the scale and the inf/NaN flag.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <amp/export.h>

namespace amp::optim {

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

 private:
  at::Tensor grad_scale_;
  at::Tensor found_inf_;
};

/// Options of FusedAdam: LibTorch's AdamOptions (same names and defaults) plus maximize and
/// capturable.
struct AMP_EXPORT FusedAdamOptions
    : public torch::optim::OptimizerCloneableOptions<FusedAdamOptions> {
  /// Defaults everywhere, with the given learning rate.
  FusedAdamOptions(double lr = 1e-3);  // NOLINT: implicit, as LibTorch's AdamOptions
  /// Learning rate; finite and >= 0.
  TORCH_ARG(double, lr) = 1e-3;
  /// The type of betas: (beta1, beta2).
  typedef std::tuple<double, double> betas_t;
  /// Decay rates of the first and second moment estimates; each in [0, 1).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator; finite and >= 0.
  TORCH_ARG(double, eps) = 1e-8;
  /// L2 penalty added to the gradient (Adam) or decoupled decay of the parameters (AdamW); >= 0.
  TORCH_ARG(double, weight_decay) = 0;
  /// Use the maximum of past second moments (AMSGrad).
  TORCH_ARG(bool, amsgrad) = false;
  /// Maximise the objective instead of minimising it.
  TORCH_ARG(bool, maximize) = false;
  /// Keep the learning rate in a device tensor too (step counts always are), so that a step can
  /// be captured in a CUDA graph and later lr changes reach the replays. CUDA parameters only.
  TORCH_ARG(bool, capturable) = false;

 public:
  /// Reads the options from a checkpoint, under LibTorch's key names.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options under LibTorch's key names.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override { return lr(); }
  /// Sets the learning rate (what LR schedulers write).
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Options of FusedAdamW: LibTorch's AdamWOptions (same names and defaults, weight_decay 1e-2)
/// plus maximize and capturable.
struct AMP_EXPORT FusedAdamWOptions
    : public torch::optim::OptimizerCloneableOptions<FusedAdamWOptions> {
  /// Defaults everywhere, with the given learning rate.
  FusedAdamWOptions(double lr = 1e-3);  // NOLINT: implicit, as LibTorch's AdamWOptions
  /// Learning rate; finite and >= 0.
  TORCH_ARG(double, lr) = 1e-3;
  /// The type of betas: (beta1, beta2).
  typedef std::tuple<double, double> betas_t;
  /// Decay rates of the first and second moment estimates; each in [0, 1).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator; finite and >= 0.
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay: parameters are multiplied by 1 - lr * weight_decay; >= 0.
  TORCH_ARG(double, weight_decay) = 1e-2;
  /// Use the maximum of past second moments (AMSGrad).
  TORCH_ARG(bool, amsgrad) = false;
  /// Maximise the objective instead of minimising it.
  TORCH_ARG(bool, maximize) = false;
  /// See FusedAdamOptions::capturable.
  TORCH_ARG(bool, capturable) = false;

 public:
  /// Reads the options from a checkpoint, under LibTorch's key names.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options under LibTorch's key names.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override { return lr(); }
  /// Sets the learning rate (what LR schedulers write).
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Options of FusedSGD: LibTorch's SGDOptions (same names and defaults; lr has no default) plus
/// maximize and capturable.
struct AMP_EXPORT FusedSGDOptions
    : public torch::optim::OptimizerCloneableOptions<FusedSGDOptions> {
  /// Defaults everywhere, with the given learning rate (SGD has no default lr).
  FusedSGDOptions(double lr);  // NOLINT: implicit, as LibTorch's SGDOptions
  /// Learning rate; finite and >= 0.
  TORCH_ARG(double, lr);
  /// Momentum factor; finite and >= 0 (0: no momentum buffer).
  TORCH_ARG(double, momentum) = 0;
  /// Dampening of the momentum; finite.
  TORCH_ARG(double, dampening) = 0;
  /// L2 penalty added to the gradient; finite and >= 0.
  TORCH_ARG(double, weight_decay) = 0;
  /// Nesterov momentum (needs momentum > 0 and dampening 0).
  TORCH_ARG(bool, nesterov) = false;
  /// Maximise the objective instead of minimising it.
  TORCH_ARG(bool, maximize) = false;
  /// See FusedAdamOptions::capturable.
  TORCH_ARG(bool, capturable) = false;

 public:
  /// Reads the options from a checkpoint, under LibTorch's key names.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options under LibTorch's key names.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override { return lr(); }
  /// Sets the learning rate (what LR schedulers write).
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Per-parameter state of FusedAdam and FusedAdamW. `step` is a 0-dim float32 tensor on the
/// parameter's device (as in Python's fused Adam), so a skipped step is rolled back on the device.
/// Saved in LibTorch's Adam/AdamW layout, with the step count as an integer.
struct AMP_EXPORT FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  /// Steps taken so far: a 0-dim float32 tensor on the parameter's device.
  TORCH_ARG(at::Tensor, step);
  /// First moment estimate, shaped and typed like the parameter.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Second moment estimate, shaped and typed like the parameter.
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Maximum of past second moments (amsgrad only; otherwise undefined).
  TORCH_ARG(at::Tensor, max_exp_avg_sq);

 public:
  /// Reads LibTorch's layout (an integer step) or a tensor step.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes LibTorch's layout; reads the step count back from its device (a sync).
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Per-parameter state of FusedSGD: the momentum buffer (undefined without momentum), in
/// LibTorch's SGD layout.
struct AMP_EXPORT FusedSGDParamState
    : public torch::optim::OptimizerCloneableParamState<FusedSGDParamState> {
  /// The momentum buffer, shaped and typed like the parameter.
  TORCH_ARG(at::Tensor, momentum_buffer);

 public:
  /// Reads LibTorch's SGD layout.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes LibTorch's SGD layout.
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

namespace detail {
/// The Adam family's step and checkpoint code, shared by FusedAdam and FusedAdamW.
class AMP_EXPORT FusedAdamBase : public torch::optim::Optimizer, public SupportsAmpScaling {
 public:
  /// One fused kernel call per param group and parameter dtype; runs the closure first (under
  /// grad mode) when given and returns its loss. Unscales by grad_scale() and skips on
  /// found_inf() when a GradScaler set them.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Writes options and state in LibTorch's layout (reads step counts back to the host).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads a checkpoint of this optimizer or of LibTorch's counterpart; all or nothing.
  void load(torch::serialize::InputArchive& archive) override;
  /// Capturable mode: writes each group's current lr into its device tensor, in place. step()
  /// does this itself; a replay of a captured CUDA graph runs no host code, so after changing a
  /// group's lr between replays call this before the next replay. No-op for groups without one.
  void sync_capturable_lr();

 protected:
  FusedAdamBase(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                std::unique_ptr<torch::optim::OptimizerOptions> defaults, bool decoupled);

 private:
  bool decoupled_;  // AdamW's decoupled weight decay
  // Capturable mode: each group's learning rate in a device tensor, refreshed when it changes.
  std::vector<std::pair<double, at::Tensor>> lr_tensors_;
};
}  // namespace detail

/// Adam over ATen's fused kernel (`at::_fused_adam_`; CPU and CUDA): one kernel call per param
/// group and parameter dtype instead of a chain of small ops per parameter. The numbers equal
/// Python's `torch.optim.Adam(fused=True)` bit for bit (the same kernel). Works alone, as a
/// drop-in for torch::optim::Adam, and with GradScaler, which hands it the scale and the inf/NaN
/// flag so that a step never reads the flag on the host (see SupportsAmpScaling).
///
/// Param groups and per-group options (a group's options fields left at their constructor
/// default take the optimizer's defaults, as in LibTorch), zero_grad, and save/load through
/// torch::serialize archives in LibTorch's Adam layout: a checkpoint of torch::optim::Adam or
/// torch::optim::AdamW loads into FusedAdam and FusedAdamW, and theirs into LibTorch's.
///
/// Errors (c10::Error, a sentence naming the group, parameter, value and fix): options out of
/// range, a non-floating parameter, parameters of one group on different devices, a device other
/// than CPU and CUDA, sparse gradients, capturable with CPU parameters; a load whose groups, sizes
/// or state shapes do not match leaves the optimizer unchanged.
class AMP_EXPORT FusedAdam : public detail::FusedAdamBase {
 public:
  /// Param groups whose options, where set, override `defaults` field by field.
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults = {});
  /// One param group holding `params`.
  explicit FusedAdam(std::vector<at::Tensor> params, FusedAdamOptions defaults = {});
};

/// AdamW (decoupled weight decay) over ATen's fused kernel (`at::_fused_adamw_`); everything else
/// as FusedAdam. Equals Python's `torch.optim.AdamW(fused=True)` bit for bit.
class AMP_EXPORT FusedAdamW : public detail::FusedAdamBase {
 public:
  /// Param groups whose options, where set, override `defaults` field by field.
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      FusedAdamWOptions defaults = {});
  /// One param group holding `params`.
  explicit FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults = {});
};

/// SGD with momentum, dampening, Nesterov, weight decay and maximize over ATen's fused kernel
/// (`at::_fused_sgd_`; CPU and CUDA), otherwise as FusedAdam (checkpoints in LibTorch's SGD
/// layout). Equals Python's `torch.optim.SGD(fused=True)` bit for bit, with one deliberate
/// difference: a new momentum buffer starts as zeros rather than uninitialised memory, so a
/// first step skipped for inf/NaN leaves a zero buffer (Python's keeps whatever the allocation
/// held and feeds it into the next step). The next step then treats the buffer as initialised:
/// with dampening 0 (the default) it computes exactly a first step; with dampening d it starts
/// from (1 - d) * grad.
class AMP_EXPORT FusedSGD : public torch::optim::Optimizer, public SupportsAmpScaling {
 public:
  /// Param groups whose options, where set, override `defaults` field by field.
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    FusedSGDOptions defaults);
  /// One param group holding `params`.
  explicit FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults);

  /// One fused kernel call per param group and parameter dtype; runs the closure first (under
  /// grad mode) when given and returns its loss. Unscales by grad_scale() and skips on
  /// found_inf() when a GradScaler set them.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Writes options and state in LibTorch's layout (reads step counts back to the host).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads a checkpoint of this optimizer or of LibTorch's counterpart; all or nothing.
  void load(torch::serialize::InputArchive& archive) override;
  /// Capturable mode: writes each group's current lr into its device tensor, in place. step()
  /// does this itself; a replay of a captured CUDA graph runs no host code, so after changing a
  /// group's lr between replays call this before the next replay. No-op for groups without one.
  void sync_capturable_lr();

 private:
  std::vector<std::pair<double, at::Tensor>> lr_tensors_;
};

}  // namespace amp::optim
