// amp::optim: Adam, AdamW and SGD for LibTorch over ATen's fused kernels, on one base that
// implements GradScaler's scaling protocol (amp/scaler_hooks.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <amp/export.h>
#include <amp/scaler_hooks.h>

namespace amp::optim {

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
  /// Low-precision parameters (bfloat16/float16; others are updated as usual): keep an fp32 copy
  /// of each in the optimizer state, step on it, and write the rounded result to the parameter
  /// (Apex O2, Megatron). Checkpoints hold the copy under "master_weight".
  TORCH_ARG(bool, master_weights) = false;
  /// Low-precision parameters: add each update through a compensation buffer in the parameter's
  /// dtype ("kahan_comp"), so updates smaller than the parameter's rounding step still land.
  TORCH_ARG(bool, kahan_summation) = false;
  /// bfloat16 parameters: round each updated value up or down at random, with probability by
  /// distance (unbiased). The bits come from rounding_seed, the parameter's position in the
  /// optimizer and its step count, so a run and its resume draw the same bits.
  TORCH_ARG(bool, stochastic_rounding) = false;
  /// Low-precision parameters: the dtype of the moment/momentum buffers (float32, bfloat16 or
  /// float16). Unset: float32, so that no update of the state is lost either (in bfloat16,
  /// Adam's second moment stops moving once its increment is below half a rounding step).
  /// bfloat16 saves 4 bytes per parameter (Adam) at that cost.
  TORCH_ARG(std::optional<c10::ScalarType>, state_dtype) = std::nullopt;
  /// The seed of stochastic_rounding's bits.
  TORCH_ARG(int64_t, rounding_seed) = 0;

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
  /// See FusedAdamOptions::master_weights (and the four options after it).
  TORCH_ARG(bool, master_weights) = false;
  /// See FusedAdamOptions::kahan_summation.
  TORCH_ARG(bool, kahan_summation) = false;
  /// See FusedAdamOptions::stochastic_rounding.
  TORCH_ARG(bool, stochastic_rounding) = false;
  /// See FusedAdamOptions::state_dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, state_dtype) = std::nullopt;
  /// See FusedAdamOptions::rounding_seed.
  TORCH_ARG(int64_t, rounding_seed) = 0;

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
  /// See FusedAdamOptions::master_weights (and the four options after it).
  TORCH_ARG(bool, master_weights) = false;
  /// See FusedAdamOptions::kahan_summation.
  TORCH_ARG(bool, kahan_summation) = false;
  /// See FusedAdamOptions::stochastic_rounding.
  TORCH_ARG(bool, stochastic_rounding) = false;
  /// See FusedAdamOptions::state_dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, state_dtype) = std::nullopt;
  /// See FusedAdamOptions::rounding_seed.
  TORCH_ARG(int64_t, rounding_seed) = 0;

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

/// Per-parameter state of FusedAdam and FusedAdamW. `step` is a 0-dim float32 tensor on the
/// parameter's device (as in Python's fused Adam), so a skipped step is rolled back on the device.
/// Saved in LibTorch's Adam/AdamW layout, with the step count as an integer.
struct AMP_EXPORT FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  /// Steps taken so far: a 0-dim float32 tensor on the parameter's device.
  TORCH_ARG(at::Tensor, step);
  /// First moment estimate, shaped like the parameter, typed like it (or as state_dtype).
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

/// Per-parameter state of FusedSGD: the momentum buffer (undefined without momentum), in
/// LibTorch's SGD layout.
struct AMP_EXPORT FusedSGDParamState
    : public torch::optim::OptimizerCloneableParamState<FusedSGDParamState> {
  /// The momentum buffer, shaped like the parameter, typed like it (or as state_dtype).
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
struct GroupWork;
struct LowPrecisionPlan;
class ParamPositions;

/// What every amp fused optimizer shares, so that a new one only states its arithmetic: param
/// groups with LibTorch's option merging, the checks on parameters and gradients, the step
/// preamble (closure, no-grad, the scale and inf/NaN flag GradScaler handed over, moved once to
/// each group's device), capturable learning rates, and checkpoints in LibTorch's layout read
/// all or nothing. A fused optimizer derives from it with its options and per-parameter state
/// types, calls add_param_groups() from its constructor and defines the four hooks.
template <typename Options, typename ParamState>
class AMP_EXPORT FusedOptimizer : public torch::optim::Optimizer, public SupportsAmpScaling {
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
  /// Adds a param group (progressive unfreezing, a backbone with a lower lr) as the constructor
  /// adds its groups: the group's options, where set, override the defaults field by field, and
  /// the options and parameters are checked. A parameter listed twice in the group is kept once;
  /// one already in another group is refused. Throws c10::Error (a sentence naming the group) and
  /// adds nothing when a check fails. Call it on the fused optimizer itself: LibTorch's
  /// Optimizer::add_param_group is not virtual, and reached through a torch::optim::Optimizer&
  /// it replaces the group's options with the defaults; the next step() then refuses that group.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

 protected:
  /// `name` is the optimizer's class name, as error messages print it.
  FusedOptimizer(const char* name, const Options& defaults);
  /// Merges each group's options with the defaults (LibTorch's rule), checks them and the
  /// parameters (each parameter kept once per group, refused in two groups), and adds the groups,
  /// all or none. Called from the derived constructor, where the hooks are the derived class's.
  void add_param_groups(std::vector<torch::optim::OptimizerParamGroup> groups);
  /// Capturable mode: group `group_index`'s lr as a 0-dim float32 tensor on `device`, created
  /// once and then updated in place (a CUDA graph keeps its address).
  const at::Tensor& lr_tensor(size_t group_index, double lr, const c10::Device& device);
  /// The class name given to the constructor.
  const char* name() const { return name_; }

  /// Hook: throws c10::Error, a sentence starting with `where`, for an option out of range.
  virtual void check_options(const Options& options, const std::string& where) const = 0;
  /// Hook: `group`'s options with every field left at its constructor default taken from
  /// `defaults`.
  virtual Options merge_options(const Options& group, const Options& defaults) const = 0;
  /// Hook: updates group `group_index` (its parameters with gradients, checked and bucketed by
  /// dtype in `work`) with the handed-over scale and flag on the group's device (nullopt when no
  /// scaler is involved). State lives in `state_`, keyed by the parameter's TensorImpl.
  virtual void step_group(size_t group_index, const Options& options, const GroupWork& work,
                          const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf) = 0;
  /// Hook: a saved state entry checked against `param` (throws a sentence starting with
  /// `where`) and copied to the parameter's device, in the dtypes `options` (the loaded group's)
  /// give its state.
  virtual std::unique_ptr<ParamState> loaded_state(const at::Tensor& param, const ParamState& saved,
                                                   const Options& options,
                                                   const std::string& where) const = 0;

 private:
  const Options& checked_options(size_t group_index) const;

  const char* name_;
  // How many of param_groups_ were added (and their options merged) by this class: a group
  // beyond them came through LibTorch's non-virtual Optimizer::add_param_group.
  size_t adopted_groups_ = 0;
  // Capturable mode: each group's learning rate in a device tensor, refreshed when it changes.
  std::vector<std::pair<double, at::Tensor>> lr_tensors_;
};

// Instantiated once, in the library (src/optim/<optimizer>.cpp).
extern template class FusedOptimizer<FusedAdamOptions, FusedAdamParamState>;
extern template class FusedOptimizer<FusedAdamWOptions, FusedAdamParamState>;
extern template class FusedOptimizer<FusedSGDOptions, FusedSGDParamState>;
}  // namespace detail

namespace detail {
/// Adam's step, checks and checkpoint state for FusedAdam (L2 weight decay) and FusedAdamW
/// (decoupled weight decay), over each one's options type.
template <typename Options>
class AMP_EXPORT FusedAdamFamily : public FusedOptimizer<Options, FusedAdamParamState> {
 protected:
  using FusedOptimizer<Options, FusedAdamParamState>::FusedOptimizer;
  /// The options' range checks (the base calls them at construction, each step and load).
  void check_options(const Options& options, const std::string& where) const override;
  /// LibTorch's rule for a group's options: fields left at their default take `defaults`.
  Options merge_options(const Options& group, const Options& defaults) const override;
  /// One group's update through ATen's fused kernel.
  void step_group(size_t group_index, const Options& options, const GroupWork& work,
                  const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) override;
  /// A checkpoint's state entry checked against the parameter and moved to its device.
  std::unique_ptr<FusedAdamParamState> loaded_state(const at::Tensor& param,
                                                    const FusedAdamParamState& saved,
                                                    const Options& options,
                                                    const std::string& where) const override;
};

extern template class FusedAdamFamily<FusedAdamOptions>;
extern template class FusedAdamFamily<FusedAdamWOptions>;
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
class AMP_EXPORT FusedAdam : public detail::FusedAdamFamily<FusedAdamOptions> {
 public:
  /// Param groups whose options, where set, override `defaults` field by field.
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults = {});
  /// One param group holding `params`.
  explicit FusedAdam(std::vector<at::Tensor> params, FusedAdamOptions defaults = {});
};

/// AdamW (decoupled weight decay) over ATen's fused kernel (`at::_fused_adamw_`); everything else
/// as FusedAdam. Equals Python's `torch.optim.AdamW(fused=True)` bit for bit.
class AMP_EXPORT FusedAdamW : public detail::FusedAdamFamily<FusedAdamWOptions> {
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
class AMP_EXPORT FusedSGD : public detail::FusedOptimizer<FusedSGDOptions, FusedSGDParamState> {
 public:
  /// Param groups whose options, where set, override `defaults` field by field.
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    FusedSGDOptions defaults);
  /// One param group holding `params`.
  explicit FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults);

 protected:
  /// The options' range checks (the base calls them at construction, each step and load).
  void check_options(const FusedSGDOptions& options, const std::string& where) const override;
  /// LibTorch's rule for a group's options: fields left at their default take `defaults`.
  FusedSGDOptions merge_options(const FusedSGDOptions& group,
                                const FusedSGDOptions& defaults) const override;
  /// One group's update through ATen's fused kernel.
  void step_group(size_t group_index, const FusedSGDOptions& options, const detail::GroupWork& work,
                  const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) override;
  /// One dtype bucket of bfloat16/float16 parameters under the low-precision options.
  void step_low_precision(size_t group_index, const FusedSGDOptions& options,
                          const detail::LowPrecisionPlan& plan,
                          const std::vector<at::Tensor>& params,
                          const detail::ParamPositions& positions,
                          const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf);
  /// A checkpoint's state entry checked against the parameter and moved to its device.
  std::unique_ptr<FusedSGDParamState> loaded_state(const at::Tensor& param,
                                                   const FusedSGDParamState& saved,
                                                   const FusedSGDOptions& options,
                                                   const std::string& where) const override;
};

}  // namespace amp::optim
