// AutocastGuard and the thread-state capture/apply: torch.autocast's enter/exit on at::autocast.
#include <amp/autocast.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <sstream>
#include <string>

namespace amp {
namespace {

// The dtypes Python's torch.autocast accepts for every device type but CUDA (autocast_mode.py's
// device_supported_dtypes); CUDA takes any dtype, and a PrivateUse1 backend's Python module may
// declare its own list, which LibTorch has no C++ hook for.
bool is_lower_precision_dtype(c10::ScalarType dtype) {
  return dtype == c10::kBFloat16 || dtype == c10::kHalf;
}

std::string autocast_device_list() {
  std::ostringstream out;
  bool first = true;
  for (const auto device : at::autocast::_AUTOCAST_SUPPORTED_DEVICES) {
    out << (first ? "" : ", ") << c10::DeviceTypeName(device, /*lower_case=*/true);
    first = false;
  }
  return out.str();
}

void check_autocast_device(c10::DeviceType device) {
  TORCH_CHECK(at::autocast::is_autocast_available(device),
              "User specified an unsupported autocast device_type '",
              c10::DeviceTypeName(device, /*lower_case=*/true),
              "'. Autocast supports the device types ", autocast_device_list(), ".");
}

// Mirrors torch.cuda.is_bf16_supported(including_emulation=True) without CUDA headers: a device
// of compute capability 8.0+ has native bf16, and an older one qualifies when it can hold a bf16
// tensor (emulation), which is the test Python falls back to. Creating that tensor answers both,
// so no device-property query (and no CUDA header) is needed. Cached per device like Python's
// lru_cache, because it allocates on the device.
bool cuda_bf16_supported() {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, bool> supported;
  const c10::DeviceIndex index = at::detail::getCUDAHooks().current_device();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = supported.find(index); it != supported.end()) return it->second;
  bool ok = true;
  try {
    (void)at::ones({1}, at::TensorOptions().dtype(at::kBFloat16).device(c10::kCUDA, index));
  } catch (const c10::Error&) {
    ok = false;
  }
  supported.emplace(index, ok);
  return ok;
}

// Applies torch.autocast.__init__'s rule on this machine; returns whether the region really
// enables autocast. The device type was checked before (see the constructor).
bool validate_request(c10::DeviceType device, c10::ScalarType dtype, bool enabled) {
  using detail::AutocastRequestCheck;
  const auto check = detail::check_autocast_request(
      device, dtype, enabled, [] { return at::hasCUDA(); }, cuda_bf16_supported);
  TORCH_INTERNAL_ASSERT(check != AutocastRequestCheck::unsupported_device);
  if (check == AutocastRequestCheck::cuda_unavailable) {
    TORCH_WARN_ONCE(
        "CUDA autocast was requested but CUDA is not available (no GPU, or a CPU-only "
        "LibTorch). Disabling autocast for CUDA regions.");
    return false;
  }
  // The device name in upper case, as Python prints it.
  TORCH_CHECK(check != AutocastRequestCheck::unsupported_dtype, "In ", c10::DeviceTypeName(device),
              " autocast, the target dtype ", dtype,
              " is not supported: ", c10::DeviceTypeName(device),
              " autocast supports BFloat16 and Half. Pass dtype at::kBFloat16 or at::kHalf, or "
              "open the region with enabled=false to run it in full precision.");
  TORCH_CHECK(check != AutocastRequestCheck::cuda_bf16_unsupported,
              "Current CUDA Device does not support bfloat16. Please switch dtype to float16 "
              "(at::kHalf).");
  return check == AutocastRequestCheck::enabled;
}

// Entering and leaving a region share these; the order is torch.autocast's (see the header).
void enter_region(c10::DeviceType device, c10::ScalarType dtype, bool enabled, bool cache) {
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache);
}

// Called from destructors: the at::autocast calls below only write thread-local flags and
// clear a map, so a failure is not expected; if one happens anyway it must not escape a
// destructor (that would terminate during unwinding), so it is dropped.
void leave_nesting_level() noexcept {
  try {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  } catch (...) {
  }
}

