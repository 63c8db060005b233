// Launchers of the step engine's CUDA kernel: raw pointers, sizes and a stream, no ATen types
// (rule_step_cuda.cpp does the ATen work, so nvcc never parses ATen's headers).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "optim/engine/instances.h"

namespace amp::optim::detail::cuda {

/// Threads per block, elements per block (a multiple of 8, as launch planning requires), and the
/// launch metadata's capacity: StepMeta travels as a __grid_constant__ kernel parameter, which
/// must stay under CUDA's 32764 bytes (with the largest rule's Hyper next to it).
constexpr int kStepThreads = 256;
constexpr int64_t kStepChunkElems = 16384;
constexpr int kStepMaxTensors = 96;
constexpr int kStepMaxBlocks = 2048;

/// One parameter's device pointers (null where the step keeps no such tensor).
struct StepTensor {
  void* param;
  void* grad;
  float* master;
  void* comp;
  void* state[kMaxStateSlots];  // by the rule's slot names
  float* step;  // the count before this step; read, never written, by the update kernel
  uint64_t stream;
  int64_t numel;
  int32_t first;  // the rule's state is new (SGD's momentum)
};

struct StepMeta {
  StepTensor tensor[kStepMaxTensors];
  uint16_t block_tensor[kStepMaxBlocks];
  int32_t block_chunk[kStepMaxBlocks];
  int32_t tensor_count;
  int32_t block_count;
};
static_assert(sizeof(StepMeta) + 256 <= 32764, "StepMeta exceeds the kernel parameter limit");

/// What the whole step shares: the instantiation and the scaler's device values.
struct StepLaunchArgs {
  StepKind kind;  // checked against the legal matrix by the host (step_kind)
  uint64_t seed;
  const float* grad_scale;  // null: the gradients are not scaled
  const float* found_inf;   // null: never skip
};

/// The step counts a launch of count_steps adds one to (unless found_inf is set).
constexpr int kMaxCountsPerLaunch = 1024;
struct StepCounts {
  float* step[kMaxCountsPerLaunch];
  int32_t count;
};

/// Queues one launch of rule `args.kind.rule` over meta's blocks on `stream`; `hyper` points to the
/// rule's Hyper. cudaSuccess when queued, cudaErrorInvalidValue for a combination no kernel is
/// built for.
cudaError_t launch_rule_step(const StepMeta& meta, const void* hyper, const StepLaunchArgs& args,
                             cudaStream_t stream);

/// Adds one to each count unless *found_inf is non-zero; queued after every update launch of the
/// step (the updates read the count before the increment, as the CPU path's arithmetic expects).
cudaError_t launch_count_steps(const StepCounts& counts, const float* found_inf,
                               cudaStream_t stream);

}  // namespace amp::optim::detail::cuda
