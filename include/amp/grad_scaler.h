// amp::GradScaler: dynamic loss scaling with torch.amp.GradScaler's semantics, plus opt-in
// extensions.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <amp/detail/concurrent_use.h>
#include <amp/export.h>
#include <amp/scaler_hooks.h>

namespace amp {

/// What GradScaler::step does when gradients overflow while the scale already sits at min_scale
/// (an extension; only meaningful with GradScalerOptions::min_scale > 0).
enum class MinScalePolicy {
  /// Keep skipping steps and keep the scale at min_scale (Megatron-LM's behaviour).
  kSkip,
  /// Throw a c10::Error from step() that says what to try (DeepSpeed's raise_error_at_min_scale).
  /// Deciding to throw is a host decision: one host read per step, with fused optimizers too
  /// (merged with the read a non-fused step makes anyway), so a fused step inside a CUDA graph
  /// capture is refused with kThrow; kSkip needs no read.
  kThrow,
};

/// Options of a GradScaler, with chained setters (`GradScalerOptions().init_scale(1024.0)`).
/// The first five equal torch.amp.GradScaler's arguments and defaults. The rest are extensions
/// that are off by default, so a default scaler behaves bit for bit like Python's.
/// Everything is validated when a GradScaler is constructed (only when enabled, as in Python).
/// A GradScaler keeps its options as its configuration state: setters and loads write into them,
/// so GradScaler::options() always holds the values in use.
struct AMP_EXPORT GradScalerOptions {
  /// Scale created by the first scale() call; finite and > 0. load_state_dict sets it to the
  /// loaded scale, as Python does, since a scaler that has not scaled yet starts from it.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Factor applied after growth_interval consecutive clean steps; > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Factor applied after an overflowing step; in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Number of consecutive clean steps before the scale grows; >= 1.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// false makes every method a pass-through (step() just calls optimizer.step()).
  TORCH_ARG(bool, enabled) = true;

  /// Extension (Megatron-LM): back off only after this many overflowing steps; >= 1. The
  /// allowance refills after growth_interval consecutive clean steps. 1 is torch.amp's rule.
  TORCH_ARG(int64_t, hysteresis) = 1;
  /// Extension (DeepSpeed's consecutive_hysteresis): refill the hysteresis allowance after every
  /// clean step instead of after growth_interval clean steps.
  TORCH_ARG(bool, consecutive_hysteresis) = false;
  /// Extension: the scale never backs off below this value; >= 0 and finite. 0 means no floor.
  TORCH_ARG(double, min_scale) = 0.0;
  /// Extension: the scale never grows above this value; > 0 (may be infinity, meaning no cap).
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Extension: what step() does when gradients overflow at min_scale.
  TORCH_ARG(MinScalePolicy, at_min_scale) = MinScalePolicy::kSkip;
  /// Extension: count steps taken, steps skipped and consecutive skips in device tensors.
  TORCH_ARG(bool, track_counters) = false;

  /// Extension (several processes): combines the inf/NaN flag across processes before every
  /// skip decision and scale update, so that all ranks skip together and keep equal scales.
  /// Make one with amp::distributed::found_inf_sync(process_group) (amp/distributed.h). Null
  /// (the default) means one process. Not part of the saved state.
  TORCH_ARG(std::shared_ptr<FoundInfSync>, found_inf_sync) = nullptr;
};

/// Where an optimizer is in the current iteration (Python's OptState): unscale_ moves it from
/// kReady to kUnscaled, step to kStepped, update() back to kReady.
enum class OptimizerStage {
  /// Nothing done yet in this iteration.
  kReady,
  /// Gradients unscaled (or checked, for optimizers that unscale themselves); flags recorded.
  kUnscaled,
  /// step() was called.
  kStepped,
};

/// Whether GradScaler::step updated the parameters, and where that was decided.
enum class StepOutcome {
  /// optimizer.step() was called: no inf/NaN was found (or the scaler is disabled).
  kTaken,
  /// optimizer.step() was not called: a gradient held an inf/NaN.
  kSkipped,
  /// The optimizer supports scaling (amp::optim::SupportsAmpScaling): step() was called with the
  /// flag and the optimizer took or skipped the update on the device. The host does not know
  /// which without reading StepResult::found_inf.
  kDecidedOnDevice,
};

/// What GradScaler::step did.
struct AMP_EXPORT StepResult {
  /// Taken or skipped (decided on the host), or decided on the device by a fused optimizer.
  StepOutcome outcome = StepOutcome::kTaken;
  /// The inf/NaN flag the decision used: a 0-dim float32 tensor on the scale's device, 1 when
  /// the update was skipped and 0 when it was applied; undefined when the scaler is disabled.
  /// Reading it on the host (`found_inf.item<float>()`) is a device sync.
  at::Tensor found_inf;
  /// What optimizer.step() returned (the closure's loss); undefined when skipped or no loss.
  at::Tensor loss;

