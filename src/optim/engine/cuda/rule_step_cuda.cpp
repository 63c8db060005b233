// The step engine on CUDA tensors: checks, launch planning (kernels/launch_plan.h, shared with
// amp's list kernels) and metadata, then the launches of rule_kernels.cu on the current stream.
// Nothing here reads a device value: the skip and the step counts stay on the GPU. Registers
// itself as the CUDA entry of the engine's dispatch (step.h).
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/launch_plan.h"
#include "optim/engine/cuda/rule_kernels.cuh"
#include "optim/engine/step.h"

namespace amp::optim::detail {
namespace {

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

// The variant of `rule` for `hyper` (Adam's amsgrad, SGD's momentum).
bool rule_variant(size_t rule, const void* hyper) {
  bool variant = false;
  engine::with_rule(rule, [&](auto r) {
    using Rule = decltype(r);
    variant = Rule::variant(*static_cast<const typename Rule::Hyper*>(hyper));
  });
  return variant;
}

void rule_step_cuda(size_t rule, const std::vector<StepSlot>& slots, const void* hyper,
                    const StepArgs& step) {
  if (slots.empty()) return;
  const at::Device device = slots[0].param.device();
  const c10::cuda::CUDAGuard guard(device);
  cuda::StepLaunchArgs args{};
  args.kind = step_kind(rule, slots, step, rule_variant(rule, hyper));
  args.seed = step.seed;
  args.grad_scale = scaler_value(step.grad_scale, device, "grad_scale");
  args.found_inf = scaler_value(step.found_inf, device, "found_inf");

  std::vector<int64_t> numels;
  for (const StepSlot& slot : slots) {
    TORCH_CHECK(
        slot.param.device() == device && slot.step.defined() && slot.step.device() == device,
        "every parameter of a step, and its step count, must be on ", device);
    numels.push_back(slot.param.numel());
  }
  const auto launches = kernels::plan_launches(
      numels,
      kernels::LaunchLimits{cuda::kStepChunkElems, cuda::kStepMaxTensors, cuda::kStepMaxBlocks});
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cuda::StepMeta meta;
  for (const kernels::PlannedLaunch& planned : launches) {
    meta.tensor_count = static_cast<int32_t>(planned.tensors.size());
    meta.block_count = static_cast<int32_t>(planned.blocks.size());
    for (size_t s = 0; s < planned.tensors.size(); ++s) {
      const StepSlot& slot = slots[planned.tensors[s]];
      cuda::StepTensor& t = meta.tensor[s];
      t.param = ptr(slot.param);
      t.grad = ptr(slot.grad);
      t.master = slot.master.defined() ? slot.master.data_ptr<float>() : nullptr;
      t.comp = ptr(slot.comp);
      for (int k = 0; k < kMaxStateSlots; ++k) t.state[k] = ptr(slot.state[k]);
      t.step = slot.step.data_ptr<float>();
      t.stream = slot.stream;
      t.numel = slot.param.numel();
      t.first = slot.first ? 1 : 0;
    }
    for (size_t b = 0; b < planned.blocks.size(); ++b) {
      TORCH_CHECK(planned.blocks[b].chunk <= INT32_MAX, "a parameter of more than 2^31 chunks of ",
                  cuda::kStepChunkElems, " elements is not supported");
      meta.block_tensor[b] = static_cast<uint16_t>(planned.blocks[b].slot);
      meta.block_chunk[b] = static_cast<int32_t>(planned.blocks[b].chunk);
    }
    const cudaError_t status = cuda::launch_rule_step(meta, hyper, args, stream);
    TORCH_CHECK(status != cudaErrorInvalidValue,
                "amp's optimizer step engine has no CUDA kernel for these dtypes and write-back");
    C10_CUDA_CHECK(status);
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

AMP_REGISTER_CUDA_KERNEL(rule_step, rule_step_cuda);

}  // namespace amp::optim::detail
