// amp::GradScaler: torch.amp.GradScaler's state machine, scaling, unscaling, stepping and update.
#include <amp/detail/option_fields.h>
#include <amp/grad_scaler.h>

#include <algorithm>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <amp/info.h>
#include <amp/ops.h>
#include <amp/scaler_hooks.h>

#include "scaler/stream_capture.h"
#include "scaler/validate.h"

namespace amp {

namespace {

// Copies of one tensor per device, made on first request (Python's _MultiDeviceReplicator).
class PerDeviceCopies {
 public:
  explicit PerDeviceCopies(at::Tensor master) : master_(std::move(master)) {}

  const at::Tensor& get(const c10::Device& device) {
    for (const auto& [dev, tensor] : copies_) {
      if (dev == device) return tensor;
    }
    copies_.emplace_back(device, master_.to(device, master_.scalar_type(), /*non_blocking=*/true,
                                            /*copy=*/true));
    return copies_.back().second;
  }

  std::vector<std::pair<c10::Device, at::Tensor>> take() { return std::move(copies_); }

 private:
  at::Tensor master_;
  std::vector<std::pair<c10::Device, at::Tensor>> copies_;
};

// update(new_scale)'s checks: a scale float32 holds as a normal value, within the bounds (outside
// them it would be saved into a state dict that load_state_dict refuses).
void check_new_scale(double new_scale, const GradScalerOptions& options) {
  detail::check_scale_value(new_scale, "GradScaler::update: new_scale", "new_scale",
                            "pass a positive scale such as 65536.0.");
  detail::check_scale_in_bounds(new_scale, options.min_scale(), options.max_scale(),
                                detail::ScaleHeld::kRounded, "GradScaler::update: new_scale",
                                "new_scale", "pass a scale within the scaler's bounds.");
}

// Whether any parameter of `optimizer` has a gradient.
bool has_gradients(const torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      if (param.grad().defined()) return true;
    }
  }
  return false;
}

}  // namespace

namespace detail {

ConcurrentUseDetector::Scope::Scope(ConcurrentUseDetector& detector, const char* method)
    : detector_(detector) {
  const std::thread::id self = std::this_thread::get_id();
  std::thread::id holder;  // no thread
  if (detector.owner_.compare_exchange_strong(holder, self, std::memory_order_acq_rel)) {
    owner_ = true;
    detector.method_.store(method, std::memory_order_relaxed);
    return;
  }
  if (holder == self) return;  // re-entered by the thread inside (a method calling another)
  const char* other = detector.method_.load(std::memory_order_relaxed);
  TORCH_CHECK(false, "GradScaler::", method, " was called while another thread is inside ",
              "GradScaler::", other ? other : "a method",
              " of the same scaler. A GradScaler is not thread-safe: call it from one thread at a "
              "time (one scaler per training thread, or one mutex around every call).");
}

ConcurrentUseDetector::Scope::~Scope() {
  if (owner_) detector_.owner_.store(std::thread::id(), std::memory_order_release);
}

}  // namespace detail

FoundInfSync::~FoundInfSync() = default;

GradScaler::GradScaler(GradScalerOptions options)
    : GradScaler(c10::DeviceType::CUDA, std::move(options)) {}

GradScaler::GradScaler(c10::DeviceType device, GradScalerOptions options)
    : device_type_(device),
      options_(std::move(options)),
      init_hysteresis_remaining_(options_.hysteresis()) {
  if (device_type_ == c10::DeviceType::CUDA && options_.enabled()) {
    if (!at::hasCUDA()) {
      TORCH_WARN("amp::GradScaler is enabled for CUDA, but CUDA is not available.  Disabling.");
      options_.enabled(false);
    } else {
      detail::check_cuda_kernels_built(built_with_cuda());
    }
  }
  // Before the local checks, and when disabled too: every rank must reach this collective, and a
  // scaler that disabled itself on one rank only is a difference worth refusing.
  if (options_.found_inf_sync())
    options_.found_inf_sync()->check_same_configuration(device_type_, options_);
  if (!options_.enabled()) return;
  detail::check_init_scale(options_.init_scale());
  detail::check_growth_factor(options_.growth_factor());
  detail::check_backoff_factor(options_.backoff_factor());
  detail::check_growth_interval(options_.growth_interval());
  detail::check_extension_options(options_.hysteresis(), options_.min_scale(),
                                  options_.max_scale());
  detail::check_scale_in_bounds(options_.init_scale(), options_.min_scale(), options_.max_scale(),
                                detail::ScaleHeld::kExactThenRounded, "The initial scale",
                                "init_scale", "choose an init_scale inside the bounds.");
}