  /// Whether the parameters were updated. kDecidedOnDevice reads found_inf (one host sync);
  /// otherwise no sync.
  bool read_taken() const {
    if (outcome == StepOutcome::kDecidedOnDevice) return found_inf.item<float>() == 0.0f;
    return outcome == StepOutcome::kTaken;
  }
  /// `if (scaler.step(opt))`: true when taken. Throws for kDecidedOnDevice rather than hide a
  /// sync in a conversion: call read_taken() when the answer is worth a sync, or keep
  /// found_inf on the device.
  explicit operator bool() const {
    TORCH_CHECK(outcome != StepOutcome::kDecidedOnDevice,
                "StepResult: this step was taken or skipped on the device by an optimizer that "
                "supports scaling, so the host does not know which; call read_taken() (one sync) "
                "or use the found_inf tensor.");
    return outcome == StepOutcome::kTaken;
  }
};

/// The scale, growth tracker and extension counters, read on demand (each read is one sync).
struct AMP_EXPORT GradScalerCounters {
  /// Iterations whose update() saw no inf/NaN (optimizer steps were taken).
  int64_t steps_taken = 0;
  /// Iterations whose update() saw an inf/NaN (optimizer steps were skipped).
  int64_t steps_skipped = 0;
  /// Skipped iterations since the last clean one.
  int64_t consecutive_skips = 0;
};

/// Dynamic loss scaling for mixed-precision training, with the semantics of Python's
/// torch.amp.GradScaler (same state machine, same errors, same update rule, same state_dict).
///
/// Usage per iteration: `scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update();`
/// optionally with `scaler.unscale_(optimizer)` before step() to inspect or clip gradients.
/// The scale lives in a 0-dim float32 tensor on the device of the first tensor passed to scale().
/// unscale_() and update() never synchronise. step() reads the inf/NaN flag on the host once (to
/// decide whether to call optimizer.step()), except for an optimizer that supports scaling
/// (amp::optim::FusedAdam/FusedAdamW/FusedSGD, or any amp::optim::SupportsAmpScaling): that one
/// gets the scale and the flag as device tensors and decides on the device, so a whole step
/// (scale, backward, step, update) runs without a host sync.
///
/// Threads: a GradScaler is not thread-safe. Calls from different threads must not overlap (one
/// scaler per training thread, or one mutex around every call, const ones included). A call that
/// starts while another thread is inside a method of the same scaler throws c10::Error naming
/// both methods, instead of corrupting the scaler; the scaler is unchanged by the refused call.
class AMP_EXPORT GradScaler {
 public:
  /// A scaler for device type `device` ("cuda" by default, as in Python). A CUDA scaler created
  /// while CUDA is unavailable warns and disables itself (options().enabled() is then false).
  /// amp's kernels cover CPU and CUDA; on other device types (XPU, MPS, HPU, PrivateUse1...) the
  /// scaler runs ATen's _amp_* kernels of that device, as Python's does (without the update
  /// extensions). Throws c10::Error when enabled and an option is out of range (the message names
  /// the option, its value and the fix), and for a CUDA scaler on a machine with CUDA when this
  /// amp was built without its CUDA kernels (AMP_WITH_CUDA=OFF).
  explicit GradScaler(c10::DeviceType device = c10::DeviceType::CUDA,
                      GradScalerOptions options = {});
  /// A CUDA scaler with the given options (Python's `GradScaler(init_scale=...)`).
  explicit GradScaler(GradScalerOptions options);

  /// Not copyable: a copy would share the device scale tensor with the original. Movable.
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  /// Moves the scaler, scale tensor and per-optimizer state included; `other` must not be used
  /// afterwards.
  GradScaler(GradScaler&&) = default;
  /// Move assignment, with the same meaning as the move constructor.
  GradScaler& operator=(GradScaler&&) = default;

  /// Returns `outputs * scale` (the scale moved to outputs' device); outputs unchanged when
  /// disabled. The first call creates the scale on outputs' device.
  at::Tensor scale(const at::Tensor& outputs);
  /// Scales each tensor of a list (Python's list/tuple form); returns a new list.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides the gradients of `optimizer`'s parameters by the scale in place and records whether
  /// any was inf/NaN (per device, on the device: no sync). Undefined grads are skipped.
  /// Throws when called twice for one optimizer before update(), after step(), before any
  /// scale(), or when a gradient is float16 ("Attempting to unscale FP16 gradients.").
  void unscale_(torch::optim::Optimizer& optimizer);

