// amp's operators: their registration with the dispatcher (TORCH_LIBRARY(amp, ...)) and the
// public C++ functions, which call them through the dispatcher so that picking the CPU, CUDA or
// fallback kernel is the dispatcher's job.
#include <amp/ops.h>

#include <torch/library.h>

#include "ops/op_table.h"

TORCH_LIBRARY(amp, m) {
  using namespace amp::detail::ops;
  m.def(NonFiniteCheckAndUnscale::kSchema);
  m.def(UpdateScale::kSchema);
  m.def(UnscaleNorm::kSchema);
  m.def(ClipUnscaled::kSchema);
}

namespace amp {

using detail::ops::handle;

void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale,
                                   const std::optional<at::Tensor>& per_tensor_found_inf) {
  handle<detail::ops::NonFiniteCheckAndUnscale>().call(grads, found_inf, inv_scale,
                                                       per_tensor_found_inf);
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval,
                   const std::optional<at::Tensor>& hysteresis_remaining,
                   const std::optional<at::Tensor>& counters,
                   const ScaleUpdateExtensions& extensions) {
  handle<detail::ops::UpdateScale>().call(
      scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval,
      hysteresis_remaining, counters, extensions.hysteresis, extensions.consecutive_hysteresis,
      extensions.min_scale, std::optional<double>(extensions.max_scale));
}

std::tuple<at::Tensor, at::Tensor> unscale_norm(at::TensorList grads, at::Tensor& found_inf,
                                                const at::Tensor& inv_scale, bool per_tensor) {
  return handle<detail::ops::UnscaleNorm>().call(grads, found_inf, inv_scale, per_tensor);
}

void clip_unscaled_(at::TensorList grads, const at::Tensor& inv_scale, const at::Tensor& total_norm,
                    double max_norm, double eps) {
  handle<detail::ops::ClipUnscaled>().call(grads, inv_scale, total_norm, max_norm, eps);
}

}  // namespace amp
