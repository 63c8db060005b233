// The fused float8 cast kernels: an amax pass (block maxima of |x| keys, one atomicMax per block
// and per row or column it covers), the scale of each amax, and the cast through a 32 x 32
// shared-memory tile that writes the row-major and the column-major float8 copies each along its
// own contiguous dim. The arithmetic is cast_element.h's, the same the CPU loops run.
#include "fp8/cuda/cast_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace amp::fp8::cuda {
namespace {

using cast_element::Format;
using cast_element::kTile;
using cast_element::MatrixView;
using cast_element::ScaleAxis;
using cast_element::TileGrid;

// Threads per block: kTile x kRowsPerPass; each thread covers kTile / kRowsPerPass elements of a
// tile.
constexpr int kRowsPerPass = 8;
constexpr int kMaxGrid = 65535 * 4;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }

// Whether walking a tile should put the lanes of a warp along columns (the input's contiguous
// dim is the column one) or along rows.
__device__ __forceinline__ bool lanes_along_columns(const MatrixView& v) {
  return v.col_stride == 1 || v.row_stride != 1;
}

// Visits the elements (i, j) of tile `t` this thread owns (tile-relative, inside the matrix),
// lanes along the dim `columns` says, so that a warp reads consecutive addresses.
template <typename Visit>
__device__ __forceinline__ void for_tile_elements(const TileGrid& grid, int64_t t, bool columns,
                                                  const Visit& visit) {
  const int64_t height = grid.height(t), width = grid.width(t);
  for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
    const int i = columns ? k : threadIdx.x;
    const int j = columns ? threadIdx.x : k;
    if (i < height && j < width) visit(i, j);
  }
}

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// One atomicMax of the block's largest key (every thread of the block calls it).
__device__ __forceinline__ void block_max_into(uint32_t key, uint32_t* target) {
  __shared__ uint32_t warps[kRowsPerPass];
  key = warp_max(key);
  if (threadIdx.x == 0) warps[threadIdx.y] = key;
  __syncthreads();
  if (threadIdx.y == 0 && threadIdx.x == 0) {
    uint32_t block = 0u;
    for (int w = 0; w < kRowsPerPass; ++w) block = max(block, warps[w]);
    if (block != 0u) atomicMax(target, block);
  }
}

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, TileGrid grid, MatrixView view, ScaleAxis axis,
                            bool ignore_nan, uint32_t* __restrict__ keys) {
  __shared__ uint32_t lines[kTile];  // per-row or per-column maxima of the tile
  const bool columns = lanes_along_columns(view);
  uint32_t key = 0u;  // kTensor: this thread's maximum over all its tiles
  for (int64_t t = blockIdx.x; t < grid.tiles(); t += gridDim.x) {
    if (axis != ScaleAxis::kTensor) {
      if (threadIdx.y == 0) lines[threadIdx.x] = 0u;
      __syncthreads();
    }
    const int64_t r0 = grid.row0(t), c0 = grid.col0(t);
    for_tile_elements(grid, t, columns, [&](int i, int j) {
      const float value = load(x, view.at(r0 + i, c0 + j));
      const uint32_t k =
          ignore_nan ? cast_element::amax_key_ignoring_nan(value) : cast_element::amax_key(value);
      if (axis == ScaleAxis::kTensor) {
        key = max(key, k);
      } else {
        atomicMax(&lines[axis == ScaleAxis::kRow ? i : j], k);
      }
    });
    if (axis != ScaleAxis::kTensor) {
      __syncthreads();
      const int64_t extent = axis == ScaleAxis::kRow ? grid.height(t) : grid.width(t);
      if (threadIdx.y == 0 && threadIdx.x < extent) {
        const int64_t line = (axis == ScaleAxis::kRow ? r0 : c0) + threadIdx.x;
        atomicMax(&keys[line], lines[threadIdx.x]);
      }
      __syncthreads();
    }
  }
  if (axis == ScaleAxis::kTensor) block_max_into(key, keys);
}