  /// unscale_ and gradient clipping in two reads and one write of the gradients: computes the
  /// L2 norm of the unscaled gradients of `optimizer`'s parameters (with the inf/NaN check), then
  /// writes each gradient once as grad / scale * min(max_norm / (norm + eps), 1). The same as
  /// `unscale_(optimizer)` followed by `torch::nn::utils::clip_grad_norm_(params, max_norm)`
  /// over the optimizer's parameters, to float32 rounding (the two multiplies are fused), in
  /// two passes instead of five. No host sync. When disabled it only clips.
  /// Args: max_norm: the largest norm to allow (finite, > 0); eps: added to the norm (>= 0).
  /// Returns: the total norm before clipping (0-dim float32 on the scale's device; inf/NaN when
  ///   a gradient overflowed, in which case step() will skip).
  /// Errors: those of unscale_, plus sparse gradients and invalid max_norm / eps.
  at::Tensor unscale_and_clip_(torch::optim::Optimizer& optimizer, double max_norm,
                               double eps = 1e-6);

  /// Unscales (unless unscale_ was called) and calls optimizer.step() only when no gradient was
  /// inf/NaN; returns StepOutcome::kTaken or kSkipped and the optimizer's return value. When
  /// enabled a closure is refused: the gradients were unscaled before the closure would
  /// recompute them, so the optimizer would see freshly scaled gradients. (Python refuses
  /// `closure=` given by keyword but passes a positional closure through to that broken
  /// outcome; C++ has one form, and it is refused.) When disabled the closure is passed to
  /// optimizer.step().
  ///
  /// An optimizer deriving from amp::optim::SupportsAmpScaling is handled as Python handles one
  /// with `_step_supports_amp_scaling`: unless unscale_ was called, its gradients are checked for
  /// inf/NaN without unscaling (check_inf_per_device); the optimizer gets the scale (none after
  /// unscale_; times a scale it already holds, as in Python) and the flag (the per-device flags
  /// combined by max, so it is exactly 0 or 1 as ATen's kernels expect; Python sums them, which
  /// skips nothing when two devices overflow); step() is called unconditionally and the result
  /// is StepOutcome::kDecidedOnDevice. No host sync, except with MinScalePolicy::kThrow, which
  /// reads the flag after the step to decide whether to throw (and so is refused, before the
  /// step, while the current CUDA stream is being captured into a graph).
  ///
  /// Throws when step() was already called for this optimizer before update(), before any
  /// scale(), when the optimizer has no gradients ("No inf checks were recorded ..."; as in
  /// Python, an optimizer that supports scaling then steps over nothing instead, and update()
  /// refuses unless another optimizer recorded a check), and with MinScalePolicy::kThrow when
  /// gradients overflow at min_scale. A non-fused step syncs once (the flag, read together with
  /// the min_scale check under kThrow).
  StepResult step(torch::optim::Optimizer& optimizer,
                  torch::optim::Optimizer::LossClosure closure = nullptr);

  /// Updates the scale from the inf/NaN flags recorded by this iteration's unscale_/step calls
  /// (on the device, no sync) and resets the per-optimizer state for the next iteration.
  void update();
  /// Sets the scale to `new_scale` (the growth tracker is unchanged) and resets the per-optimizer
  /// state. Throws, changing nothing, unless `new_scale` is finite, > 0, storable as a normal
  /// float32 value (the scale tensor's dtype) and, as float32, within [min_scale, max_scale].
  void update(double new_scale);
  /// Copies the scale from a 1-element floating-point tensor on the scaler's device type that
  /// does not require grad (else Python's message). Its value is read to be checked as
  /// update(double) checks it: one host sync for a device tensor (Python copies without looking).
  void update(const at::Tensor& new_scale);

  /// The current scale (a sync); init_scale before the first scale(); 1.0 when disabled.
  double get_scale() const;
  /// The growth tracker: consecutive clean steps since the last growth or back-off (a sync).
  int64_t get_growth_tracker() const;
  /// The 0-dim float32 scale tensor on its device (no sync); undefined before the first scale().
  const at::Tensor& scale_tensor() const { return scale_; }
  /// The 0-dim int32 growth tracker tensor (no sync); undefined before the first scale().
  const at::Tensor& growth_tracker_tensor() const { return growth_tracker_; }