bool GradScaler::uses_extensions() const {
  static const GradScalerOptions defaults;
  for (const detail::OptionField& field : detail::option_fields()) {
    if (field.saved_as_extension && field.get(options_) != field.get(defaults)) return true;
  }
  return false;
}

void GradScaler::lazy_init(const c10::Device& device) {
  scale_ =
      at::full({}, options_.init_scale(), at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ =
      at::full({}, init_growth_tracker_, at::TensorOptions().dtype(at::kInt).device(device));
  if (options_.hysteresis() > 1) {
    hysteresis_remaining_ = at::full({}, init_hysteresis_remaining_,
                                     at::TensorOptions().dtype(at::kInt).device(device));
  }
  if (options_.track_counters()) {
    // Filled on the device: a copy from host memory would make the first scale() a host sync.
    counters_ = at::empty({3}, at::TensorOptions().dtype(at::kLong).device(device));
    counters_.select(0, 0).fill_(init_counters_.steps_taken);
    counters_.select(0, 1).fill_(init_counters_.steps_skipped);
    counters_.select(0, 2).fill_(init_counters_.consecutive_skips);
  }
}

void GradScaler::check_initialized(const char* funcname) const {
  // Python's wording (two spaces between the sentences included).
  TORCH_CHECK(scale_.defined(), "Attempted ", funcname,
              " but _scale is None.  This may indicate your script did not use "
              "scaler.scale(loss or outputs) earlier in the iteration.");
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "scale");
  if (!options_.enabled()) return outputs;
  TORCH_CHECK(outputs.defined(),
              "outputs must be a Tensor or an iterable of Tensors. GradScaler::scale got an "
              "undefined tensor; pass the loss (or the outputs) to scale.");
  if (!scale_.defined()) lazy_init(outputs.device());
  return outputs * scale_.to(outputs.device(), scale_.scalar_type(), /*non_blocking=*/true);
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "scale");
  if (!options_.enabled()) return outputs;
  std::vector<at::Tensor> scaled;
  scaled.reserve(outputs.size());
  std::optional<PerDeviceCopies> copies;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& value = outputs[i];
    TORCH_CHECK(value.defined(),
                "outputs must be a Tensor or an iterable of Tensors. GradScaler::scale got an "
                "undefined tensor at index ",
                i, "; pass only defined tensors.");
    if (!copies) {
      if (!scale_.defined()) lazy_init(value.device());
      copies.emplace(scale_);
    }
    scaled.push_back(value * copies->get(value.device()));
  }
  return scaled;
}

