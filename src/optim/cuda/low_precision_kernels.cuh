// Launchers of the low-precision optimizer kernels on CUDA: raw pointers, sizes and a stream, no
// ATen types (low_precision_cuda.cpp does the ATen work, so nvcc never parses ATen's headers).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "optim/low_precision_element.h"

namespace amp::optim::detail::cuda {

/// Threads per block, elements per block (a multiple of 8, as launch planning requires), and the
/// launch metadata's capacity: LowPrecisionMeta travels as a __grid_constant__ kernel parameter,
/// which must stay under CUDA's 32764 bytes.
constexpr int kLowPrecisionThreads = 256;
constexpr int64_t kLowPrecisionChunkElems = 16384;
constexpr int kLowPrecisionMaxTensors = 96;
constexpr int kLowPrecisionMaxBlocks = 2048;

enum class StorageType : int32_t { kFloat, kBFloat16, kHalf };

/// One parameter's device pointers (null where the step keeps no such tensor).
struct LowPrecisionTensor {
  void* param;
  void* grad;
  float* master;
  void* comp;
  void* state0;
  void* state1;
  void* state2;
  float* step;  // the count before this step; read, never written, by the update kernel
  uint64_t stream;
  int64_t numel;
  int32_t first_momentum;
};

struct LowPrecisionMeta {
  LowPrecisionTensor tensor[kLowPrecisionMaxTensors];
  uint16_t block_tensor[kLowPrecisionMaxBlocks];
  int32_t block_chunk[kLowPrecisionMaxBlocks];
  int32_t tensor_count;
  int32_t block_count;
};
static_assert(sizeof(LowPrecisionMeta) + 256 <= 32764,
              "LowPrecisionMeta exceeds the kernel parameter limit");

/// What the whole step shares: the instantiation and the scaler's device values.
struct LowPrecisionArgs {
  StorageType param_type;  // kBFloat16 or kHalf
  StorageType state_type;
  WriteBack write_back;
  bool flag;  // Adam: amsgrad; SGD: momentum
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

/// Queues one launch of the update over meta's blocks on `stream`; cudaSuccess when queued.
cudaError_t launch_adam_low_precision(const LowPrecisionMeta& meta, const AdamHyper& hyper,
                                      const LowPrecisionArgs& args, cudaStream_t stream);
cudaError_t launch_sgd_low_precision(const LowPrecisionMeta& meta, const SgdHyper& hyper,
                                     const LowPrecisionArgs& args, cudaStream_t stream);

/// Adds one to each count unless *found_inf is non-zero; queued after every update launch of the
/// step (the updates read the count before the increment, as the CPU path's arithmetic expects).
cudaError_t launch_count_steps(const StepCounts& counts, const float* found_inf,
                               cudaStream_t stream);

}  // namespace amp::optim::detail::cuda
