// The delayed-scaling update rule (delayed_state.h): Transformer Engine's history roll and scale
// computation, on device tensors, with no host read.
#include "fp8/delayed_state.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace amp::fp8::detail {

double fp8_max(c10::ScalarType fp8_dtype) {
  switch (fp8_dtype) {
    case c10::ScalarType::Float8_e4m3fn:
      return 448.0;
    case c10::ScalarType::Float8_e5m2:
      return 57344.0;
    default:
      TORCH_CHECK(false, "amp::fp8: dtype must be Float8_e4m3fn or Float8_e5m2. Got ", fp8_dtype,
                  ".");
  }
}

void update_delayed_scale(DelayedState& state, c10::ScalarType fp8_dtype,
                          const DelayedScalingOptions& options) {
  auto& history = state.amax_history;
  // NaN-ignoring maximum, as Transformer Engine's fmaxf over the history.
  const auto amax =
      options.amax_compute_algo() == AmaxComputeAlgo::max
          ? at::nan_to_num(history, 0.0, std::numeric_limits<double>::infinity()).max()
          : history[0].clone();
  // The history moves one place towards the front; the oldest entry is dropped and the newest
  // (history[0], now last) stays in it, and history[0] is free for the next cast's amax.
  history.copy_(at::roll(history, {-1}, {0}));
  history[0].fill_(0.0);
  const double scaled_max =
      fp8_max(fp8_dtype) * std::ldexp(1.0, -static_cast<int>(options.margin()));
  auto candidate = at::full({}, scaled_max, history.options()) / amax;
  const auto usable = at::isfinite(amax).logical_and(amax > 0);
  candidate = at::where(usable, candidate, state.scale);
  candidate =
      at::where(at::isinf(candidate),
                at::full({}, std::numeric_limits<float>::max(), history.options()), candidate);
  state.scale.copy_(candidate);
}

}  // namespace amp::fp8::detail
