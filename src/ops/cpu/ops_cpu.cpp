// CPU kernels of amp's operators (TORCH_LIBRARY_IMPL(amp, CPU, ...)): argument checks, the list
// flattened into dense ranges, then one parallel job over the whole list.
#include <cmath>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/cpu/list_kernels.h"
#include "ops/update_rule.h"
#include "ops/validate.h"

namespace amp::detail::cpu {
namespace {

/// The list as flat dense ranges. A dense tensor (contiguous in any dimension order, offset views
/// included) is processed where it lies; any other layout goes through a contiguous copy that
/// write_back() copies into the original.
class FlatList {
 public:
  explicit FlatList(at::TensorList grads) {
    flat_.reserve(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      const at::Tensor& g = grads[i];
      if (g.numel() == 0) continue;
      at::Tensor dense = g;
      if (!g.is_non_overlapping_and_dense()) {
        dense = g.contiguous();
        copies_.emplace_back(g, dense);
      }
      flat_.push_back(FlatTensor{dense.data_ptr(), dense.numel(), elem_type(g.scalar_type()),
                                 static_cast<int64_t>(i)});
    }
  }

  ListJob job(ListMode mode, float factor) const {
    ListJob job{};
    job.tensors = flat_.data();
    job.count = static_cast<int64_t>(flat_.size());
    job.mode = mode;
    job.factor = factor;
    return job;
  }

  void write_back() {
    for (auto& [original, dense] : copies_) original.copy_(dense);
  }

 private:
  std::vector<FlatTensor> flat_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_;
};

float read_float(const at::Tensor& t) { return *t.data_ptr<float>(); }

void unscale_cpu(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                 const std::optional<at::Tensor>& per_tensor_found_inf) {
  const at::Tensor* per_tensor = per_tensor_found_inf ? &*per_tensor_found_inf : nullptr;
  check_unscale_args("amp::non_finite_check_and_unscale_", grads, found_inf, inv_scale, per_tensor);
  const float inv = read_float(inv_scale);
  // As ATen: inv_scale == 1 leaves the values untouched, so only check them (no store at all).
  const ListMode mode = inv == 1.0f ? ListMode::kCheck : ListMode::kCheckScale;
  FlatList list(grads);
  ListJob job = list.job(mode, inv);
  job.found_inf = found_inf.data_ptr<float>();
  job.per_tensor_found = per_tensor ? per_tensor->data_ptr<float>() : nullptr;
  run_list_job(job);
  if (mode == ListMode::kCheckScale) list.write_back();
}

std::tuple<at::Tensor, at::Tensor> unscale_norm_cpu(at::TensorList grads,
                                                    const at::Tensor& found_inf,
                                                    const at::Tensor& inv_scale, bool per_tensor) {
  check_unscale_args("amp::unscale_norm", grads, found_inf, inv_scale, nullptr);
  const int64_t count = static_cast<int64_t>(grads.size());
  std::vector<double> tensor_sumsq(per_tensor ? count : 0, 0.0);
  double total_sumsq = 0.0;
  FlatList list(grads);
  ListJob job = list.job(ListMode::kCheckNorm, read_float(inv_scale));
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
  check_clip_args("amp::clip_unscaled_", grads, inv_scale, total_norm, max_norm, eps);
  // float32 arithmetic, as clip_grad_norm_ forms its coefficient from a float32 norm.
  const float coef =
      static_cast<float>(max_norm) / (read_float(total_norm) + static_cast<float>(eps));
  const float factor = read_float(inv_scale) * (coef < 1.0f ? coef : 1.0f);
  FlatList list(grads);
  run_list_job(list.job(ListMode::kScale, factor));
  list.write_back();
}

void update_scale_cpu(const at::Tensor& scale, const at::Tensor& growth_tracker,
                      const at::Tensor& found_inf, double growth_factor, double backoff_factor,
                      int64_t growth_interval) {
  check_update_args("amp::update_scale_", scale, growth_tracker, found_inf, growth_interval,
                    nullptr, nullptr);
  apply_update_rule(scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
                    read_float(found_inf), growth_factor, backoff_factor, growth_interval);
}

void update_scale_extended_cpu(const at::Tensor& scale, const at::Tensor& growth_tracker,
                               const at::Tensor& hysteresis_remaining,
                               const std::optional<at::Tensor>& counters,
                               const at::Tensor& found_inf, double growth_factor,
                               double backoff_factor, int64_t growth_interval, int64_t hysteresis,
                               bool consecutive_hysteresis, double min_scale, double max_scale) {
  const ExtendedRule rule = check_extended_update_args(
      scale, growth_tracker, hysteresis_remaining, counters, found_inf, growth_factor,
      backoff_factor, growth_interval, hysteresis, consecutive_hysteresis, min_scale, max_scale);
  apply_extended_rule(scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
                      hysteresis_remaining.data_ptr<int32_t>(),
                      counters ? counters->data_ptr<int64_t>() : nullptr, read_float(found_inf),
                      rule);
}

}  // namespace
}  // namespace amp::detail::cpu

TORCH_LIBRARY_IMPL(amp, CPU, m) {
  using namespace amp::detail::cpu;
  m.impl("non_finite_check_and_unscale_", TORCH_FN(unscale_cpu));
  m.impl("update_scale_", TORCH_FN(update_scale_cpu));
  m.impl("update_scale_extended_", TORCH_FN(update_scale_extended_cpu));
  m.impl("unscale_norm", TORCH_FN(unscale_norm_cpu));
  m.impl("clip_unscaled_", TORCH_FN(clip_unscaled_cpu));
}