__global__ void scale_kernel(const uint32_t* __restrict__ keys, int64_t count, Format format,
                             bool power_of_2, float* __restrict__ scale) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    scale[i] = cast_element::scale_from_amax(cast_element::key_amax(keys[i]), format, power_of_2);
  }
}

template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, TileGrid grid, MatrixView view,
                                const float* __restrict__ scale, ScaleAxis axis, Format format,
                                Output2d data, Output2d alternate, uint32_t* amax_keys) {
  __shared__ uint8_t tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed walk
  const bool in_columns = lanes_along_columns(view);
  const bool out_columns = lanes_along_columns(data.view);
  const bool alt_columns = lanes_along_columns(alternate.view);
  uint32_t key = 0u;
  for (int64_t t = blockIdx.x; t < grid.tiles(); t += gridDim.x) {
    const int64_t r0 = grid.row0(t), c0 = grid.col0(t);
    for_tile_elements(grid, t, in_columns, [&](int i, int j) {
      const float value = load(x, view.at(r0 + i, c0 + j));
      const float s = scale[axis == ScaleAxis::kTensor ? 0
                            : axis == ScaleAxis::kRow  ? r0 + i
                                                       : c0 + j];
      tile[i][j] = cast_element::quantize(value, s, format);
      if (amax_keys != nullptr) key = max(key, cast_element::amax_key_ignoring_nan(value));
    });
    __syncthreads();
    for_tile_elements(grid, t, out_columns,
                      [&](int i, int j) { data.data[data.view.at(r0 + i, c0 + j)] = tile[i][j]; });
    if (alternate.data != nullptr) {
      for_tile_elements(grid, t, alt_columns, [&](int i, int j) {
        alternate.data[alternate.view.at(r0 + i, c0 + j)] = tile[i][j];
      });
    }
    __syncthreads();
  }
  if (amax_keys != nullptr) block_max_into(key, amax_keys);
}

unsigned int blocks_for(const TileGrid& grid) {
  const int64_t tiles = grid.tiles();
  return static_cast<unsigned int>(tiles < kMaxGrid ? tiles : kMaxGrid);
}

template <typename Launch>
cudaError_t with_type(const Input2d& x, const Launch& launch) {
  switch (x.type) {
    case kernels::Dtype::kFloat:
      launch(static_cast<const float*>(x.data));
      break;
    case kernels::Dtype::kBFloat16:
      launch(static_cast<const __nv_bfloat16*>(x.data));
      break;
    case kernels::Dtype::kHalf:
      launch(static_cast<const __half*>(x.data));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_amax(const Input2d& x, ScaleAxis axis, bool ignore_nan, uint32_t* keys,
                        cudaStream_t stream) {
  const TileGrid grid{x.rows, x.cols};
  if (grid.tiles() == 0) return cudaSuccess;
  return with_type(x, [&](const auto* data) {
    amax_kernel<<<blocks_for(grid), dim3(kTile, kRowsPerPass), 0, stream>>>(data, grid, x.view,
                                                                            axis, ignore_nan, keys);
  });
}

cudaError_t launch_scale(const uint32_t* keys, int64_t count, Format format, bool power_of_2,
                         float* scale, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (count + threads - 1) / threads;
  scale_kernel<<<static_cast<unsigned int>(blocks < 1024 ? blocks : 1024), threads, 0, stream>>>(
      keys, count, format, power_of_2, scale);
  return cudaGetLastError();
}

cudaError_t launch_quantize(const Input2d& x, const float* scale, ScaleAxis axis, Format format,
                            const Output2d& data, const Output2d& alternate, uint32_t* amax_keys,
                            cudaStream_t stream) {
  const TileGrid grid{x.rows, x.cols};
  if (grid.tiles() == 0) return cudaSuccess;
  return with_type(x, [&](const auto* input) {
    quantize_kernel<<<blocks_for(grid), dim3(kTile, kRowsPerPass), 0, stream>>>(
        input, grid, x.view, scale, axis, format, data, alternate, amax_keys);
  });
}

}  // namespace amp::fp8::cuda
