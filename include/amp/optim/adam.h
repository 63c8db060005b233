// amp::optim::FusedAdam and FusedAdamW: Adam and AdamW for LibTorch over ATen's fused kernels,
// with GradScaler's zero-sync step and amp's low-precision options.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <amp/detail/fused_optimizer.h>
#include <amp/export.h>
#include <amp/optim/low_precision_options.h>

namespace amp::optim {

/// Options of FusedAdam: LibTorch's AdamOptions (same names and defaults) plus maximize,
/// capturable and the low-precision options (LowPrecisionOptions).
struct AMP_EXPORT FusedAdamOptions
    : public torch::optim::OptimizerCloneableOptions<FusedAdamOptions>,
      public LowPrecisionOptions<FusedAdamOptions> {
  /// Defaults everywhere; as a param group's options, no field is set (each takes the
  /// optimizer's default).
  FusedAdamOptions() = default;
  /// Defaults everywhere, with the given learning rate (set: a group keeps it).
  FusedAdamOptions(double lr);  // NOLINT: implicit, as LibTorch's AdamOptions
  /// Learning rate; finite and >= 0.
  AMP_OPTION_ARG(double, lr) = 1e-3;
  /// The type of betas: (beta1, beta2).
  typedef std::tuple<double, double> betas_t;
  /// Decay rates of the first and second moment estimates; each in [0, 1).
  AMP_OPTION_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator; finite and >= 0.
  AMP_OPTION_ARG(double, eps) = 1e-8;
  /// L2 penalty added to the gradient (Adam) or decoupled decay of the parameters (AdamW); >= 0.
  AMP_OPTION_ARG(double, weight_decay) = 0;
  /// Use the maximum of past second moments (AMSGrad).
  AMP_OPTION_ARG(bool, amsgrad) = false;
  /// Maximise the objective instead of minimising it.
  AMP_OPTION_ARG(bool, maximize) = false;
  /// Keep the learning rate in a device tensor too (step counts always are), so that a step can
  /// be captured in a CUDA graph and later lr changes reach the replays. CUDA parameters only.
  AMP_OPTION_ARG(bool, capturable) = false;

 public:
  /// Reads the options from a checkpoint, under LibTorch's key names.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options under LibTorch's key names.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override { return lr(); }
  /// Sets the learning rate (what LR schedulers write).
  void set_lr(const double lr) override { this->lr(lr); }
  /// Field by field, as LibTorch's options compare.
  AMP_EXPORT friend bool operator==(const FusedAdamOptions& lhs, const FusedAdamOptions& rhs);
};

/// Options of FusedAdamW: LibTorch's AdamWOptions (same names and defaults, weight_decay 1e-2)
/// plus maximize, capturable and the low-precision options.
struct AMP_EXPORT FusedAdamWOptions
    : public torch::optim::OptimizerCloneableOptions<FusedAdamWOptions>,
      public LowPrecisionOptions<FusedAdamWOptions> {
  /// Defaults everywhere; as a param group's options, no field is set (each takes the
  /// optimizer's default).
  FusedAdamWOptions() = default;
  /// Defaults everywhere, with the given learning rate (set: a group keeps it).
  FusedAdamWOptions(double lr);  // NOLINT: implicit, as LibTorch's AdamWOptions
  /// Learning rate; finite and >= 0.
  AMP_OPTION_ARG(double, lr) = 1e-3;
  /// The type of betas: (beta1, beta2).
  typedef std::tuple<double, double> betas_t;
  /// Decay rates of the first and second moment estimates; each in [0, 1).
  AMP_OPTION_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator; finite and >= 0.
  AMP_OPTION_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay: parameters are multiplied by 1 - lr * weight_decay; >= 0.
  AMP_OPTION_ARG(double, weight_decay) = 1e-2;
  /// Use the maximum of past second moments (AMSGrad).
  AMP_OPTION_ARG(bool, amsgrad) = false;
  /// Maximise the objective instead of minimising it.
  AMP_OPTION_ARG(bool, maximize) = false;
  /// See FusedAdamOptions::capturable.
  AMP_OPTION_ARG(bool, capturable) = false;

 public:
  /// Reads the options from a checkpoint, under LibTorch's key names.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options under LibTorch's key names.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override { return lr(); }
  /// Sets the learning rate (what LR schedulers write).
  void set_lr(const double lr) override { this->lr(lr); }
  /// Field by field, as LibTorch's options compare.
  AMP_EXPORT friend bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs);
};

