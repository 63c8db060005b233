// Prototypes of amp's CUDA kernels' launchers: raw pointers, sizes and a stream, no ATen types
// (the .cpp glue does the ATen work, so nvcc never parses ATen's headers).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/kernel_common.h"
#include "ops/update_rule.h"

namespace amp::detail::cuda {

/// Threads per block and elements per block of the multi-tensor kernels. A chunk's element
/// offsets fit in 32 bits; only the chunk's start needs 64.
constexpr int kBlockThreads = 512;
constexpr int64_t kChunkElems = 65536;

// Metadata travels as a kernel parameter (__grid_constant__: read in place, never copied to
// local memory). CUDA 12.1+ on Volta and later allows 32764 bytes of parameters; these limits
// keep LaunchMeta plus the other arguments below that.
constexpr int kMaxTensorsPerLaunch = 256;
constexpr int kMaxBlocksPerLaunch = 3072;

/// What one launch sees: its tensors and, per block, which tensor slot and which chunk.
struct LaunchMeta {
  void* data[kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  int32_t index[kMaxTensorsPerLaunch];  // position in the caller's list
  kernels::Dtype type[kMaxTensorsPerLaunch];
  uint16_t block_slot[kMaxBlocksPerLaunch];
  int32_t block_chunk[kMaxBlocksPerLaunch];
  int32_t tensor_count;  // slots in use
  int32_t block_count;   // blocks in use
};
static_assert(sizeof(LaunchMeta) + 128 <= 32764, "LaunchMeta exceeds the kernel parameter limit");

/// Device pointers and scalars a multi-tensor launch needs besides its metadata.
struct ListArgs {
  ListMode mode;
  const float* inv_scale;    // read on the device; 1.0 means check only (no store)
  float* found_inf;          // set to 1.0 on a non-finite value (check modes)
  float* per_tensor_found;   // optional, per caller index
  double* block_sumsq;       // kCheckNorm: kMaxBlocksPerLaunch partial sums, one per block
  double* per_tensor_sumsq;  // kCheckNorm, optional, per caller index, zeroed by the caller
  double* total_sumsq;       // kCheckNorm, zeroed by the caller
  const float* total_norm;   // kClip
  float max_norm;            // kClip
  float eps;                 // kClip
};

/// Launches the multi-tensor kernel over meta.block_count blocks on `stream`. In kCheckNorm mode
/// a second, one-block kernel then adds the launch's block sums into total_sumsq and
/// per_tensor_sumsq in a fixed order (no atomics: the norm is the same bits on every run).
/// Returns: the launches' error status (cudaSuccess when they were queued).
cudaError_t launch_list_kernel(const LaunchMeta& meta, const ListArgs& args, cudaStream_t stream);

/// Writes sqrt of the sums of squares: total_norm[0] and, when per_tensor_norms is not null,
/// per_tensor_norms[0..count).
cudaError_t launch_finish_norms(const double* total_sumsq, float* total_norm,
                                const double* per_tensor_sumsq, float* per_tensor_norms,
                                int64_t count, cudaStream_t stream);

/// The scale update (update_rule.h) in one device thread (no sync); remaining and counters may
/// be null.
cudaError_t launch_update_scale(float* scale, int32_t* growth_tracker, int32_t* remaining,
                                int64_t* counters, const float* found_inf, const UpdateRule& rule,
                                cudaStream_t stream);

}  // namespace amp::detail::cuda
