// The scaler's kernel seam: today ATen's AMP ops and plain tensor ops; fused kernels plug in here.
#include "scaler/scaler_ops.h"

#include <limits>

#include <ATen/ATen.h>

namespace amp::detail {

void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale) {
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                         growth_interval);
}

void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                            at::Tensor& hysteresis_remaining, at::Tensor& counters,
                            const at::Tensor& found_inf, const ExtendedUpdate& params) {
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor clean = found.logical_not();

  // An overflow spends one unit of the allowance; only an exhausted allowance backs off.
  const at::Tensor remaining =
      at::where(found, hysteresis_remaining - 1, hysteresis_remaining).clamp_min(0);
  const at::Tensor back_off = found.logical_and(remaining.le(0));

  // Products are formed in double and rounded once to float32, exactly as ATen's update does,
  // so hysteresis 1 without bounds reproduces torch.amp bit for bit.
  const at::Tensor scale64 = scale.to(at::kDouble);
  at::Tensor backed = (scale64 * params.backoff_factor).to(at::kFloat);
  if (params.min_scale > 0) backed = backed.clamp_min(params.min_scale);

  const at::Tensor successful = growth_tracker + 1;
  // `eq`, not `ge`, as in ATen: lowering growth_interval below the tracker stalls growth.
  const at::Tensor grow = clean.logical_and(successful.eq(params.growth_interval));
  at::Tensor candidate = (scale64 * params.growth_factor).to(at::kFloat);
  const at::Tensor finite = candidate.isfinite();
  if (params.max_scale < std::numeric_limits<double>::infinity()) {
    candidate = candidate.clamp_max(params.max_scale);
  }
  const at::Tensor grown = at::where(finite, candidate, scale);

  const at::Tensor new_scale = at::where(back_off, backed, at::where(grow, grown, scale));
  const at::Tensor new_tracker =
      at::where(found.logical_or(grow), at::zeros_like(successful), successful);
  const at::Tensor refill = params.consecutive_hysteresis ? clean : grow;
  const at::Tensor new_remaining =
      at::where(refill, at::full_like(remaining, params.hysteresis), remaining);

  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
  hysteresis_remaining.copy_(new_remaining);
  if (counters.defined()) advance_counters_(counters, found_inf);
}

void advance_counters_(at::Tensor& counters, const at::Tensor& found_inf) {
  const at::Tensor skipped = found_inf.ne(0).to(at::kLong);
  counters.select(0, 0).add_(1 - skipped);
  counters.select(0, 1).add_(skipped);
  counters.select(0, 2).add_(1).mul_(skipped);
}

}  // namespace amp::detail
