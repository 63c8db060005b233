// The low-precision optimizer steps on CUDA tensors: checks, launch planning (shared with amp's
// list kernels) and metadata, then the launches of low_precision_kernels.cu on the current
// stream. Nothing here reads a device value: the skip and the step counts stay on the GPU.
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ops/launch_plan.h"
#include "optim/cpu/low_precision_kernels.h"
#include "optim/cuda/low_precision_kernels.cuh"

namespace amp::optim::detail {
namespace {

cuda::StorageType storage_type(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return cuda::StorageType::kFloat;
    case c10::kBFloat16:
      return cuda::StorageType::kBFloat16;
    case c10::kHalf:
      return cuda::StorageType::kHalf;
    default:
      TORCH_CHECK(false, "low-precision optimizer kernels store Float, BFloat16 or Half, not ",
                  dtype);
  }
}

// A 0-dim float32 tensor of the scaler on the parameters' device, as a device pointer.
const float* scaler_value(const at::Tensor& t, const at::Device& device, const char* name) {
  if (!t.defined()) return nullptr;
  TORCH_CHECK(t.device() == device && t.scalar_type() == at::kFloat && t.numel() == 1, name,
              " must be a 1-element float32 tensor on ", device, " (the parameters' device); got ",
              t.scalar_type(), " ", t.sizes(), " on ", t.device(),
              ". Pass the GradScaler of the parameters' device.");
  return t.data_ptr<float>();
}

void* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

template <typename Hyper, typename Launch>
void run_cuda(const std::vector<LowPrecisionSlot>& slots, const Hyper& hyper,
              const LowPrecisionStep& step, bool flag, const Launch& launch) {
  if (slots.empty()) return;
  const at::Device device = slots[0].param.device();
  const c10::cuda::CUDAGuard guard(device);
  cuda::LowPrecisionArgs args{};
  args.param_type = storage_type(slots[0].param.scalar_type());
  args.state_type = storage_type(step.state_dtype);
  args.write_back = step.write_back;
  args.flag = flag;
  args.seed = step.seed;
  args.grad_scale = scaler_value(step.grad_scale, device, "grad_scale");
  args.found_inf = scaler_value(step.found_inf, device, "found_inf");
  TORCH_CHECK(args.param_type != cuda::StorageType::kFloat,
              "low-precision optimizer kernels take bfloat16 or float16 parameters");
  TORCH_CHECK(step.write_back != WriteBack::kStochastic ||
                  args.param_type == cuda::StorageType::kBFloat16,
              "stochastic rounding writes bfloat16 parameters only");

  std::vector<int64_t> numels;
  for (const LowPrecisionSlot& slot : slots) {
    TORCH_CHECK(slot.param.device() == device && slot.step.defined() &&
                    slot.step.device() == device,
                "every parameter of a low-precision step, and its step count, must be on ",
                device);
    numels.push_back(slot.param.numel());
  }
  const auto launches = amp::detail::plan_launches(
      numels, amp::detail::LaunchLimits{cuda::kLowPrecisionChunkElems,
                                        cuda::kLowPrecisionMaxTensors,
                                        cuda::kLowPrecisionMaxBlocks});
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cuda::LowPrecisionMeta meta;
  for (const amp::detail::PlannedLaunch& planned : launches) {
    meta.tensor_count = static_cast<int32_t>(planned.tensors.size());
    meta.block_count = static_cast<int32_t>(planned.blocks.size());
    for (size_t s = 0; s < planned.tensors.size(); ++s) {
      const LowPrecisionSlot& slot = slots[planned.tensors[s]];
      meta.tensor[s] = {ptr(slot.param),  ptr(slot.grad),   slot.master.defined() ? slot.master.data_ptr<float>() : nullptr,
                        ptr(slot.comp),   ptr(slot.state0), ptr(slot.state1),
                        ptr(slot.state2), slot.step.data_ptr<float>(),
                        slot.stream,      slot.param.numel(), slot.first_momentum ? 1 : 0};
    }
    for (size_t b = 0; b < planned.blocks.size(); ++b) {
      TORCH_CHECK(planned.blocks[b].chunk <= INT32_MAX, "a parameter of more than 2^31 chunks of ",
                  cuda::kLowPrecisionChunkElems, " elements is not supported");
      meta.block_tensor[b] = static_cast<uint16_t>(planned.blocks[b].slot);
      meta.block_chunk[b] = static_cast<int32_t>(planned.blocks[b].chunk);
    }
    C10_CUDA_CHECK(launch(meta, hyper, args, stream));
  }
  // Only after every update launch: a parameter split across launches reads one count.
  cuda::StepCounts counts;
  counts.count = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    counts.step[counts.count++] = slots[k].step.data_ptr<float>();
    if (counts.count == cuda::kMaxCountsPerLaunch || k + 1 == slots.size()) {
      C10_CUDA_CHECK(cuda::launch_count_steps(counts, args.found_inf, stream));
      counts.count = 0;
    }
  }
}

}  // namespace

void adam_low_precision_cuda(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& hyper,
                             const LowPrecisionStep& step) {
  run_cuda(slots, hyper, step, hyper.amsgrad, cuda::launch_adam_low_precision);
}

void sgd_low_precision_cuda(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& hyper,
                            const LowPrecisionStep& step) {
  run_cuda(slots, hyper, step, hyper.momentum != 0.0, cuda::launch_sgd_low_precision);
}

}  // namespace amp::optim::detail