std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> GradScaler::gradients_by_device(
    torch::optim::Optimizer& optimizer, bool allow_fp16, const char* dense_only_caller) {
  // Grouped by device in first-seen order, so each device's gradients, whatever their dtypes,
  // go through one call of the fused op (which takes mixed dtypes).
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> groups;
  at::NoGradGuard no_grad;
  // Each parameter once: LibTorch's Module::parameters() lists a module registered under two
  // names twice, and a gradient unscaled twice would be divided by scale^2 (and counted twice
  // in a clipping norm).
  std::unordered_set<const c10::TensorImpl*> seen;
  auto* scaling = dynamic_cast<optim::SupportsAmpScaling*>(&optimizer);
  // First every check, then the float32 master gradients: a refusal leaves the optimizer as it
  // was.
  std::vector<std::pair<at::Tensor, bool /*into float32*/>> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
      const bool half = param.grad().scalar_type() == at::kHalf;
      if (!allow_fp16 && half) {
        // An optimizer with float32 master copies takes the gradient unscaled into float32.
        TORCH_CHECK_VALUE(scaling != nullptr && param.grad().layout() == c10::kStrided &&
                              scaling->keeps_float32_gradient(param),
                          "Attempting to unscale FP16 gradients. (Python's sentence; amp unscales "
                          "float16 gradients into float32 master gradients, for an optimizer that "
                          "keeps float32 master weights: amp::optim's master_weights(true).)");
        params.emplace_back(param, true);
        continue;
      }
      if (param.grad().is_sparse()) {
        TORCH_CHECK(dense_only_caller == nullptr, "GradScaler::", dense_only_caller,
                    " does not support sparse gradients; use unscale_(optimizer) followed by "
                    "torch::nn::utils::clip_grad_norm_ for a model with sparse gradients.");
        // Duplicate indices of scaled fp16 values may overflow only once summed, so the check
        // has to see the coalesced values.
        if (half) param.mutable_grad() = param.grad().coalesce();
      }
      params.emplace_back(param, false);
    }
  }
  for (auto& [param, into_float32] : params) {
    at::Tensor grad;
    if (into_float32) {
      grad = scaling->float32_gradient(param);
      grad.copy_(param.grad());  // exact: every float16 value is a float32 value
    } else {
      grad = param.grad().is_sparse() ? param.grad()._values() : param.grad();
    }
    const c10::Device device = grad.device();
    auto entry = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& candidate) { return candidate.first == device; });
    if (entry == groups.end()) entry = groups.insert(groups.end(), {device, {}});
    entry->second.push_back(std::move(grad));
  }
  return groups;
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::unscale_grads(
    torch::optim::Optimizer& optimizer, const at::Tensor& inv_scale, const at::Tensor& found_inf,
    bool allow_fp16) {
  PerDeviceCopies per_device_inv_scale(inv_scale);
  PerDeviceCopies per_device_found_inf(found_inf);
  for (auto& [device, grads] : gradients_by_device(optimizer, allow_fp16, nullptr)) {
    // A reference into the cache: the seam writes the flag into that very tensor.
    at::Tensor found = per_device_found_inf.get(device);
    amp::non_finite_check_and_unscale_(grads, found, per_device_inv_scale.get(device));
  }
  return per_device_found_inf.take();
}

