// amp::optim::FusedSGD: SGD for LibTorch over ATen's fused kernel, with GradScaler's zero-sync
// step and amp's low-precision options.
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

/// Options of FusedSGD: LibTorch's SGDOptions (same names and defaults; lr has no default) plus
/// maximize, capturable and the low-precision options.
struct AMP_EXPORT FusedSGDOptions : public torch::optim::OptimizerCloneableOptions<FusedSGDOptions>,
                                    public LowPrecisionOptions<FusedSGDOptions> {
  /// Defaults everywhere, with the given learning rate (SGD has no default lr).
  FusedSGDOptions(double lr);  // NOLINT: implicit, as LibTorch's SGDOptions
  /// Learning rate; finite and >= 0.
  AMP_OPTION_ARG(double, lr);
  /// Momentum factor; finite and >= 0 (0: no momentum buffer).
  AMP_OPTION_ARG(double, momentum) = 0;
  /// Dampening of the momentum; finite.
  AMP_OPTION_ARG(double, dampening) = 0;
  /// L2 penalty added to the gradient; finite and >= 0.
  AMP_OPTION_ARG(double, weight_decay) = 0;
  /// Nesterov momentum (needs momentum > 0 and dampening 0).
  AMP_OPTION_ARG(bool, nesterov) = false;
  /// Maximise the objective instead of minimising it.
  AMP_OPTION_ARG(bool, maximize) = false;
  /// See amp::optim::FusedAdamOptions::capturable.
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
  AMP_EXPORT friend bool operator==(const FusedSGDOptions& lhs, const FusedSGDOptions& rhs);
};

/// Per-parameter state of FusedSGD: the momentum buffer (undefined without momentum), in
/// LibTorch's SGD layout.
struct AMP_EXPORT FusedSGDParamState
    : public torch::optim::OptimizerCloneableParamState<FusedSGDParamState> {
  /// The momentum buffer, shaped like the parameter, typed like it (low-precision parameters
  /// under a low-precision option: as state_dtype, float32 by default).
  TORCH_ARG(at::Tensor, momentum_buffer);
  /// stochastic_rounding: steps taken, a 0-dim float32 tensor (the rounding bits' counter).
  TORCH_ARG(at::Tensor, step);
  /// master_weights: the parameter's float32 copy (otherwise undefined).
  TORCH_ARG(at::Tensor, master_weight);
  /// kahan_summation: the compensation, in the parameter's dtype (otherwise undefined).
  TORCH_ARG(at::Tensor, kahan_comp);

 public:
  /// Reads LibTorch's SGD layout.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes LibTorch's SGD layout.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Tensor by tensor: both undefined, or equal dtype, device, shape and values (reads them).
  AMP_EXPORT friend bool operator==(const FusedSGDParamState& lhs, const FusedSGDParamState& rhs);
};

namespace detail {
// Instantiated once, in the library (src/optim/fused_sgd.cpp).
extern template class FusedOptimizer<FusedSGDOptions, FusedSGDParamState>;
}  // namespace detail

/// SGD with momentum, dampening, Nesterov, weight decay and maximize over ATen's fused kernel
/// (`at::_fused_sgd_`; CPU and CUDA), otherwise as FusedAdam (checkpoints in LibTorch's SGD
/// layout). Equals Python's `torch.optim.SGD(fused=True)` bit for bit, with one deliberate
/// difference: a new momentum buffer starts as zeros rather than uninitialised memory, so a
/// first step skipped for inf/NaN leaves a zero buffer (Python's keeps whatever the allocation
/// held and feeds it into the next step). The next step then treats the buffer as initialised:
/// with dampening 0 (the default) it computes exactly a first step; with dampening d it starts
/// from (1 - d) * grad.
class AMP_EXPORT FusedSGD : public detail::FusedOptimizer<FusedSGDOptions, FusedSGDParamState> {
 public:
  /// Param groups whose options override `defaults` in each field the group set.
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    FusedSGDOptions defaults);
  /// One param group holding `params`.
  explicit FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults);

 protected:
  /// The options' range checks (the base calls them at construction, each step and load).
  void check_options(const FusedSGDOptions& options, const std::string& where) const override;
  /// A group's options: each field the group set, the rest from `defaults` (Python's rule).
  FusedSGDOptions merge_options(const FusedSGDOptions& group,
                                const FusedSGDOptions& defaults) const override;
  /// One group's update: ATen's fused kernel, or amp's step engine for low-precision parameters.
  void step_group(size_t group_index, const FusedSGDOptions& options, const detail::GroupWork& work,
                  const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) override;
  /// A checkpoint's state entry checked against the parameter and moved to its device.
  std::unique_ptr<FusedSGDParamState> loaded_state(const at::Tensor& param,
                                                   const FusedSGDParamState& saved,
                                                   const FusedSGDOptions& options,
                                                   const std::string& where) const override;
};

}  // namespace amp::optim