  /// Growth factor used by update(); the same as options().growth_factor().
  double get_growth_factor() const { return options_.growth_factor(); }
  /// Sets the growth factor used by the next update() calls (and options().growth_factor()).
  /// Errors: c10::Error when `new_factor` is not > 1 (the constructor's check).
  void set_growth_factor(double new_factor);
  /// Back-off factor used by update(); the same as options().backoff_factor().
  double get_backoff_factor() const { return options_.backoff_factor(); }
  /// Sets the back-off factor used by the next update() calls (and options().backoff_factor()).
  /// Errors: c10::Error when `new_factor` is not in (0, 1) (the constructor's check).
  void set_backoff_factor(double new_factor);
  /// Growth interval used by update(); the same as options().growth_interval().
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  /// Sets the growth interval used by the next update() calls (and options().growth_interval()).
  /// As in torch.amp, growth happens when the tracker reaches the interval exactly, so an
  /// interval at or below the current tracker stops growth until an overflow resets the tracker;
  /// then it warns (reading the tracker: one sync). The tracker saturates at 2^31-1, so an
  /// interval of 2^31 or more never grows.
  /// Errors: c10::Error when `new_interval` is < 1 (the constructor's check).
  void set_growth_interval(int64_t new_interval);

  /// Whether scaling is on (false when constructed disabled or CUDA was unavailable).
  bool is_enabled() const { return options_.enabled(); }
  /// The device type given at construction.
  c10::DeviceType device_type() const { return device_type_; }
  /// The options in use: those given at construction as changed since by the setters and by
  /// load_state_dict (which also sets init_scale to the loaded scale, as Python does).
  const GradScalerOptions& options() const { return options_; }

  /// Where `optimizer` is in the current iteration (kReady for an optimizer not seen since the
  /// last update()). For optimizer subclasses and fused optimizers that cooperate with the scaler.
  OptimizerStage stage(const torch::optim::Optimizer& optimizer) const;
  /// The inf/NaN flags recorded for `optimizer` in this iteration by unscale_, step or
  /// check_inf_per_device: one 0-dim float32 device tensor per device of its gradients (1.0 when
  /// that device's gradients held an inf/NaN); empty before any of them. No sync. Python's
  /// GradScaler._found_inf_per_device.
  std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device(
      const torch::optim::Optimizer& optimizer) const;

  /// Extension counters (requires track_counters(true)); one sync to read them. Throws when
  /// counters are not tracked.
  GradScalerCounters counters() const;
  /// The remaining hysteresis allowance (overflowing steps left before a back-off; a sync).
  int64_t hysteresis_remaining() const;

  /// Optimizers that unscale inside their own (fused) step: checks the gradients for inf/NaN
  /// without unscaling (float16 allowed; sparse float16 grads are coalesced first) and records
  /// the flags as unscale_ would. Returns the flags per device (device tensors, no sync).
  std::vector<std::pair<c10::Device, at::Tensor>> check_inf_per_device(
      torch::optim::Optimizer& optimizer);

  /// The state in Python's format: exactly Python's five keys {"scale": float, "growth_factor":
  /// float, "backoff_factor": float, "growth_interval": int, "_growth_tracker": int}; a scaler
  /// using an extension (hysteresis, bounds, counters) adds keys prefixed "_amp_", which Python's
  /// load_state_dict ignores. Empty when disabled. Reads the scale (a sync).
  c10::Dict<std::string, c10::IValue> state_dict() const;
  /// Loads a state dict from Python or from state_dict(); a no-op when disabled. Ints are accepted
  /// where floats are stored, as Python writes them (`GradScaler(init_scale=1024)` saves an int
  /// scale before its first scale()). The loaded values become the options in use (init_scale =
  /// the loaded scale); `_amp_*` keys that are absent keep this scaler's extension options. All
  /// or nothing: every value is checked before any is written, and an empty dict, a missing key,
  /// a wrong type, a scale that is not a finite positive normal float32 value or lies outside
  /// [min_scale, max_scale], an invalid factor or interval, a tracker outside [0, 2^31), a
  /// hysteresis allowance outside [0, hysteresis], negative counters or more consecutive skips
  /// than skipped steps, or a newer format version throws and leaves the scaler unchanged.
  void load_state_dict(const c10::Dict<std::string, c10::IValue>& state_dict);
  /// Same, for a generic dict as returned by torch::pickle_load (keys must be strings).
  void load_state_dict(const c10::impl::GenericDict& state_dict);
  /// Same, for an IValue holding such a dict, as amp::load_pickled and amp::dict_entry give it
  /// (`scaler.load_state_dict(amp::dict_entry(checkpoint, "scaler"))`): the form amp's other
  /// load_state_dict functions take. Errors: c10::Error naming what the IValue holds when it is
  /// not a dict.
  void load_state_dict(const c10::IValue& state_dict);
  /// Same as the std::string overload (a literal path would otherwise also convert to an IValue).
  void load_state_dict(const char* path);

