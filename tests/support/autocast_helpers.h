// Helpers shared by the autocast suites: the thread's full autocast state read straight from ATen
// for before/after comparisons, and the weight-cast observation.
#pragma once

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <initializer_list>
#include <ostream>
#include <vector>

namespace amp_test {

/// The lower-precision dtypes CPU autocast accepts, for GENERATE(values(...)).
inline const std::initializer_list<c10::ScalarType> kLowerPrecision = {torch::kBFloat16,
                                                                       torch::kHalf};

/// The device types for which Python's torch.amp.is_autocast_available() is true in torch 2.14
/// ("cpu", "cuda", "mtia", "maia", "xpu", "ipu", "hpu", "xla", "privateuseone", "mps"), in
/// at::autocast's order; written out here so that tests do not take the list from amp.
inline const std::vector<c10::DeviceType> kAutocastDevices = {
    torch::kCPU, torch::kCUDA, torch::kMTIA, torch::kMAIA,        torch::kXPU,
    torch::kIPU, torch::kHPU,  torch::kXLA,  torch::kPrivateUse1, torch::kMPS};

/// The calling thread's autocast nesting count. It is only readable through increment/decrement,
/// which return the new value; a decrement to 0 here does not clear the cache (only an explicit
/// clear_cache does).
inline int nesting_count() {
  const int count = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  return count;
}

/// One device type's flags as ATen reports them.
struct DeviceFlags {
  bool enabled;
  c10::ScalarType dtype;
  bool operator==(const DeviceFlags&) const = default;
};

/// For Catch2's failure messages (vectors of these are printed through c10's operator<<).
inline std::ostream& operator<<(std::ostream& out, const DeviceFlags& flags) {
  return out << (flags.enabled ? "on " : "off ") << flags.dtype;
}

/// Everything a region may touch on the calling thread, read from at::autocast (not through amp,
/// so that amp's capture is compared with ATen rather than with itself).
struct FullAutocastState {
  std::vector<DeviceFlags> devices;  // in kAutocastDevices' order
  bool cache_enabled;
  int nesting;
  bool operator==(const FullAutocastState&) const = default;
};

inline std::ostream& operator<<(std::ostream& out, const FullAutocastState& state) {
  out << "{";
  for (size_t i = 0; i < state.devices.size(); ++i) {
    out << (i ? ", " : "") << state.devices[i];
  }
  return out << "} cache " << state.cache_enabled << " nesting " << state.nesting;
}

inline FullAutocastState full_autocast_state() {
  FullAutocastState state{{}, at::autocast::is_autocast_cache_enabled(), nesting_count()};
  for (const auto device : kAutocastDevices) {
    state.devices.push_back(
        {at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)});
  }
  return state;
}

/// Sets the calling thread's autocast flags straight through at::autocast for a scope (no amp
/// code involved) and puts the previous flags back on exit.
class AtenAutocastState {
 public:
  AtenAutocastState() : saved_(full_autocast_state()) {}
  ~AtenAutocastState() {
    for (size_t i = 0; i < kAutocastDevices.size(); ++i) {
      at::autocast::set_autocast_enabled(kAutocastDevices[i], saved_.devices[i].enabled);
      at::autocast::set_autocast_dtype(kAutocastDevices[i], saved_.devices[i].dtype);
    }
    at::autocast::set_autocast_cache_enabled(saved_.cache_enabled);
  }
  AtenAutocastState(const AtenAutocastState&) = delete;
  AtenAutocastState& operator=(const AtenAutocastState&) = delete;

  void set(c10::DeviceType device, bool enabled, c10::ScalarType dtype) {
    at::autocast::set_autocast_enabled(device, enabled);
    at::autocast::set_autocast_dtype(device, dtype);
  }

 private:
  FullAutocastState saved_;
};

/// The autograd node that cast the second operand of `mm_output` (mm(x, weight)). A cached
/// cast is one node shared by every use of the weight, so equal nodes mean the cache was hit.
inline const torch::autograd::Node* weight_cast_node(const torch::Tensor& mm_output) {
  return mm_output.grad_fn()->next_edges().at(1).function.get();
}

}  // namespace amp_test