GradScaler::OptimizerState& GradScaler::begin_unscale(const torch::optim::Optimizer& optimizer) {
  check_initialized("unscale_");
  OptimizerState& state = per_optimizer_states_[&optimizer];
  TORCH_CHECK(state.stage != OptimizerStage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update().");
  TORCH_CHECK(state.stage != OptimizerStage::kStepped, "unscale_() is being called after step().");
  return state;
}

at::Tensor GradScaler::inv_scale() const {
  // In double, rounded once to float32, as Python does (fp32 division can be imprecise under
  // some compile options).
  return scale_.to(at::kDouble).reciprocal().to(at::kFloat);
}

at::Tensor GradScaler::unscale_and_clip_(torch::optim::Optimizer& optimizer, double max_norm,
                                         double eps) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "unscale_and_clip_");
  TORCH_CHECK(std::isfinite(max_norm) && max_norm > 0.0,
              "GradScaler::unscale_and_clip_: max_norm must be finite and > 0. Got max_norm=",
              max_norm, "; pass the largest gradient norm to allow, e.g. 1.0.");
  TORCH_CHECK(std::isfinite(eps) && eps >= 0.0,
              "GradScaler::unscale_and_clip_: eps must be finite and >= 0. Got eps=", eps,
              "; the default 1e-6 matches torch::nn::utils::clip_grad_norm_.");
  OptimizerState* state = options_.enabled() ? &begin_unscale(optimizer) : nullptr;

  auto groups =
      gradients_by_device(optimizer, /*allow_fp16=*/state == nullptr, "unscale_and_clip_");
  if (groups.empty()) {
    if (state != nullptr) state->stage = OptimizerStage::kUnscaled;
    return at::zeros({}, at::kFloat);
  }
  // A disabled scaler still clips (as unscale_ + clip_grad_norm_ would), with an inv_scale of 1.
  const at::Tensor inv =
      state != nullptr ? inv_scale() : at::ones({}, at::TensorOptions(groups.front().first));
  PerDeviceCopies per_device_inv_scale(inv);
  PerDeviceCopies per_device_found_inf(at::zeros({}, inv.options()));

  // First read: each device's norm of the unscaled gradients and its inf/NaN flag.
  const c10::Device home = inv.device();
  at::Tensor total_norm;
  for (auto& [device, grads] : groups) {
    at::Tensor found = per_device_found_inf.get(device);
    const at::Tensor norm =
        std::get<0>(amp::unscale_norm(grads, found, per_device_inv_scale.get(device))).to(home);
    total_norm = total_norm.defined() ? at::hypot(total_norm, norm) : norm;
  }
  // Second read and the only write: unscale and clip in one multiply.
  for (auto& [device, grads] : groups) {
    amp::clip_unscaled_(grads, per_device_inv_scale.get(device), total_norm.to(device), max_norm,
                        eps);
  }
  if (state != nullptr) {
    state->found_inf_per_device = per_device_found_inf.take();
    state->stage = OptimizerStage::kUnscaled;
  }
  return total_norm;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "unscale_");
  if (!options_.enabled()) return;
  OptimizerState& state = begin_unscale(optimizer);
  const at::Tensor found_inf = at::full({}, 0.0, scale_.options());
  state.found_inf_per_device = unscale_grads(optimizer, inv_scale(), found_inf, false);
  state.stage = OptimizerStage::kUnscaled;
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::check_inf_per_device(
    torch::optim::Optimizer& optimizer) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "check_inf_per_device");
  TORCH_CHECK(options_.enabled(),
              "GradScaler::check_inf_per_device needs an enabled scaler; this one is disabled.");
  check_initialized("_check_inf_per_device");
  const at::Tensor dummy_inv_scale = at::full({}, 1.0, scale_.options());
  const at::Tensor found_inf = at::full({}, 0.0, scale_.options());
  OptimizerState& state = per_optimizer_states_[&optimizer];
  state.found_inf_per_device = unscale_grads(optimizer, dummy_inv_scale, found_inf, true);
  return state.found_inf_per_device;
}

at::Tensor GradScaler::combined_found_inf(OptimizerState& state) const {
  // Max, not Python's sum: every flag is 0 or 1, and ATen's fused kernels skip only on exactly 1.
  at::Tensor found = state.found_inf_per_device.front().second.to(scale_.device(),
                                                                  /*non_blocking=*/true);
  for (size_t i = 1; i < state.found_inf_per_device.size(); ++i) {
    found = at::maximum(found, state.found_inf_per_device[i].second.to(scale_.device(),
                                                                       /*non_blocking=*/true));
  }
  if (const auto& sync = options_.found_inf_sync()) {
    // A copy: the per-device flags may be held by callers of check_inf_per_device. Max over
    // ranks (Python's ShardedGradScaler sums), so the flag stays exactly 0 or 1. The reduced flag
    // replaces the local ones, so that update() sees what every rank decided on.
    if (found.is_same(state.found_inf_per_device.front().second)) found = found.clone();
    sync->all_reduce_max_(found);
    state.found_inf_per_device = {{found.device(), found}};
    state.synced = true;
  }
  return found;
}

bool GradScaler::throws_at_min_scale() const {
  return options_.at_min_scale() == MinScalePolicy::kThrow && options_.min_scale() > 0.0;
}

