// Prototypes of amp's CUDA kernels' launchers: raw pointers, sizes and a stream, no ATen types
// (the .cpp glue does the ATen work, so nvcc never parses ATen's headers).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/elem_type.h"
#include "ops/update_rule.h"

namespace amp::detail::cuda {

/// Threads per block and elements per block of the multi-tensor kernels.
constexpr int kBlockThreads = 512;
constexpr int64_t kChunkElems = 65536;

// Metadata travels as a kernel parameter. CUDA 12.1+ on Volta and later allows 32764 bytes of
// parameters; these limits keep LaunchMeta plus the other arguments below that.
constexpr int kMaxTensorsPerLaunch = 256;
constexpr int kMaxBlocksPerLaunch = 3072;

/// What one launch sees: its tensors and, per block, which tensor slot and which chunk.
struct LaunchMeta {
  void* data[kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  int32_t index[kMaxTensorsPerLaunch];  // position in the caller's list
  ElemType type[kMaxTensorsPerLaunch];
  uint16_t block_slot[kMaxBlocksPerLaunch];
  int32_t block_chunk[kMaxBlocksPerLaunch];
};
static_assert(sizeof(LaunchMeta) + 128 <= 32764, "LaunchMeta exceeds the kernel parameter limit");

/// What the multi-tensor kernel does to every element.
enum class ListMode : uint8_t { kCheckScale, kCheckNorm, kClip };

/// Device pointers and scalars a multi-tensor launch needs besides its metadata.
struct ListArgs {
  ListMode mode;
  const float* inv_scale;    // read on the device; 1.0 means check only (no store)
  float* found_inf;          // set to 1.0 on a non-finite value (check modes)
  float* per_tensor_found;   // optional, per caller index
  double* per_tensor_sumsq;  // kCheckNorm, optional, per caller index, zeroed by the caller
  double* total_sumsq;       // kCheckNorm, zeroed by the caller
  const float* total_norm;   // kClip
  float max_norm;            // kClip
  float eps;                 // kClip
};

/// Launches the multi-tensor kernel over `blocks` blocks of `meta` on `stream`.
/// Returns: the launch's error status (cudaSuccess when it was queued).
cudaError_t launch_list_kernel(const LaunchMeta& meta, int blocks, const ListArgs& args,
                               cudaStream_t stream);

/// Writes sqrt of the sums of squares: total_norm[0] and, when per_tensor_norms is not null,
/// per_tensor_norms[0..count).
cudaError_t launch_finish_norms(const double* total_sumsq, float* total_norm,
                                const double* per_tensor_sumsq, float* per_tensor_norms,
                                int64_t count, cudaStream_t stream);

/// torch.amp's scale update in one device thread (no sync).
cudaError_t launch_update_scale(float* scale, int32_t* growth_tracker, const float* found_inf,
                                double growth_factor, double backoff_factor,
                                int64_t growth_interval, cudaStream_t stream);

/// The extended update in one device thread (counters may be null).
cudaError_t launch_update_scale_extended(float* scale, int32_t* growth_tracker,
                                         int32_t* hysteresis_remaining, int64_t* counters,
                                         const float* found_inf, const ExtendedRule& rule,
                                         cudaStream_t stream);

}  // namespace amp::detail::cuda
