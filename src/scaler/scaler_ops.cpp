// The scaler's kernel seam: GradScaler's gradient and scale work goes through these functions
// only, and they call amp's fused ops (amp/ops.h), which dispatch to the CPU or CUDA kernels.
#include "scaler/scaler_ops.h"

#include <ATen/ATen.h>

#include <amp/ops.h>

namespace amp::detail {

void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale) {
  amp::non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

at::Tensor unscale_norm_(at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  return std::get<0>(amp::unscale_norm(grads, found_inf, inv_scale));
}

void clip_unscaled_(at::TensorList grads, const at::Tensor& inv_scale, const at::Tensor& total_norm,
                    double max_norm, double eps) {
  amp::clip_unscaled_(grads, inv_scale, total_norm, max_norm, eps);
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  amp::update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                     growth_interval);
}

void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                            at::Tensor& hysteresis_remaining, at::Tensor& counters,
                            const at::Tensor& found_inf, const ScaleUpdateOptions& options) {
  amp::update_scale_extended_(scale, growth_tracker, hysteresis_remaining, counters, found_inf,
                              options);
}

void advance_counters_(at::Tensor& counters, const at::Tensor& found_inf) {
  const at::Tensor skipped = found_inf.ne(0).to(at::kLong);
  counters.select(0, 0).add_(1 - skipped);
  counters.select(0, 1).add_(skipped);
  counters.select(0, 2).add_(1).mul_(skipped);
}

}  // namespace amp::detail