GradScaler::OverflowRead GradScaler::read_overflow(const at::Tensor& found) const {
  if (!throws_at_min_scale()) {
    // HOST SYNC.
    return {found.item<float>() != 0.0f, false};
  }
  // An overflow now would back off below the floor: the scale is at min_scale and (with
  // hysteresis) this overflow spends the last unit of the allowance.
  at::Tensor stuck = scale_.le(options_.min_scale());
  if (hysteresis_remaining_.defined()) stuck = stuck.logical_and(hysteresis_remaining_.le(1));
  // HOST SYNC: both flags in one read, as the bits of one integer.
  const int bits = found.ne(0).to(at::kInt).mul(2).add(stuck.to(at::kInt)).item<int>();
  return {(bits & 2) != 0, (bits & 1) != 0};
}

namespace {

// MinScalePolicy::kThrow's refusal: an overflow the scale cannot back off from any more.
void throw_if_stuck(bool overflow, bool stuck_at_min_scale, double min_scale) {
  TORCH_CHECK(!(overflow && stuck_at_min_scale),
              "GradScaler: the gradients overflowed (inf/NaN) while the scale is already at "
              "min_scale=",
              min_scale,
              ", so the step was skipped and the scale cannot back off "
              "further. Try a lower min_scale, a lower learning rate, bf16 instead of fp16, or "
              "check the model and data for inf/NaN that scaling does not cause; "
              "MinScalePolicy::kSkip keeps skipping instead of throwing.");
}

}  // namespace

StepResult GradScaler::step(torch::optim::Optimizer& optimizer,
                            torch::optim::Optimizer::LossClosure closure) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "step");
  if (!options_.enabled()) {
    StepResult result;
    result.loss = optimizer.step(std::move(closure));
    return result;
  }
  TORCH_CHECK(!closure, "Closure use is not currently supported if GradScaler is enabled.");
  check_initialized("step");
  // unordered_map keeps references valid when unscale_ inserts nothing new for this key.
  OptimizerState& state = per_optimizer_states_[&optimizer];
  TORCH_CHECK(state.stage != OptimizerStage::kStepped,
              "step() has already been called since the last update().");
  if (auto* scaling = dynamic_cast<optim::SupportsAmpScaling*>(&optimizer)) {
    return step_on_device(optimizer, state, *scaling);
  }
  if (state.stage == OptimizerStage::kReady) unscale_(optimizer);
  TORCH_CHECK(!state.found_inf_per_device.empty(),
              "No inf checks were recorded for this optimizer.");

  StepResult result;
  result.found_inf = combined_found_inf(state);
  // HOST SYNC (the only one in a step): a non-fused optimizer's step() runs on the host, so
  // deciding whether to call it needs the inf/NaN flag here.
  const OverflowRead read = read_overflow(result.found_inf);
  const bool overflow = read.overflow;
  if (overflow) {
    result.outcome = StepOutcome::kSkipped;
  } else {
    result.loss = optimizer.step();
    result.outcome = StepOutcome::kTaken;
  }
  state.stage = OptimizerStage::kStepped;
  throw_if_stuck(read.overflow, read.stuck_at_min_scale, options_.min_scale());
  return result;
}

