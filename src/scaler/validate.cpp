// Range checks of GradScaler's options and state, worded once for construction, setters, update
// and loading.
#include "scaler/validate.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>

#include <c10/util/Exception.h>

namespace amp::detail {

namespace {

// Trackers, allowances and hysteresis live in int32 tensors.
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Whether `scale` survives being stored in the float32 scale tensor: outside float32's normal
// range it would become inf, or a subnormal whose reciprocal (the unscale factor) overflows.
bool is_storable_scale(double scale) {
  if (!std::isfinite(scale) || scale <= 0.0) return false;
  const auto stored = static_cast<float>(scale);
  return std::isfinite(stored) && stored >= std::numeric_limits<float>::min();
}

}  // namespace

void check_scale_value(double scale, const char* what, const char* name, const char* fix) {
  TORCH_CHECK(is_storable_scale(scale), what,
              " must be finite and > 0, within float32's normal range [",
              std::numeric_limits<float>::min(), ", ", std::numeric_limits<float>::max(),
              "] since the scale is kept in a float32 tensor. Got ", name, "=", scale, "; ", fix);
}

void check_growth_tracker(int64_t tracker) {
  // Not bounded by growth_interval: Python and amp reach a larger tracker after
  // set_growth_interval lowers the interval, and save it.
  TORCH_CHECK(tracker >= 0 && tracker <= kInt32Max,
              "GradScaler::load_state_dict: '_growth_tracker' must be in [0, 2^31-1] (it is kept "
              "in an int32 tensor), got ",
              tracker, "; the checkpoint is damaged.");
}

void check_init_scale(double init_scale) {
  check_scale_value(init_scale, "The initial scale", "init_scale",
                    "pass a positive value such as 65536.0 (the default).");
}

void check_growth_factor(double growth_factor) {
  // The first sentence is Python's wording.
  TORCH_CHECK(std::isfinite(growth_factor) && growth_factor > 1.0,
              "The growth factor must be > 1.0. Got growth_factor=", growth_factor,
              "; pass a finite value above 1.0 (the default is 2.0).");
}

void check_backoff_factor(double backoff_factor) {
  // The first sentence is Python's wording; a factor <= 0 would zero or flip the scale.
  TORCH_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0,
              "The backoff factor must be < 1.0. Got backoff_factor=", backoff_factor,
              "; pass a value in (0, 1) (the default is 0.5).");
}

void check_growth_interval(int64_t growth_interval) {
  TORCH_CHECK(growth_interval >= 1,
              "The growth interval must be >= 1. Got growth_interval=", growth_interval,
              "; pass a positive number of steps (the default is 2000).");
}

void check_cuda_kernels_built(bool built_with_cuda) {
  TORCH_CHECK(built_with_cuda,
              "amp::GradScaler was asked for CUDA and CUDA is available, but this build of amp "
              "has no CUDA kernels (it was configured with AMP_WITH_CUDA=OFF). Rebuild amp with "
              "-DAMP_WITH_CUDA=ON against a CUDA LibTorch, or use GradScaler(torch::kCPU) for a "
              "model on the CPU.");
}

void check_extension_options(int64_t hysteresis, double min_scale, double max_scale) {
  // The allowance is counted down in an int32 tensor.
  TORCH_CHECK(hysteresis >= 1 && hysteresis <= kInt32Max,
              "The hysteresis must be >= 1 and <= 2^31-1. Got hysteresis=", hysteresis,
              "; pass 1 for torch.amp's behaviour or N to back off only after N overflows.");
  TORCH_CHECK(std::isfinite(min_scale) && min_scale >= 0.0,
              "The minimum scale must be finite and >= 0. Got min_scale=", min_scale,
              "; pass 0 for no floor or a positive value such as 1.0.");
  TORCH_CHECK(max_scale > 0.0, "The maximum scale must be > 0. Got max_scale=", max_scale,
              "; pass infinity for no cap or a positive value such as 2^24.");
  TORCH_CHECK(min_scale <= max_scale,
              "min_scale must not exceed max_scale. Got min_scale=", min_scale,
              " and max_scale=", max_scale, "; swap or widen them.");
}

void check_scale_in_bounds(double scale, double min_scale, double max_scale, ScaleHeld held,
                           const char* what, const char* name, const char* fix) {
  // The float32 rounding always lies inside the bounds as the update enforces them, in float32:
  // with a bound float32 cannot hold (min_scale=0.7), the scale at the floor is float32(0.7) <
  // 0.7, which must load. An initial or loaded scale is also held as it is until the first
  // scale(): that value too, or 0.9999999999999999, which rounds to 1, would pass min_scale=1.
  const auto stored = static_cast<float>(scale);
  const auto low32 = static_cast<float>(min_scale), high32 = static_cast<float>(max_scale);
  const double low = std::min(min_scale, static_cast<double>(low32));
  const double high = std::max(max_scale, static_cast<double>(high32));
  const auto exact = [](double value) { return c10::str(std::setprecision(17), value); };
  const bool exact_inside = held == ScaleHeld::kRounded || (scale >= low && scale <= high);
  TORCH_CHECK(stored >= low32 && stored <= high32 && exact_inside, what,
              " must lie in [min_scale, max_scale]. Got ", name, "=", exact(scale),
              " with min_scale=", exact(min_scale), " and max_scale=", exact(max_scale), "; ", fix);
}

}  // namespace amp::detail