/// Per-parameter state of FusedAdam and FusedAdamW. `step` is a 0-dim float32 tensor on the
/// parameter's device (as in Python's fused Adam), so a skipped step is rolled back on the device.
/// Saved in LibTorch's Adam/AdamW layout, with the step count as an integer.
struct AMP_EXPORT FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  /// Steps taken so far: a 0-dim float32 tensor on the parameter's device.
  TORCH_ARG(at::Tensor, step);
  /// First moment estimate, shaped like the parameter, typed like it (low-precision parameters
  /// under a low-precision option: as state_dtype, float32 by default).
  TORCH_ARG(at::Tensor, exp_avg);
  /// Second moment estimate, shaped and typed like exp_avg.
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Maximum of past second moments (amsgrad only; otherwise undefined).
  TORCH_ARG(at::Tensor, max_exp_avg_sq);
  /// master_weights: the parameter's float32 copy (otherwise undefined).
  TORCH_ARG(at::Tensor, master_weight);
  /// kahan_summation: the compensation, in the parameter's dtype (otherwise undefined).
  TORCH_ARG(at::Tensor, kahan_comp);

 public:
  /// Reads LibTorch's layout (an integer step) or a tensor step.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes LibTorch's layout; reads the step count back from its device (a sync).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Tensor by tensor: both undefined, or equal dtype, device, shape and values (reads them).
  AMP_EXPORT friend bool operator==(const FusedAdamParamState& lhs, const FusedAdamParamState& rhs);
};

namespace detail {
// Instantiated once, in the library (src/optim/fused_adam.cpp).
extern template class FusedOptimizer<FusedAdamOptions, FusedAdamParamState>;
extern template class FusedOptimizer<FusedAdamWOptions, FusedAdamParamState>;
}  // namespace detail

/// Adam over ATen's fused kernel (`at::_fused_adam_`; CPU and CUDA): one kernel call per param
/// group and parameter dtype instead of a chain of small ops per parameter. The numbers equal
/// Python's `torch.optim.Adam(fused=True)` bit for bit (the same kernel). Works alone, as a
/// drop-in for torch::optim::Adam, and with GradScaler, which hands it the scale and the inf/NaN
/// flag so that a step never reads the flag on the host (see SupportsAmpScaling).
///
/// Param groups and per-group options (a group keeps every option it sets, even one equal to the
/// type's default, and takes the others from the optimizer's defaults, as in Python), zero_grad,
/// and save/load through torch::serialize archives in LibTorch's Adam layout: a checkpoint of
/// torch::optim::Adam or torch::optim::AdamW loads into FusedAdam and FusedAdamW, and theirs into
/// LibTorch's.
///
/// Errors (c10::Error, a sentence naming the group, parameter, value and fix): options out of
/// range, a non-floating parameter, parameters of one group on different devices, a device other
/// than CPU and CUDA, sparse gradients, capturable with CPU parameters; a load whose groups, sizes
/// or state shapes do not match leaves the optimizer unchanged.
class AMP_EXPORT FusedAdam : public detail::FusedOptimizer<FusedAdamOptions, FusedAdamParamState> {
 public:
  /// Param groups whose options override `defaults` in each field the group set.
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults = {});
  /// One param group holding `params`.
  explicit FusedAdam(std::vector<at::Tensor> params, FusedAdamOptions defaults = {});

 protected:
  /// The options' range checks (the base calls them at construction, each step and load).
  void check_options(const FusedAdamOptions& options, const std::string& where) const override;
  /// A group's options: each field the group set, the rest from `defaults` (Python's rule).
  FusedAdamOptions merge_options(const FusedAdamOptions& group,
                                 const FusedAdamOptions& defaults) const override;
  /// One group's update: ATen's fused kernel, or amp's step engine for low-precision parameters.
  void step_group(size_t group_index, const FusedAdamOptions& options,
                  const detail::GroupWork& work, const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) override;
  /// A checkpoint's state entry checked against the parameter and moved to its device.
  std::unique_ptr<FusedAdamParamState> loaded_state(const at::Tensor& param,
                                                    const FusedAdamParamState& saved,
                                                    const FusedAdamOptions& options,
                                                    const std::string& where) const override;
};

/// AdamW (decoupled weight decay) over ATen's fused kernel (`at::_fused_adamw_`); everything else
/// as FusedAdam. Equals Python's `torch.optim.AdamW(fused=True)` bit for bit.
class AMP_EXPORT FusedAdamW
    : public detail::FusedOptimizer<FusedAdamWOptions, FusedAdamParamState> {
 public:
  /// Param groups whose options override `defaults` in each field the group set.
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      FusedAdamWOptions defaults = {});
  /// One param group holding `params`.
  explicit FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults = {});

 protected:
  /// The options' range checks (the base calls them at construction, each step and load).
  void check_options(const FusedAdamWOptions& options, const std::string& where) const override;
  /// A group's options: each field the group set, the rest from `defaults` (Python's rule).
  FusedAdamWOptions merge_options(const FusedAdamWOptions& group,
                                  const FusedAdamWOptions& defaults) const override;
  /// One group's update: ATen's fused kernel, or amp's step engine for low-precision parameters.
  void step_group(size_t group_index, const FusedAdamWOptions& options,
                  const detail::GroupWork& work, const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) override;
  /// A checkpoint's state entry checked against the parameter and moved to its device.
  std::unique_ptr<FusedAdamParamState> loaded_state(const at::Tensor& param,
                                                    const FusedAdamParamState& saved,
                                                    const FusedAdamWOptions& options,
                                                    const std::string& where) const override;
};

}  // namespace amp::optim
