// Autocast regions for LibTorch: an RAII guard with torch.autocast's semantics, a functional form,
// capture/apply of the thread-local autocast state for worker threads, and eager autocast for
// TorchScript modules.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <amp/export.h>

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace amp {

/// True when at::autocast knows the device type (CPU, CUDA, XPU, MPS, HPU, XLA, MTIA, MAIA,
/// IPU, PrivateUse1): an AutocastGuard may be opened for it. Whether the device is present
/// on this machine is a separate question (see AutocastGuard for CUDA without a GPU).
AMP_EXPORT bool is_autocast_available(c10::DeviceType device);

/// What an autocast region asks for; the same four knobs as Python's
/// `torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)`, with chained
/// setters: `amp::AutocastOptions(torch::kCUDA).dtype(torch::kBFloat16).cache_enabled(false)`.
struct AutocastOptions {
  /// Options for a region on `device` with every other knob at its default.
  /* implicit */ AutocastOptions(c10::DeviceType device) : device_(device) {}

  /// The device type whose autocast state the region changes (kCPU, kCUDA, ...).
  TORCH_ARG(c10::DeviceType, device);
  /// The lower-precision dtype; unset means the device's current autocast dtype (bf16 on CPU,
  /// fp16 on CUDA unless an enclosing region chose another).
  TORCH_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  /// false opens a region with autocast off (for example an fp32 island inside autocast).
  TORCH_ARG(bool, enabled) = true;
  /// Whether casts of fp32 weights are cached inside the region; unset keeps the current flag.
  TORCH_ARG(std::optional<bool>, cache_enabled) = std::nullopt;
};

namespace detail {

/// What torch.autocast's validation makes of a request (see AutocastGuard).
enum class AutocastRequestCheck {
  /// The region runs with autocast on.
  enabled,
  /// `enabled` was false: nothing is checked but the device type, and the region runs disabled.
  disabled,
  /// at::autocast does not know the device type.
  unsupported_device,
  /// kCUDA while CUDA is unavailable: the region runs disabled after a warning.
  cuda_unavailable,
  /// A dtype the device type does not accept.
  unsupported_dtype,
  /// kCUDA with kBFloat16 on a GPU that cannot hold bf16 tensors.
  cuda_bf16_unsupported,
};

/// AutocastGuard's validation rule, apart from the machine it runs on, so that the CUDA rules can
/// be checked without a GPU. `cuda_available` and `cuda_bf16_supported` answer for the machine;
/// like Python, the rule asks them only for an enabled kCUDA request (the second one only for
/// kBFloat16 once CUDA is available), so a CPU region never initializes CUDA.
/// Returns: the outcome; AutocastGuard turns it into a region, a warning or an error.
AMP_EXPORT AutocastRequestCheck check_autocast_request(
    c10::DeviceType device, c10::ScalarType dtype, bool enabled,
    const std::function<bool()>& cuda_available, const std::function<bool()>& cuda_bf16_supported);

}  // namespace detail

/// RAII autocast region: the C++ form of `with torch.autocast(...)`.
///
/// Construction validates the request, then enters the region exactly as Python's
/// `torch.autocast.__enter__` does: it remembers the previous cache flag, enabled flag and dtype
/// of `device`; sets the enabled flag and the dtype (the dtype is set even for a disabled
/// region); increments the autocast nesting count (also for a disabled region); and sets the
/// cache flag. Destruction undoes it like `__exit__`: it decrements the nesting count, clears the
/// process-wide weight-cast cache when the count reaches 0 (the outermost region ended), then
/// restores the enabled flag, dtype and cache flag. The destructor never throws, so the state is
/// restored also when an exception leaves the region.
///
/// Validation follows Python's `torch.autocast.__init__` (torch/amp/autocast_mode.py):
/// - a device type at::autocast does not know throws c10::Error "User specified an unsupported
///   autocast device_type '<type>'" (Python's wording), also for a disabled region;
/// - everything below applies only when `enabled` is true: a disabled region accepts any dtype;
/// - kCUDA: while CUDA is unavailable (at::hasCUDA() is false: no GPU, or a LibTorch or program
///   without CUDA) the region runs disabled after a warning, whatever the dtype (the state is still
///   saved and restored and the nesting still counted). Python's test differs in one point: it
///   also counts CUDA as available when the torch_xla package is installed, which has no meaning
///   for LibTorch. With CUDA, every dtype is accepted, as Python accepts any dtype for CUDA:
///   float32 gives a region whose lower-precision ops run in float32, and a dtype those ops have
///   no kernel for fails in the first of them. The one exception: kBFloat16 throws c10::Error when
///   the current GPU cannot hold bf16 tensors (Python's `torch.cuda.is_bf16_supported()`: compute
///   capability 8.0+, ROCm, or an older GPU that emulates bf16);
/// - every other device type accepts kBFloat16 and kHalf only. Python warns and runs the region
///   disabled for any other dtype; amp throws c10::Error naming the device, the dtype and the
///   allowed dtypes instead, on purpose: a C++ caller passing, say, float32 to a CPU region has a
///   bug, and a silently full-precision region would hide it. Use `enabled = false` for a
///   full-precision region;
/// - PrivateUse1 accepts kBFloat16 and kHalf: Python asks the backend's registered Python module
///   (`get_amp_supported_dtype()`), which LibTorch has no C++ counterpart of.
/// The CUDA warning is raised once per process (TORCH_WARN_ONCE); Python warns through
/// `warnings.warn`, which by default shows it once per calling line.
///
/// Autocast state (enabled flags, dtypes, cache flag, nesting count) is thread-local: the guard
/// changes it only for the calling thread (see AutocastStateGuard). The weight-cast cache is not:
/// it is one process-wide map, so the outermost region's exit on one thread also drops casts that
/// regions still open on other threads had cached (they are cast again on their next use). Guards
/// must be destroyed in reverse order of construction on the thread that created them, which
/// scoping guarantees; the guard can be neither copied nor moved.
class AMP_EXPORT AutocastGuard {
 public:
  /// Opens a region on `device`.
  /// Args: device: kCPU, kCUDA or another autocast device type; dtype: the lower-precision
  ///   dtype, unset for the device's current autocast dtype; enabled: false for an autocast-off
  ///   region; cache_enabled: the weight-cast cache flag inside the region, unset to keep it.
  /// Errors: c10::Error for an unsupported device type or dtype, or bf16 on a GPU without it
  ///   (see the class comment).
  explicit AutocastGuard(c10::DeviceType device,
                         std::optional<c10::ScalarType> dtype = std::nullopt, bool enabled = true,
                         std::optional<bool> cache_enabled = std::nullopt);

  /// Opens a region described by `options` (same validation as the constructor above).
  explicit AutocastGuard(const AutocastOptions& options);

  /// Leaves the region (see the class comment); never throws.
  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  AutocastGuard(AutocastGuard&&) = delete;
  AutocastGuard& operator=(AutocastGuard&&) = delete;

  /// The device type whose state this region set.
  c10::DeviceType device() const noexcept { return device_; }
  /// The autocast dtype in effect inside the region.
  c10::ScalarType dtype() const noexcept { return dtype_; }
  /// Whether autocast is on inside the region: false when asked for, and also when CUDA was
  /// requested on a machine without CUDA.
  bool enabled() const noexcept { return enabled_; }
  /// The weight-cast cache flag in effect inside the region.
  bool cache_enabled() const noexcept { return cache_enabled_; }

 private:
  c10::DeviceType device_;
  c10::ScalarType dtype_;
  bool enabled_;
  bool cache_enabled_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

/// Runs `fn(args...)` inside an autocast region and returns its result: the functional form of
/// AutocastGuard, like Python's `@torch.autocast(...)` decorator. `options` is a device type
/// (`amp::autocast(torch::kCPU, fn, x)`) or an AutocastOptions for the other knobs.
/// Returns: what `fn` returns (a reference stays a reference).
/// Errors: those of AutocastGuard; exceptions from `fn` propagate after the region is left.
template <class Fn, class... Args>
std::invoke_result_t<Fn, Args...> autocast(const AutocastOptions& options, Fn&& fn,
                                           Args&&... args) {
  AutocastGuard guard(options);
  return std::invoke(std::forward<Fn>(fn), std::forward<Args>(args)...);
}

/// One device type's part of the thread-local autocast state.
struct AutocastDeviceState {
  /// The device type (kCPU, kCUDA, ...).
  c10::DeviceType device;
  /// Whether autocast is on for it.
  bool enabled;
  /// Its autocast (lower-precision) dtype.
  c10::ScalarType dtype;

  /// Member-wise equality.
  bool operator==(const AutocastDeviceState&) const = default;
};

/// A snapshot of one thread's autocast state: the enabled flag and dtype of every device type
/// at::autocast knows, and the weight-cast cache flag. The nesting count is not part of it.
struct AutocastState {
  /// One entry per autocast device type, in at::autocast's order.
  std::vector<AutocastDeviceState> devices;
  /// The weight-cast cache flag.
  bool cache_enabled = true;

  /// Member-wise equality.
  bool operator==(const AutocastState&) const = default;
};

/// Captures the calling thread's autocast state, to be applied in another thread with
/// AutocastStateGuard.
/// Returns: the state of every device type at::autocast knows, and the cache flag.
AMP_EXPORT AutocastState capture_autocast_state();

/// Applies a captured autocast state to the calling thread for a scope, restoring the thread's
/// own state on exit.
///
/// Autocast state is thread-local and every new thread starts with autocast off, so a region
/// opened in one thread does not reach work that thread hands to others. Use this guard when
/// model code runs on threads you start: your own std::thread / thread-pool workers, LibTorch
/// data loader workers (torch::data::make_data_loader with workers > 0) that run a model or
/// casts inside a transform, or a producer thread that prepares inputs under autocast. Capture
/// the state in the thread that opened the region and construct the guard first thing in the
/// worker:
///
///     auto state = amp::capture_autocast_state();
///     std::thread worker([&] {
///       amp::AutocastStateGuard autocast(state);
///       out = model->forward(x);   // same dtypes as in the capturing thread
///     });
///
/// Not needed for backward passes: autograd's engine carries the enabled flags (and dtypes) of
/// the thread that called backward() into its device worker threads by itself.
///
/// The guard counts as an autocast region: it increments the calling thread's nesting count and,
/// when that count returns to 0, clears the weight-cast cache, as the outermost AutocastGuard
/// does. That cache is process-wide in ATen (one map under a mutex, keyed by the fp32 weight),
/// not per thread, which has three consequences for worker threads:
/// - a worker's region and the regions open on other threads share cached casts: a weight cast in
///   one thread is reused by the others while it is cached;
/// - when a worker's outermost region ends (this guard, or an AutocastGuard in a worker with no
///   guard around it), the whole cache is cleared, including casts of regions still open on other
///   threads; those are cast again on their next use, which costs time and memory but gives the
///   same values;
/// - the cache is keyed by the weight alone, not by dtype: a worker whose state has another
///   lower-precision dtype than a concurrently open region on another thread can receive that
///   region's cast of a weight (an mm then fails with mismatched dtypes). Give threads that run
///   at the same time the same autocast dtype, which capturing one thread's state ensures.
/// Non-copyable, non-movable; the destructor never throws.
class AMP_EXPORT AutocastStateGuard {
 public:
  /// Applies `state` to the calling thread.
  /// Args: state: a snapshot from capture_autocast_state() (possibly of another thread).
  /// Errors: c10::Error when an entry names a device type at::autocast does not know.
  explicit AutocastStateGuard(const AutocastState& state);

  /// Restores the thread's previous state; never throws.
  ~AutocastStateGuard();

  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;
  AutocastStateGuard(AutocastStateGuard&&) = delete;
  AutocastStateGuard& operator=(AutocastStateGuard&&) = delete;

 private:
  AutocastState previous_;
};

/// While it lives, TorchScript modules (torch::jit::load of torch.jit.script or torch.jit.trace)
/// run under an autocast region exactly as eager code does, forward and backward, on every call:
/// the graph executor runs each op through the dispatcher (no optimised plan, no differentiable
/// subgraphs, no re-specialisation after the first call) and the JIT's own autocast pass, whose
/// op lists differ from eager autocast's (it leaves a convolution's bias in float32,
/// pytorch/pytorch#140279), is off. Without it a loaded module under AutocastGuard gives other
/// bits, and its second call's backward can throw. Use it around the calls (and, for a traced
/// module, prepare_for_autocast once after loading):
///   amp::ScriptAutocastGuard script_autocast;
///   amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
///   auto out = module.forward({x}).toTensor();
/// The executor setting is per thread; the JIT autocast pass setting is process-wide, so guards
/// on several threads nest (the last one to end restores it). Non-copyable, non-movable; the
/// destructor never throws. Costs: each op is interpreted, as in Python's eager mode.
class AMP_EXPORT ScriptAutocastGuard {
 public:
  ScriptAutocastGuard();
  ~ScriptAutocastGuard();

  ScriptAutocastGuard(const ScriptAutocastGuard&) = delete;
  ScriptAutocastGuard& operator=(const ScriptAutocastGuard&) = delete;
  ScriptAutocastGuard(ScriptAutocastGuard&&) = delete;
  ScriptAutocastGuard& operator=(ScriptAutocastGuard&&) = delete;

 private:
  bool previous_optimize_;
};

/// Rewrites the ops torch.jit.trace records below the ones eager autocast casts at back into
/// those: aten::_convolution into aten::conv1d/conv2d/conv3d/conv_transpose*d (autocast's CPU and
/// CUDA lists name the latter), in every method of `module` and its submodules. Call once after
/// torch::jit::load, before the first call; with ScriptAutocastGuard a traced module then gives
/// eager autocast's bits. A scripted module keeps Python's ops and needs no rewrite (it is
/// unchanged by one). The declaration takes the module opaquely, so that this header does not
/// pull in TorchScript: include <torch/script.h> where you call it.
AMP_EXPORT void prepare_for_autocast(torch::jit::Module& module);

}  // namespace amp