void restore_state(const AutocastState& state) {
  for (const auto& entry : state.devices) {
    at::autocast::set_autocast_enabled(entry.device, entry.enabled);
    at::autocast::set_autocast_dtype(entry.device, entry.dtype);
  }
  at::autocast::set_autocast_cache_enabled(state.cache_enabled);
}

}  // namespace

bool is_autocast_available(c10::DeviceType device) {
  return at::autocast::is_autocast_available(device);
}

namespace detail {

// torch/amp/autocast_mode.py, autocast.__init__: the device type is checked first and for every
// request; the dtype only for an enabled one: CUDA checks availability, then bf16 support, and no
// dtype list; the other device types check device_supported_dtypes.
AutocastRequestCheck check_autocast_request(c10::DeviceType device, c10::ScalarType dtype,
                                            bool enabled,
                                            const std::function<bool()>& cuda_available,
                                            const std::function<bool()>& cuda_bf16_supported) {
  if (!at::autocast::is_autocast_available(device)) {
    return AutocastRequestCheck::unsupported_device;
  }
  if (!enabled) return AutocastRequestCheck::disabled;
  if (device == c10::kCUDA) {
    if (!cuda_available()) return AutocastRequestCheck::cuda_unavailable;
    if (dtype == c10::kBFloat16 && !cuda_bf16_supported()) {
      return AutocastRequestCheck::cuda_bf16_unsupported;
    }
    return AutocastRequestCheck::enabled;
  }
  return is_lower_precision_dtype(dtype) ? AutocastRequestCheck::enabled
                                         : AutocastRequestCheck::unsupported_dtype;
}

}  // namespace detail

AutocastGuard::AutocastGuard(c10::DeviceType device, std::optional<c10::ScalarType> dtype,
                             bool enabled, std::optional<bool> cache_enabled)
    : device_(device) {
  check_autocast_device(device);
  dtype_ = dtype.value_or(at::autocast::get_autocast_dtype(device));
  cache_enabled_ = cache_enabled.value_or(at::autocast::is_autocast_cache_enabled());
  enabled_ = validate_request(device, dtype_, enabled);

  prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  prev_enabled_ = at::autocast::is_autocast_enabled(device);
  prev_dtype_ = at::autocast::get_autocast_dtype(device);
  enter_region(device, dtype_, enabled_, cache_enabled_);
}

AutocastGuard::AutocastGuard(const AutocastOptions& options)
    : AutocastGuard(options.device(), options.dtype(), options.enabled(), options.cache_enabled()) {
}

AutocastGuard::~AutocastGuard() {
  leave_nesting_level();
  try {
    at::autocast::set_autocast_enabled(device_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_, prev_dtype_);
    at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
  } catch (...) {
    // See leave_nesting_level: nothing may escape a destructor.
  }
}

AutocastState capture_autocast_state() {
  AutocastState state;
  state.devices.reserve(at::autocast::_AUTOCAST_SUPPORTED_DEVICES.size());
  for (const auto device : at::autocast::_AUTOCAST_SUPPORTED_DEVICES) {
    state.devices.push_back({device, at::autocast::is_autocast_enabled(device),
                             at::autocast::get_autocast_dtype(device)});
  }
  state.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return state;
}

AutocastStateGuard::AutocastStateGuard(const AutocastState& state) {
  for (const auto& entry : state.devices) check_autocast_device(entry.device);
  previous_ = capture_autocast_state();
  restore_state(state);
  // A region, so that the worker's cached casts are dropped when its outermost region ends.
  at::autocast::increment_nesting();
}

AutocastStateGuard::~AutocastStateGuard() {
  leave_nesting_level();
  try {
    restore_state(previous_);
  } catch (...) {
    // See leave_nesting_level: nothing may escape a destructor.
  }
}

}  // namespace amp
