// CPU kernels of amp's operators (TORCH_LIBRARY_IMPL(amp, CPU, ...)): argument checks, the list
// flattened into dense ranges, then one parallel job over the whole list.
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/cpu/list_kernels.h"
#include "ops/dense_list.h"
#include "ops/op_table.h"
#include "ops/update_rule.h"
#include "ops/validate.h"

namespace amp::detail::cpu {
namespace {

float read_float(const at::Tensor& t) { return *t.data_ptr<float>(); }

ListJob make_job(const DenseList& list, ListMode mode, float factor) {
  ListJob job{};
  job.tensors = list.flat().data();
  job.count = static_cast<int64_t>(list.flat().size());
  job.mode = mode;
  job.factor = factor;
  return job;
}

void unscale_cpu(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                 const std::optional<at::Tensor>& per_tensor_found_inf) {
  check_unscale_args("amp::non_finite_check_and_unscale_", grads, found_inf, inv_scale,
                     per_tensor_found_inf);
  const float inv = read_float(inv_scale);
  DenseList list(grads);
  ListJob job = make_job(list, ListMode::kCheckScale, inv);
  job.found_inf = found_inf.data_ptr<float>();
  job.per_tensor_found = per_tensor_found_inf ? per_tensor_found_inf->data_ptr<float>() : nullptr;
  run_list_job(job);
  if (inv != 1.0f) list.write_back();  // inv_scale == 1 stores nothing
}

std::tuple<at::Tensor, at::Tensor> unscale_norm_cpu(at::TensorList grads,
                                                    const at::Tensor& found_inf,
                                                    const at::Tensor& inv_scale, bool per_tensor) {
  check_unscale_args("amp::unscale_norm", grads, found_inf, inv_scale, std::nullopt);
  const int64_t count = static_cast<int64_t>(grads.size());
  std::vector<double> tensor_sumsq(per_tensor ? count : 0, 0.0);
  double total_sumsq = 0.0;
  DenseList list(grads);
  ListJob job = make_job(list, ListMode::kCheckNorm, read_float(inv_scale));
  job.found_inf = found_inf.data_ptr<float>();
  job.per_tensor_sumsq = per_tensor ? tensor_sumsq.data() : nullptr;
  job.total_sumsq = &total_sumsq;
  run_list_job(job);

  const auto opts = found_inf.options();
  at::Tensor total = at::empty({}, opts);
  *total.data_ptr<float>() = static_cast<float>(std::sqrt(total_sumsq));
  at::Tensor norms = at::empty({per_tensor ? count : 0}, opts);
  float* out = norms.data_ptr<float>();
  for (size_t k = 0; k < tensor_sumsq.size(); ++k) {
    out[k] = static_cast<float>(std::sqrt(tensor_sumsq[k]));
  }
  return {total, norms};
}

void clip_unscaled_cpu(at::TensorList grads, const at::Tensor& inv_scale,
                       const at::Tensor& total_norm, double max_norm, double eps) {
  check_clip_args(grads, inv_scale, total_norm, max_norm, eps);
  const float factor = clip_factor(read_float(inv_scale), read_float(total_norm),
                                   static_cast<float>(max_norm), static_cast<float>(eps));
  DenseList list(grads);
  run_list_job(make_job(list, ListMode::kClip, factor));
  list.write_back();
}

void update_scale_cpu(const UpdateState& state, const UpdateRule& rule) {
  const auto& [scale, growth_tracker, found_inf, hysteresis_remaining, counters] = state;
  apply_update_rule(scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
                    hysteresis_remaining ? hysteresis_remaining->data_ptr<int32_t>() : nullptr,
                    counters ? counters->data_ptr<int64_t>() : nullptr, read_float(found_inf),
                    rule);
}

}  // namespace

TORCH_LIBRARY_IMPL(amp, CPU, m) {
  ops::register_kernels<unscale_cpu, update_scale_cpu, unscale_norm_cpu, clip_unscaled_cpu>(m);
}

}  // namespace amp::detail::cpu
