// CUDA kernels of amp's operators (TORCH_LIBRARY_IMPL(amp, CUDA, ...)): argument checks, launch
// planning and metadata, then the launches of kernels.cu on the current stream.
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/cuda/kernels.cuh"
#include "ops/launch_plan.h"
#include "ops/validate.h"

namespace amp::detail::cuda {
namespace {

/// Runs the multi-tensor kernel over a whole list, mixed dtypes included, in as few launches as
/// the metadata limits allow. Tensors that are not dense go through a contiguous copy that is
/// copied back afterwards when the mode stores.
void run_list(at::TensorList grads, const ListArgs& args) {
  std::vector<at::Tensor> dense(grads.size());
  std::vector<int64_t> numels(grads.size());
  std::vector<size_t> copied;
  for (size_t i = 0; i < grads.size(); ++i) {
    dense[i] = grads[i];
    if (grads[i].numel() > 0 && !grads[i].is_non_overlapping_and_dense()) {
      dense[i] = grads[i].contiguous();
      copied.push_back(i);
    }
    numels[i] = grads[i].numel();
  }
  const auto launches =
      plan_launches(numels, LaunchLimits{kChunkElems, kMaxTensorsPerLaunch, kMaxBlocksPerLaunch});
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  LaunchMeta meta;
  for (const PlannedLaunch& launch : launches) {
    for (size_t s = 0; s < launch.tensors.size(); ++s) {
      const at::Tensor& t = dense[launch.tensors[s]];
      meta.data[s] = t.data_ptr();
      meta.numel[s] = t.numel();
      meta.index[s] = static_cast<int32_t>(launch.tensors[s]);
      meta.type[s] = elem_type(t.scalar_type());
    }
    for (size_t b = 0; b < launch.blocks.size(); ++b) {
      TORCH_CHECK(launch.blocks[b].chunk <= INT32_MAX, "amp: a tensor of more than 2^31 chunks of ",
                  kChunkElems, " elements is not supported.");
      meta.block_slot[b] = static_cast<uint16_t>(launch.blocks[b].slot);
      meta.block_chunk[b] = static_cast<int32_t>(launch.blocks[b].chunk);
    }
    C10_CUDA_CHECK(launch_list_kernel(meta, static_cast<int>(launch.blocks.size()), args, stream));
  }
  if (args.mode != ListMode::kCheckNorm) {
    for (size_t i : copied) grads[i].copy_(dense[i]);
  }
}

void unscale_cuda(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                  const std::optional<at::Tensor>& per_tensor_found_inf) {
  const at::Tensor* per_tensor = per_tensor_found_inf ? &*per_tensor_found_inf : nullptr;
  check_unscale_args("amp::non_finite_check_and_unscale_", grads, found_inf, inv_scale, per_tensor);
  const c10::cuda::CUDAGuard guard(found_inf.device());
  ListArgs args{};
  args.mode = ListMode::kCheckScale;
  args.inv_scale = inv_scale.data_ptr<float>();
  args.found_inf = found_inf.data_ptr<float>();
  args.per_tensor_found = per_tensor ? per_tensor->data_ptr<float>() : nullptr;
  run_list(grads, args);
}

std::tuple<at::Tensor, at::Tensor> unscale_norm_cuda(at::TensorList grads,
                                                     const at::Tensor& found_inf,
                                                     const at::Tensor& inv_scale, bool per_tensor) {
  check_unscale_args("amp::unscale_norm", grads, found_inf, inv_scale, nullptr);
  const c10::cuda::CUDAGuard guard(found_inf.device());
  const int64_t count = static_cast<int64_t>(grads.size());
  // Sums of squares in float64 on the device: [total, per-tensor...], zeroed asynchronously.
  at::Tensor sumsq =
      at::zeros({1 + (per_tensor ? count : 0)}, found_inf.options().dtype(at::kDouble));
  ListArgs args{};
  args.mode = ListMode::kCheckNorm;
  args.inv_scale = inv_scale.data_ptr<float>();
  args.found_inf = found_inf.data_ptr<float>();
  args.total_sumsq = sumsq.data_ptr<double>();
  args.per_tensor_sumsq = per_tensor ? sumsq.data_ptr<double>() + 1 : nullptr;
  run_list(grads, args);

  at::Tensor total = at::empty({}, found_inf.options());
  at::Tensor norms = at::empty({per_tensor ? count : 0}, found_inf.options());
  C10_CUDA_CHECK(launch_finish_norms(
      args.total_sumsq, total.data_ptr<float>(), args.per_tensor_sumsq,
      per_tensor ? norms.data_ptr<float>() : nullptr, count, c10::cuda::getCurrentCUDAStream()));
  return {total, norms};
}

void clip_unscaled_cuda(at::TensorList grads, const at::Tensor& inv_scale,
                        const at::Tensor& total_norm, double max_norm, double eps) {
  check_clip_args("amp::clip_unscaled_", grads, inv_scale, total_norm, max_norm, eps);
  const c10::cuda::CUDAGuard guard(inv_scale.device());
  ListArgs args{};
  args.mode = ListMode::kClip;
  args.inv_scale = inv_scale.data_ptr<float>();
  args.total_norm = total_norm.data_ptr<float>();
  args.max_norm = static_cast<float>(max_norm);
  args.eps = static_cast<float>(eps);
  run_list(grads, args);
}

void update_scale_cuda(const at::Tensor& scale, const at::Tensor& growth_tracker,
                       const at::Tensor& found_inf, double growth_factor, double backoff_factor,
                       int64_t growth_interval) {
  check_update_args("amp::update_scale_", scale, growth_tracker, found_inf, growth_interval,
                    nullptr, nullptr);
  const c10::cuda::CUDAGuard guard(scale.device());
  C10_CUDA_CHECK(launch_update_scale(scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
                                     found_inf.data_ptr<float>(), growth_factor, backoff_factor,
                                     growth_interval, c10::cuda::getCurrentCUDAStream()));
}

void update_scale_extended_cuda(const at::Tensor& scale, const at::Tensor& growth_tracker,
                                const at::Tensor& hysteresis_remaining,
                                const std::optional<at::Tensor>& counters,
                                const at::Tensor& found_inf, double growth_factor,
                                double backoff_factor, int64_t growth_interval, int64_t hysteresis,
                                bool consecutive_hysteresis, double min_scale, double max_scale) {
  const ExtendedRule rule = check_extended_update_args(
      scale, growth_tracker, hysteresis_remaining, counters, found_inf, growth_factor,
      backoff_factor, growth_interval, hysteresis, consecutive_hysteresis, min_scale, max_scale);
  const c10::cuda::CUDAGuard guard(scale.device());
  C10_CUDA_CHECK(launch_update_scale_extended(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
      hysteresis_remaining.data_ptr<int32_t>(), counters ? counters->data_ptr<int64_t>() : nullptr,
      found_inf.data_ptr<float>(), rule, c10::cuda::getCurrentCUDAStream()));
}

}  // namespace
}  // namespace amp::detail::cuda

TORCH_LIBRARY_IMPL(amp, CUDA, m) {
  using namespace amp::detail::cuda;
  m.impl("non_finite_check_and_unscale_", TORCH_FN(unscale_cuda));
  m.impl("update_scale_", TORCH_FN(update_scale_cuda));
  m.impl("update_scale_extended_", TORCH_FN(update_scale_extended_cuda));
  m.impl("unscale_norm", TORCH_FN(unscale_norm_cuda));
  m.impl("clip_unscaled_", TORCH_FN(clip_unscaled_cuda));
}