StepResult GradScaler::step_on_device(torch::optim::Optimizer& optimizer, OptimizerState& state,
                                      optim::SupportsAmpScaling& scaling) {
  // Python's `_step_supports_amp_scaling` branch: check without unscaling unless unscale_ ran,
  // hand over the scale (none when already unscaled) and the flag, call step() regardless.
  // Refused before any work: the read after the step would fail inside the capture with CUDA's
  // "operation not permitted when stream is capturing" and invalidate the whole graph.
  TORCH_CHECK(!throws_at_min_scale() || !detail::current_stream_is_capturing(scale_.device()),
              "GradScaler::step: MinScalePolicy::kThrow reads the inf/NaN flag on the host after "
              "every step, which a CUDA graph capture cannot do. Capture with "
              "MinScalePolicy::kSkip (the scale then stays at min_scale and steps keep being "
              "skipped), or step outside the graph.");
  const bool unscaled = state.stage == OptimizerStage::kUnscaled;
  if (!unscaled) check_inf_per_device(optimizer);
  StepResult result;
  result.outcome = StepOutcome::kDecidedOnDevice;
  if (state.found_inf_per_device.empty()) {
    // Gradients that no check saw (unscale_ ran before they existed) would be stepped on scaled;
    // Python fails there too (inside its fused optimizer).
    TORCH_CHECK(!has_gradients(optimizer),
                "No inf checks were recorded for this optimizer. unscale_() ran before its "
                "gradients existed; call it after backward().");
    // Without any gradient Python's flag is the sum of no flags, 0, and the optimizer steps over
    // nothing; nothing is recorded, so update() refuses unless another optimizer recorded one.
    result.found_inf = at::zeros({}, scale_.options());
  } else {
    result.found_inf = combined_found_inf(state);
  }
  const at::Tensor& preset = scaling.grad_scale();
  at::Tensor grad_scale;
  if (!unscaled)
    grad_scale = preset.defined() ? scale_ * preset.to(scale_.device()) : scale_;
  else
    grad_scale = preset;
  scaling.set_grad_scaling(grad_scale, result.found_inf);
  try {
    result.loss = optimizer.step();
  } catch (...) {
    scaling.clear_grad_scaling();
    throw;
  }
  scaling.clear_grad_scaling();
  state.stage = OptimizerStage::kStepped;
  if (throws_at_min_scale()) {
    const OverflowRead read = read_overflow(result.found_inf);
    throw_if_stuck(read.overflow, read.stuck_at_min_scale, options_.min_scale());
  }
  return result;
}

void GradScaler::update() {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "update");
  if (!options_.enabled()) return;
  check_initialized("update");
  std::vector<at::Tensor> found_infs;
  for (const auto& [optimizer, state] : per_optimizer_states_) {
    for (const auto& [device, found_inf] : state.found_inf_per_device) {
      found_infs.push_back(
          found_inf.to(scale_.device(), found_inf.scalar_type(), /*non_blocking=*/true));
    }
  }
  TORCH_CHECK(!found_infs.empty(), "No inf checks were recorded prior to update.");
  // Summed out of place: the per-optimizer flags may be held by callers of check_inf_per_device.
  at::Tensor found_inf_combined = found_infs.front();
  for (size_t i = 1; i < found_infs.size(); ++i)
    found_inf_combined = found_inf_combined + found_infs[i];
  // Flags recorded by unscale_ or check_inf_per_device without a step() were not combined across
  // ranks yet: one more collective then (the same on every rank, as every rank made the same
  // calls). The map's order differs across ranks, so no collective is issued while walking it.
  if (const auto& sync = options_.found_inf_sync()) {
    const bool all_synced = std::all_of(per_optimizer_states_.begin(), per_optimizer_states_.end(),
                                        [](const auto& entry) { return entry.second.synced; });
    if (!all_synced) {
      if (found_infs.size() == 1) found_inf_combined = found_inf_combined.clone();
      sync->all_reduce_max_(found_inf_combined);
    }
  }

  const auto optional = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  amp::update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor(),
                     options_.backoff_factor(), options_.growth_interval(),
                     optional(hysteresis_remaining_), optional(counters_),
                     ScaleUpdateExtensions{options_.hysteresis(), options_.consecutive_hysteresis(),
                                           options_.min_scale(), options_.max_scale()});
  per_optimizer_states_.clear();
}

void GradScaler::update(double new_scale) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "update");
  if (!options_.enabled()) return;
  check_initialized("update");
  check_new_scale(new_scale, options_);
  scale_.fill_(new_scale);
  per_optimizer_states_.clear();
}

