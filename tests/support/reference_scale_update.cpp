// Reference extended scale update in plain tensor ops (see reference_scale_update.h).
#include "support/reference_scale_update.h"

#include <limits>

#include <ATen/ATen.h>

namespace amp_test {

void reference_update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                                      at::Tensor& hysteresis_remaining, at::Tensor& counters,
                                      const at::Tensor& found_inf, const UpdateOptions& params) {
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor clean = found.logical_not();

  // An overflow spends one unit of the allowance; only an exhausted allowance backs off.
  const at::Tensor remaining =
      at::where(found, hysteresis_remaining - 1, hysteresis_remaining).clamp_min(0);
  const at::Tensor back_off = found.logical_and(remaining.le(0));

  // Products are formed in double and rounded once to float32, exactly as ATen's update does,
  // so hysteresis 1 without bounds reproduces torch.amp bit for bit.
  const at::Tensor scale64 = scale.to(at::kDouble);
  // amp stops backing off at float32's smallest normal value (ATen goes on to 0).
  at::Tensor backed =
      (scale64 * params.backoff_factor).to(at::kFloat).clamp_min(std::numeric_limits<float>::min());
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
  if (counters.defined()) {
    const at::Tensor skipped = found_inf.ne(0).to(at::kLong);
    counters.select(0, 0).add_(1 - skipped);
    counters.select(0, 1).add_(skipped);
    counters.select(0, 2).add_(1).mul_(skipped);
  }
}

}  // namespace amp_test