  /// Writes state_dict() to `path` in torch.save's format: Python reads it with
  /// `torch.load(path, weights_only=True)` and GradScaler.load_state_dict.
  void save_state_dict(const std::string& path) const;
  /// Reads a file written by save_state_dict or by Python's `torch.save(scaler.state_dict(),
  /// path)`; a missing, corrupt or truncated file throws and leaves the scaler unchanged.
  void load_state_dict(const std::string& path);

  /// Writes the state into a LibTorch archive (one key per entry, prefixed "grad_scaler.").
  /// Throws in the middle of an iteration (after unscale_/step, before update), as Python's
  /// pickling of a GradScaler does.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads the state written by save(); validation as in load_state_dict.
  void load(torch::serialize::InputArchive& archive);

 private:
  struct OptimizerState {
    OptimizerStage stage = OptimizerStage::kReady;
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
    // Whether found_inf_per_device holds the flag combined across ranks (found_inf_sync).
    bool synced = false;
  };

  void lazy_init(const c10::Device& device);
  void check_initialized(const char* funcname) const;
  // unscale_'s and unscale_and_clip_'s stage checks; returns the optimizer's state to record in.
  OptimizerState& begin_unscale(const torch::optim::Optimizer& optimizer);
  // 1 / scale, formed in double and rounded once to float32, as Python does.
  at::Tensor inv_scale() const;
  // The defined gradients of `optimizer` grouped by device; sparse ones are refused when
  // dense_only_caller names the calling method.
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> gradients_by_device(
      torch::optim::Optimizer& optimizer, bool allow_fp16, const char* dense_only_caller);
  std::vector<std::pair<c10::Device, at::Tensor>> unscale_grads(torch::optim::Optimizer& optimizer,
                                                                const at::Tensor& inv_scale,
                                                                const at::Tensor& found_inf,
                                                                bool allow_fp16);
  // step() for an optimizer that unscales and skips on the device.
  StepResult step_on_device(torch::optim::Optimizer& optimizer, OptimizerState& state,
                            optim::SupportsAmpScaling& scaling);
  // This step's flag for `state`: the per-device flags on the scale's device, combined by max,
  // and across ranks when options().found_inf_sync() is set (then recorded back into `state`).
  at::Tensor combined_found_inf(OptimizerState& state) const;
  // Whether `found` overflowed and, under MinScalePolicy::kThrow, whether the scale is stuck (at
  // min_scale with no hysteresis allowance left), read in one host copy: a sync.
  struct OverflowRead {
    bool overflow;
    bool stuck_at_min_scale;
  };
  OverflowRead read_overflow(const at::Tensor& found) const;
  // Whether step() throws on an overflow at min_scale (MinScalePolicy::kThrow, min_scale > 0).
  bool throws_at_min_scale() const;
  // Whether any extension of the update (hysteresis, bounds) or the counters is on.
  bool uses_extensions() const;

  c10::DeviceType device_type_;
  // The configuration in use (see options()).
  GradScalerOptions options_;
  // State that lazy_init turns into tensors; load_state_dict sets it before lazy init.
  int64_t init_growth_tracker_ = 0;
  int64_t init_hysteresis_remaining_;
  GradScalerCounters init_counters_;

  at::Tensor scale_;                 // 0-dim float32
  at::Tensor growth_tracker_;        // 0-dim int32
  at::Tensor hysteresis_remaining_;  // 0-dim int32, only with hysteresis > 1
  at::Tensor counters_;              // int64 [taken, skipped, consecutive], only with counters
  // Keyed by optimizer identity, as Python keys by id(optimizer).
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_states_;
  // Every public method that reads or writes the state above holds a scope of it.
  mutable detail::ConcurrentUseDetector use_;
};

/// Writes `scaler` into `archive` with GradScaler::save, so that `torch::save(scaler, path)`
/// works and a scaler can share a checkpoint archive with a model and an optimizer.
/// Returns: `archive`.
/// Errors: those of GradScaler::save.
AMP_EXPORT torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                                       const GradScaler& scaler);
/// Reads `scaler` from `archive` with GradScaler::load, so that `torch::load(scaler, path)` works.
/// Returns: `archive`.
/// Errors: those of GradScaler::load.
AMP_EXPORT torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                                      GradScaler& scaler);

}  // namespace amp
