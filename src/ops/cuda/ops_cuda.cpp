// CUDA kernels of amp's operators (TORCH_LIBRARY_IMPL(amp, CUDA, ...)): argument checks, launch
// planning and metadata, then the launches of kernels.cu on the current stream.
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/launch_plan.h"
#include "ops/cuda/kernels.cuh"
#include "ops/dense_list.h"
#include "ops/op_table.h"
#include "ops/validate.h"

namespace amp::detail::cuda {
namespace {

/// Runs the multi-tensor kernel over a whole list, mixed dtypes included, in as few launches as
/// the metadata limits allow; non-dense tensors are written back when the pass stores.
void run_list(at::TensorList grads, const ListArgs& args, bool stores) {
  DenseList list(grads);
  const std::vector<FlatTensor>& flat = list.flat();
  std::vector<int64_t> numels(flat.size());
  for (size_t k = 0; k < flat.size(); ++k) numels[k] = flat[k].numel;
  const auto launches = kernels::plan_launches(
      numels, kernels::LaunchLimits{kChunkElems, kMaxTensorsPerLaunch, kMaxBlocksPerLaunch});
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  LaunchMeta meta;
  for (const kernels::PlannedLaunch& launch : launches) {
    meta.tensor_count = static_cast<int32_t>(launch.tensors.size());
    meta.block_count = static_cast<int32_t>(launch.blocks.size());
    for (size_t s = 0; s < launch.tensors.size(); ++s) {
      const FlatTensor& t = flat[launch.tensors[s]];
      meta.data[s] = t.data;
      meta.numel[s] = t.numel;
      meta.index[s] = static_cast<int32_t>(t.index);
      meta.type[s] = t.type;
    }
    for (size_t b = 0; b < launch.blocks.size(); ++b) {
      TORCH_CHECK(launch.blocks[b].chunk <= INT32_MAX, "amp: a tensor of more than 2^31 chunks of ",
                  kChunkElems, " elements is not supported.");
      meta.block_slot[b] = static_cast<uint16_t>(launch.blocks[b].slot);
      meta.block_chunk[b] = static_cast<int32_t>(launch.blocks[b].chunk);
    }
    C10_CUDA_CHECK(launch_list_kernel(meta, args, stream));
  }
  if (stores) list.write_back();
}

float* float_ptr(const at::Tensor& t) { return t.data_ptr<float>(); }

void unscale_cuda(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                  const std::optional<at::Tensor>& per_tensor_found_inf) {
  check_unscale_args("amp::non_finite_check_and_unscale_", grads, found_inf, inv_scale,
                     per_tensor_found_inf);
  const c10::cuda::CUDAGuard guard(found_inf.device());
  ListArgs args{};
  args.mode = ListMode::kCheckScale;
  args.inv_scale = float_ptr(inv_scale);
  args.found_inf = float_ptr(found_inf);
  args.per_tensor_found = per_tensor_found_inf ? float_ptr(*per_tensor_found_inf) : nullptr;
  // The kernel stores nothing when inv_scale holds 1, so a write-back copies unchanged values.
  run_list(grads, args, /*stores=*/true);
}

std::tuple<at::Tensor, at::Tensor> unscale_norm_cuda(at::TensorList grads,
                                                     const at::Tensor& found_inf,
                                                     const at::Tensor& inv_scale, bool per_tensor) {
  check_unscale_args("amp::unscale_norm", grads, found_inf, inv_scale, std::nullopt);
  const c10::cuda::CUDAGuard guard(found_inf.device());
  const int64_t count = static_cast<int64_t>(grads.size());
  // float64 sums on the device, zeroed asynchronously: [total, per-tensor...], then one partial
  // sum per block of a launch.
  const int64_t sums = 1 + (per_tensor ? count : 0);
  at::Tensor sumsq =
      at::zeros({sums + kMaxBlocksPerLaunch}, found_inf.options().dtype(at::kDouble));
  double* base = sumsq.data_ptr<double>();
  ListArgs args{};
  args.mode = ListMode::kCheckNorm;
  args.inv_scale = float_ptr(inv_scale);
  args.found_inf = float_ptr(found_inf);
  args.total_sumsq = base;
  args.per_tensor_sumsq = per_tensor ? base + 1 : nullptr;
  args.block_sumsq = base + sums;
  run_list(grads, args, /*stores=*/false);

  at::Tensor total = at::empty({}, found_inf.options());
  at::Tensor norms = at::empty({per_tensor ? count : 0}, found_inf.options());
  C10_CUDA_CHECK(launch_finish_norms(args.total_sumsq, float_ptr(total), args.per_tensor_sumsq,
                                     per_tensor ? float_ptr(norms) : nullptr, count,
                                     c10::cuda::getCurrentCUDAStream()));
  return {total, norms};
}

void clip_unscaled_cuda(at::TensorList grads, const at::Tensor& inv_scale,
                        const at::Tensor& total_norm, double max_norm, double eps) {
  check_clip_args(grads, inv_scale, total_norm, max_norm, eps);
  const c10::cuda::CUDAGuard guard(inv_scale.device());
  ListArgs args{};
  args.mode = ListMode::kClip;
  args.inv_scale = float_ptr(inv_scale);
  args.total_norm = float_ptr(total_norm);
  args.max_norm = static_cast<float>(max_norm);
  args.eps = static_cast<float>(eps);
  run_list(grads, args, /*stores=*/true);
}

void update_scale_cuda(const UpdateState& state, const UpdateRule& rule) {
  const auto& [scale, growth_tracker, found_inf, hysteresis_remaining, counters] = state;
  const c10::cuda::CUDAGuard guard(scale.device());
  C10_CUDA_CHECK(launch_update_scale(
      float_ptr(scale), growth_tracker.data_ptr<int32_t>(),
      hysteresis_remaining ? hysteresis_remaining->data_ptr<int32_t>() : nullptr,
      counters ? counters->data_ptr<int64_t>() : nullptr, float_ptr(found_inf), rule,
      c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(amp, CUDA, m) {
  ops::register_kernels<unscale_cuda, update_scale_cuda, unscale_norm_cuda, clip_unscaled_cuda>(m);
}

}  // namespace amp::detail::cuda
