// amp::optim::FusedLion: the Lion optimizer (Chen et al. 2023) for LibTorch on amp's step engine,
// with GradScaler's zero-sync step and amp's low-precision options.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <amp/detail/fused_optimizer.h>
#include <amp/export.h>
#include <amp/optim/low_precision_options.h>

namespace amp::optim {

/// Options of FusedLion: lion-pytorch's names and defaults (lr 1e-4, betas (0.9, 0.99), decoupled
/// weight decay 0) plus maximize and the low-precision options.
struct AMP_EXPORT FusedLionOptions
    : public torch::optim::OptimizerCloneableOptions<FusedLionOptions>,
      public LowPrecisionOptions<FusedLionOptions> {
  /// Defaults everywhere; as a param group's options, no field is set (each takes the
  /// optimizer's default).
  FusedLionOptions() = default;
  /// Defaults everywhere, with the given learning rate (set: a group keeps it).
  FusedLionOptions(double lr);  // NOLINT: implicit, as LibTorch's options
  /// Learning rate; finite and >= 0. Lion's steps are lr in size (the sign of a momentum):
  /// typically 3-10x smaller than AdamW's.
  AMP_OPTION_ARG(double, lr) = 1e-4;
  /// The type of betas: (beta1, beta2).
  typedef std::tuple<double, double> betas_t;
  /// beta1 interpolates the momentum and the gradient for the update's sign; beta2 is the
  /// momentum's decay. Each in [0, 1].
  AMP_OPTION_ARG(betas_t, betas) = std::make_tuple(0.9, 0.99);
  /// Decoupled weight decay: parameters are multiplied by 1 - lr * weight_decay; >= 0.
  AMP_OPTION_ARG(double, weight_decay) = 0;
  /// Maximise the objective instead of minimising it.
  AMP_OPTION_ARG(bool, maximize) = false;

 public:
  /// Reads the options from a checkpoint.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override { return lr(); }
  /// Sets the learning rate (what LR schedulers write).
  void set_lr(const double lr) override { this->lr(lr); }
  /// Lion has no capturable mode (the base asks every options type).
  bool capturable() const { return false; }
  /// Field by field.
  AMP_EXPORT friend bool operator==(const FusedLionOptions& lhs, const FusedLionOptions& rhs);
};

/// Per-parameter state of FusedLion.
struct AMP_EXPORT FusedLionParamState
    : public torch::optim::OptimizerCloneableParamState<FusedLionParamState> {
  /// Steps taken so far: a 0-dim float32 tensor on the parameter's device (stochastic
  /// rounding's bits are drawn per step; a skipped step does not count).
  TORCH_ARG(at::Tensor, step);
  /// The momentum, shaped like the parameter, typed like it (low-precision parameters under a
  /// low-precision option: as state_dtype, float32 by default).
  TORCH_ARG(at::Tensor, exp_avg);
  /// master_weights: the parameter's float32 copy (otherwise undefined).
  TORCH_ARG(at::Tensor, master_weight);
  /// kahan_summation: the compensation, in the parameter's dtype (otherwise undefined).
  TORCH_ARG(at::Tensor, kahan_comp);

 public:
  /// Reads an entry written by serialize(OutputArchive&).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the step count as an integer and the tensors.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Tensor by tensor: both undefined, or equal dtype, device, shape and values (reads them).
  AMP_EXPORT friend bool operator==(const FusedLionParamState& lhs, const FusedLionParamState& rhs);
};

namespace detail {
// Instantiated once, in the library (src/optim/fused_lion.cpp).
extern template class FusedOptimizer<FusedLionOptions, FusedLionParamState>;
}  // namespace detail

/// Lion (Chen et al. 2023): each parameter moves by lr times the sign of an interpolation of its
/// momentum and gradient, after decoupled weight decay; the momentum then follows the gradient:
///
///     p = p * (1 - lr * weight_decay)
///     p = p - lr * sign(beta1 * m + (1 - beta1) * g)
///     m = beta2 * m + (1 - beta2) * g
///
/// One state tensor per parameter (half of Adam's). Runs on amp's step engine, one pass over
/// every element of a group on the CPU (vectorised, multi-threaded) or one multi-tensor launch on
/// CUDA. float32 parameters get the bits of the lion-pytorch package on PyTorch (its
/// `add(..., alpha)` is a fused multiply-add, as ATen's CPU and CUDA kernels compute it);
/// bfloat16/float16 parameters take the update through the low-precision options' write-back
/// (master weights, Kahan summation, stochastic rounding) or, without one, round to nearest with
/// the momentum in the parameter's dtype. With GradScaler the step unscales the gradients and
/// skips on inf/NaN on the device, without a host sync (SupportsAmpScaling). Param groups,
/// add_param_group, zero_grad, and save/load through torch::serialize archives as the other
/// fused optimizers.
///
/// Errors (c10::Error, a sentence naming the group, parameter, value and fix): options out of
/// range, a parameter that is not float32/bfloat16/float16, parameters of one group on different
/// devices, a device other than CPU and CUDA, sparse or non-contiguous gradients; a load that
/// does not fit leaves the optimizer unchanged.
class AMP_EXPORT FusedLion : public detail::FusedOptimizer<FusedLionOptions, FusedLionParamState> {
 public:
  /// Param groups whose options override `defaults` in each field the group set.
  explicit FusedLion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedLionOptions defaults = {});
  /// One param group holding `params`.
  explicit FusedLion(std::vector<at::Tensor> params, FusedLionOptions defaults = {});

 protected:
  /// The options' range checks (the base calls them at construction, each step and load).
  void check_options(const FusedLionOptions& options, const std::string& where) const override;
  /// A group's options: each field the group set, the rest from `defaults` (Python's rule).
  FusedLionOptions merge_options(const FusedLionOptions& group,
                                 const FusedLionOptions& defaults) const override;
  /// One group's update on the step engine.
  void step_group(size_t group_index, const FusedLionOptions& options,
                  const detail::GroupWork& work, const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) override;
  /// A checkpoint's state entry checked against the parameter and moved to its device.
  std::unique_ptr<FusedLionParamState> loaded_state(const at::Tensor& param,
                                                    const FusedLionParamState& saved,
                                                    const FusedLionOptions& options,
                                                    const std::string& where) const override;
};

}  // namespace amp::optim