void GradScaler::update(const at::Tensor& new_scale) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "update");
  if (!options_.enabled()) return;
  check_initialized("update");
  static constexpr const char* kReason =
      "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor "
      "with requires_grad=False.";
  TORCH_CHECK(new_scale.defined(), kReason, " Got an undefined tensor.");
  TORCH_CHECK(new_scale.device().type() == device_type_, kReason, " Got a tensor on ",
              new_scale.device(), " for a scaler of device type ", device_type_, ".");
  TORCH_CHECK(new_scale.numel() == 1, kReason, " Got a tensor with ", new_scale.numel(),
              " elements.");
  TORCH_CHECK(!new_scale.requires_grad(), kReason, " Got a tensor that requires grad.");
  // Python copies any dtype and any value; a scale of another dtype or one that is NaN, inf,
  // <= 0 or not storable in float32 would poison every later step, so it is refused here as
  // update(double) refuses it. Reading the value is one host sync for a device tensor.
  TORCH_CHECK(at::isFloatingType(new_scale.scalar_type()), kReason, " Got a tensor of dtype ",
              new_scale.scalar_type(), "; pass a floating-point tensor.");
  check_new_scale(new_scale.item<double>(), options_);
  // reshape: Python accepts any 1-element shape here and then fails in copy_ for shape [1].
  scale_.copy_(new_scale.reshape({}));
  per_optimizer_states_.clear();
}

double GradScaler::get_scale() const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "get_scale");
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : options_.init_scale();
}

int64_t GradScaler::get_growth_tracker() const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "get_growth_tracker");
  if (!options_.enabled()) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

void GradScaler::set_growth_factor(double new_factor) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "set_growth_factor");
  detail::check_growth_factor(new_factor);
  options_.growth_factor(new_factor);
}

void GradScaler::set_backoff_factor(double new_factor) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "set_backoff_factor");
  detail::check_backoff_factor(new_factor);
  options_.backoff_factor(new_factor);
}

void GradScaler::set_growth_interval(int64_t new_interval) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "set_growth_interval");
  detail::check_growth_interval(new_interval);
  options_.growth_interval(new_interval);
  if (!options_.enabled()) return;
  // torch.amp's rule grows when tracker + 1 equals the interval, so a tracker already at or past
  // a lowered interval stops growth until an overflow resets it. amp keeps the rule (the same
  // trajectory as Python) and says so; reading the tracker is one sync, in a setter, not a step.
  const int64_t tracker =
      growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
  if (tracker >= new_interval) {
    TORCH_WARN(
        "GradScaler::set_growth_interval: the growth tracker is ", tracker,
        ", at or above the new growth_interval=", new_interval,
        ", so the scale will not grow again until an overflow resets the tracker (torch.amp's "
        "rule, kept for parity). To grow after ",
        new_interval,
        " clean steps from now, lower the interval right after an update() that backed off "
        "or grew, or load a state dict whose '_growth_tracker' is 0.");
  }
}

GradScalerCounters GradScaler::counters() const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "counters");
  TORCH_CHECK(options_.track_counters(),
              "GradScaler::counters: this scaler does not track counters; construct it with "
              "GradScalerOptions().track_counters(true).");
  if (!options_.enabled()) return {};
  if (!counters_.defined()) return init_counters_;
  const at::Tensor host = counters_.to(at::kCPU);
  const int64_t* values = host.data_ptr<int64_t>();
  return GradScalerCounters{values[0], values[1], values[2]};
}

int64_t GradScaler::hysteresis_remaining() const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "hysteresis_remaining");
  if (!options_.enabled()) return 0;
  if (!hysteresis_remaining_.defined()) return init_hysteresis_remaining_;
  return hysteresis_remaining_.item<int64_t>();
}

OptimizerStage GradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "stage");
  const auto it = per_optimizer_states_.find(&optimizer);
  return it == per_optimizer_states_.end() ? OptimizerStage::kReady : it->second.stage;
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::found_inf_per_device(
    const torch::optim::Optimizer& optimizer) const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "found_inf_per_device");
  const auto it = per_optimizer_states_.find(&optimizer);
  if (it == per_optimizer_states_.end()) return {};
  return it->second.found_inf_per_device;
}

}  // namespace amp
