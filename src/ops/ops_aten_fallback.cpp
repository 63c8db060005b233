// amp's ops on devices amp has no kernels for (XPU, MPS, HPU, PrivateUse1, ...): registered as
// CompositeExplicitAutograd, so the dispatcher uses them wherever no backend kernel is
// registered, and they run ATen's own _amp_* kernels for that device, as Python's GradScaler does.
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/op_table.h"
#include "ops/validate.h"

namespace amp::detail::fallback {
namespace {

// ATen's op rejects an empty list on some devices; an empty list has nothing to check.
void aten_check_and_unscale(at::TensorList grads, at::Tensor found_inf, const at::Tensor& inv) {
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv);
}

void unscale_aten(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                  const std::optional<at::Tensor>& per_tensor_found_inf) {
  check_unscale_args("amp::non_finite_check_and_unscale_", grads, found_inf, inv_scale,
                     per_tensor_found_inf);
  if (per_tensor_found_inf) {
    // Attribution first, while the values are still the caller's: a check-only pass (an
    // inv_scale of 1 stores nothing) per tensor into that tensor's flag.
    const at::Tensor one = at::ones({}, inv_scale.options());
    for (size_t i = 0; i < grads.size(); ++i) {
      aten_check_and_unscale(grads[i], per_tensor_found_inf->view(-1).select(0, i), one);
    }
  }
  aten_check_and_unscale(grads, found_inf, inv_scale);
}

void update_scale_aten(const UpdateState& state, const UpdateRule& rule) {
  const bool extended = state.hysteresis_remaining || state.counters || rule.hysteresis != 1 ||
                        rule.min_scale > 0.0 || std::isfinite(rule.max_scale);
  TORCH_CHECK(!extended, "amp::update_scale_: the update's extensions (hysteresis, min_scale, ",
              "max_scale, counters) have amp kernels for CPU and CUDA only, and the scale is on ",
              state.scale.device(),
              "; use GradScalerOptions without those extensions on this device.");
  at::Tensor scale = state.scale;
  at::Tensor tracker = state.growth_tracker;
  at::_amp_update_scale_(scale, tracker, state.found_inf, rule.growth_factor, rule.backoff_factor,
                         rule.growth_interval);
  // The floor amp's kernels apply (update_rule.h): a growth never lowers the scale, so clamping
  // afterwards only touches a back-off that went below it.
  scale.clamp_min_(kSmallestScale);
  // And their saturating tracker: ATen's int32 increment wraps 2^31-1 to -2^31 (without growing),
  // a value reached only that way, which amp's kernels keep at 2^31-1.
  tracker.masked_fill_(tracker == std::numeric_limits<int32_t>::min(), kLargestTracker);
}

// grad * inv_scale in the op's compute type (float32, or float64 for float64 grads), squared
// and summed in float64.
at::Tensor sum_of_squares(const at::Tensor& grad, const at::Tensor& inv_scale) {
  const at::Tensor unscaled = grad.scalar_type() == at::kDouble ? grad * inv_scale.to(at::kDouble)
                                                                : grad.to(at::kFloat) * inv_scale;
  return unscaled.to(at::kDouble).square().sum();
}

std::tuple<at::Tensor, at::Tensor> unscale_norm_aten(at::TensorList grads,
                                                     const at::Tensor& found_inf,
                                                     const at::Tensor& inv_scale, bool per_tensor) {
  check_unscale_args("amp::unscale_norm", grads, found_inf, inv_scale, std::nullopt);
  aten_check_and_unscale(grads, found_inf, at::ones({}, inv_scale.options()));
  const auto float_options = found_inf.options();
  std::vector<at::Tensor> sums;
  sums.reserve(grads.size());
  const at::Tensor inv = inv_scale.reshape(at::IntArrayRef{});  // view({}) would pick a dtype
  for (const at::Tensor& grad : grads) sums.push_back(sum_of_squares(grad, inv));
  if (sums.empty()) {
    return {at::zeros({}, float_options), at::empty({0}, float_options)};
  }
  const at::Tensor stacked = at::stack(sums);
  const at::Tensor total = stacked.sum().sqrt().to(at::kFloat);
  const at::Tensor norms =
      per_tensor ? stacked.sqrt().to(at::kFloat) : at::empty({0}, float_options);
  return {total, norms};
}

void clip_unscaled_aten(at::TensorList grads, const at::Tensor& inv_scale,
                        const at::Tensor& total_norm, double max_norm, double eps) {
  check_clip_args(grads, inv_scale, total_norm, max_norm, eps);
  // clip_factor (kernel_common.h) as float32 tensor ops on the device.
  const at::Tensor norm = total_norm.reshape(at::IntArrayRef{});
  const at::Tensor coef = at::full_like(norm, max_norm).div(norm + eps).clamp_max(1.0);
  const at::Tensor factor = inv_scale.reshape(at::IntArrayRef{}) * coef;
  for (const at::Tensor& grad : grads) {
    at::Tensor out = grad;
    out.mul_(factor);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(amp, CompositeExplicitAutograd, m) {
  ops::register_kernels<unscale_aten, update_scale_aten, unscale_norm_aten, clip_unscaled_aten>(m);
}

}  // namespace amp::detail::fallback
