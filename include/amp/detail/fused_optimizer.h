// amp::optim::detail::FusedOptimizer: the base every amp optimizer derives from (param groups,
// checks, the step preamble GradScaler's protocol needs, checkpoints). Included by the
// optimizers' public headers; not an API of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <amp/export.h>
#include <amp/scaler_hooks.h>

namespace amp::optim {

/// An optimizer whose per-parameter streams of random bits (stochastic rounding) follow each
/// parameter's position in the optimizer (groups in order, parameters in order). A wrapper that
/// gives it part of a larger optimizer's parameters (amp::distributed::ZeroRedundancyOptimizer)
/// sets their positions in the whole, so that each parameter draws the bits it would draw there.
class AMP_EXPORT PositionedParams {
 public:
  virtual ~PositionedParams() = default;
  /// Each listed parameter's position, by its TensorImpl; a parameter not listed keeps its own.
  void set_param_positions(std::unordered_map<const void*, uint64_t> positions) {
    param_positions_ = std::move(positions);
  }
  const std::unordered_map<const void*, uint64_t>& param_positions() const {
    return param_positions_;
  }

 private:
  std::unordered_map<const void*, uint64_t> param_positions_;
};

}  // namespace amp::optim

namespace amp::optim::detail {
struct GroupWork;

/// What every amp optimizer shares, so that a new one only states its arithmetic: param groups
/// with LibTorch's option merging, the checks on parameters and gradients, the step preamble
/// (closure, no-grad, the scale and inf/NaN flag GradScaler handed over, moved once to each
/// group's device), capturable learning rates, and checkpoints in LibTorch's layout read all or
/// nothing. An optimizer derives from it with its options and per-parameter state types, calls
/// add_param_groups() from its constructor and defines the four hooks; the source that defines
/// it instantiates the base (src/optim/fused_optimizer.h has the definitions).
template <typename Options, typename ParamState>
class AMP_EXPORT FusedOptimizer : public torch::optim::Optimizer,
                                  public SupportsAmpScaling,
                                  public PositionedParams {
 public:
  /// One fused kernel call per param group and parameter dtype; runs the closure first (under
  /// grad mode) when given and returns its loss. Unscales by grad_scale() and skips on
  /// found_inf() when a GradScaler set them. Moves the version counter of every parameter it
  /// steps (skipped or not), as an in-place update does: a graph that saved a parameter before
  /// the step refuses to backward through it (Python's fused kernels leave the counter alone).
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
  /// adds its groups: each option the group's options set overrides the defaults, and
  /// the options and parameters are checked. A parameter listed twice in the group is kept once;
  /// one already in another group is refused. Throws c10::Error (a sentence naming the group) and
  /// adds nothing when a check fails. Call it on the fused optimizer itself: LibTorch's
  /// Optimizer::add_param_group is not virtual, and reached through a torch::optim::Optimizer&
  /// it replaces the group's options with the defaults; the next step() then refuses that group.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
  /// The tensors the next step() reads gradients from, one per parameter with a gradient: the
  /// parameter itself, or, for a float16 parameter whose gradient GradScaler::unscale_ unscaled
  /// into float32 (master_weights), its float32 master copy, whose grad() is that gradient.
  /// Clip these after unscale_, as Apex's amp.master_params(optimizer):
  /// `torch::nn::utils::clip_grad_norm_(optimizer.master_params(), max_norm)`.
  std::vector<at::Tensor> master_params();
  /// True for a float16 parameter of a group with master_weights (and float32 moments): its
  /// gradient is unscaled into a float32 master gradient (see SupportsAmpScaling).
  bool keeps_float32_gradient(const at::Tensor& param) const override;
  /// The float32 master gradient of such a parameter, attached to its master copy (created here
  /// when the first step has not yet made it) as grad(); the next step() updates the master copy
  /// with it in float32, writes the rounded result to the parameter and lets the gradient go.
  /// It belongs to the float16 gradient of this moment: once that gradient is replaced or changed
  /// in place (zero_grad, another backward), it is stale, and neither step() nor master_params()
  /// uses it.
  at::Tensor float32_gradient(const at::Tensor& param) override;

 protected:
  /// `name` is the optimizer's class name, as error messages print it.
  FusedOptimizer(const char* name, const Options& defaults);
  /// Merges each group's options with the defaults (Python's rule: what the group set, the rest
  /// from the defaults), checks them and the
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
  /// Hook: `group`'s options with every field the group did not set (ExplicitOptions::is_set)
  /// taken from `defaults`.
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

  // Whether `param` has a float32 master gradient made from its float16 gradient as it is now.
  bool has_current_float32_gradient(const at::Tensor& param) const;

  const char* name_;
  // The float16 gradient (and its version) each float32 master gradient was made from, by
  // parameter.
  std::unordered_map<const c10::TensorImpl*,
                     std::pair<c10::weak_intrusive_ptr<c10::TensorImpl>, uint32_t>>
      float32_gradient_sources_;
  // Whether float32_gradient() ever ran (until then step() looks for no stale ones).
  bool gave_float32_gradients_ = false;
  // How many of param_groups_ were added (and their options merged) by this class: a group
  // beyond them came through LibTorch's non-virtual Optimizer::add_param_group.
  size_t adopted_groups_ = 0;
  // Capturable mode: each group's learning rate in a device tensor, refreshed when it changes.
  std::vector<std::pair<double, at::Tensor>> lr_tensors_;
};

}  // namespace amp::optim::detail
