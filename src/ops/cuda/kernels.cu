// amp's CUDA kernels: multi-tensor check/unscale/norm/clip over mixed dtypes in one launch, the
// norm reduction in a fixed order, and the scale update. No ATen headers here (see kernels.cuh).
#include "ops/cuda/kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

namespace amp::detail::cuda {
namespace {

// ---- element conversions ----

template <typename T>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};

__device__ inline float widen(float v) { return v; }
__device__ inline double widen(double v) { return v; }
__device__ inline float widen(__half v) { return __half2float(v); }
__device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ inline T narrow(typename Compute<T>::type v);
template <>
__device__ inline float narrow<float>(float v) {
  return v;
}
template <>
__device__ inline double narrow<double>(double v) {
  return v;
}
template <>
__device__ inline __half narrow<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Per-thread results of one block's chunk.
struct ThreadState {
  bool non_finite = false;
  double sumsq = 0.0;
};

template <typename T, bool kCheck, bool kNorm>
__device__ inline T step(T x, typename Compute<T>::type factor, ThreadState& st) {
  const auto v = widen(x);
  if (kCheck && !isfinite(v)) st.non_finite = true;
  const auto u = v * factor;
  if (kNorm) st.sumsq += static_cast<double>(u) * static_cast<double>(u);
  return narrow<T>(u);
}

// ---- device functor: one chunk of one tensor ----

/// Processes the n (<= kChunkElems) elements at `chunk`: 16-byte vectors when the chunk is
/// 16-byte aligned (chunk starts are multiples of kChunkElems, so a tensor's chunks are all
/// aligned or all not), scalars otherwise. Offsets inside a chunk are 32-bit.
template <typename T, bool kCheck, bool kStore, bool kNorm>
__device__ void process_chunk(T* chunk, int n, float factor_in, ThreadState& st) {
  using C = typename Compute<T>::type;
  const C factor = static_cast<C>(factor_in);
  constexpr int kVec = 16 / sizeof(T);
  int scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(chunk) % 16 == 0) {
    const int vec_count = n / kVec;
    uint4* vdata = reinterpret_cast<uint4*>(chunk);
    for (int v = threadIdx.x; v < vec_count; v += blockDim.x) {
      uint4 raw = vdata[v];
      T elems[kVec];
      memcpy(elems, &raw, sizeof(raw));
#pragma unroll
      for (int j = 0; j < kVec; ++j) elems[j] = step<T, kCheck, kNorm>(elems[j], factor, st);
      if (kStore) {
        memcpy(&raw, elems, sizeof(raw));
        vdata[v] = raw;
      }
    }
    scalar_from = vec_count * kVec;
  }
  for (int i = scalar_from + threadIdx.x; i < n; i += blockDim.x) {
    const T u = step<T, kCheck, kNorm>(chunk[i], factor, st);
    if (kStore) chunk[i] = u;
  }
}

template <bool kCheck, bool kStore, bool kNorm>
__device__ void dispatch_chunk(void* data, kernels::Dtype type, int64_t begin, int n, float factor,
                               ThreadState& st) {
  switch (type) {
    case kernels::Dtype::kFloat:
      process_chunk<float, kCheck, kStore, kNorm>(static_cast<float*>(data) + begin, n, factor, st);
      break;
    case kernels::Dtype::kHalf:
      process_chunk<__half, kCheck, kStore, kNorm>(static_cast<__half*>(data) + begin, n, factor,
                                                   st);
      break;
    case kernels::Dtype::kBFloat16:
      process_chunk<__nv_bfloat16, kCheck, kStore, kNorm>(static_cast<__nv_bfloat16*>(data) + begin,
                                                          n, factor, st);
      break;
    case kernels::Dtype::kDouble:
      process_chunk<double, kCheck, kStore, kNorm>(static_cast<double*>(data) + begin, n, factor,
                                                   st);
      break;
  }
}

/// Sum of `value` over the block in a fixed order, valid in thread 0.
__device__ double block_sum(double value) {
  __shared__ double warp_sums[kBlockThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
  }
  return total;
}

// ---- kernels ----

template <ListMode kMode>
__global__ void __launch_bounds__(kBlockThreads)
    list_kernel(const __grid_constant__ LaunchMeta meta, const ListArgs args) {
  const int slot = meta.block_slot[blockIdx.x];
  const int64_t numel = meta.numel[slot];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kChunkElems;
  const int n = static_cast<int>(numel - begin < kChunkElems ? numel - begin : kChunkElems);
  void* data = meta.data[slot];
  const kernels::Dtype type = meta.type[slot];
  const float inv = *args.inv_scale;
  ThreadState st;

  if constexpr (kMode == ListMode::kCheckScale) {
    // As ATen: inv_scale == 1 leaves the values untouched, so only check them.
    if (inv == 1.0f) {
      dispatch_chunk<true, false, false>(data, type, begin, n, inv, st);
    } else {
      dispatch_chunk<true, true, false>(data, type, begin, n, inv, st);
    }
  } else if constexpr (kMode == ListMode::kCheckNorm) {
    dispatch_chunk<true, false, true>(data, type, begin, n, inv, st);
  } else {
    const float factor = clip_factor(inv, *args.total_norm, args.max_norm, args.eps);
    dispatch_chunk<false, true, false>(data, type, begin, n, factor, st);
  }

  if constexpr (kMode != ListMode::kClip) {
    // A benign race: every thread that saw a non-finite value stores the same 1.0.
    if (st.non_finite) {
      *args.found_inf = 1.0f;
      if (args.per_tensor_found) args.per_tensor_found[meta.index[slot]] = 1.0f;
    }
  }
  if constexpr (kMode == ListMode::kCheckNorm) {
    // Each block writes its own partial sum; reduce_norm_kernel adds them up in order.
    const double sum = block_sum(st.sumsq);
    if (threadIdx.x == 0) args.block_sumsq[blockIdx.x] = sum;
  }
}

/// One block of kMaxTensorsPerLaunch threads: thread s adds up the partial sums of slot s's
/// blocks (contiguous in the plan) in block order, then thread 0 adds the slots in slot order.
/// Launches run in stream order, so every sum is formed in the same order on every run.
__global__ void __launch_bounds__(kMaxTensorsPerLaunch)
    reduce_norm_kernel(const __grid_constant__ LaunchMeta meta, const double* block_sumsq,
                       double* total_sumsq, double* per_tensor_sumsq) {
  __shared__ double slot_sums[kMaxTensorsPerLaunch];
  const int s = threadIdx.x;
  double sum = 0.0;
  if (s < meta.tensor_count) {
    for (int b = 0; b < meta.block_count; ++b) {
      if (meta.block_slot[b] == s) sum += block_sumsq[b];
    }
    if (per_tensor_sumsq != nullptr) per_tensor_sumsq[meta.index[s]] += sum;
  }
  slot_sums[s] = sum;
  __syncthreads();
  if (s == 0) {
    double total = *total_sumsq;
    for (int k = 0; k < meta.tensor_count; ++k) total += slot_sums[k];
    *total_sumsq = total;
  }
}

__global__ void finish_norms_kernel(const double* total_sumsq, float* total_norm,
                                    const double* per_tensor_sumsq, float* per_tensor_norms,
                                    int64_t count) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) *total_norm = static_cast<float>(sqrt(*total_sumsq));
  if (per_tensor_norms == nullptr) return;
  for (int64_t i = first; i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    per_tensor_norms[i] = static_cast<float>(sqrt(per_tensor_sumsq[i]));
  }
}

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker, int32_t* remaining,
                                    int64_t* counters, const float* found_inf, UpdateRule rule) {
  apply_update_rule(scale, growth_tracker, remaining, counters, *found_inf, rule);
}

}  // namespace

// ---- launchers ----

cudaError_t launch_list_kernel(const LaunchMeta& meta, const ListArgs& args, cudaStream_t stream) {
  const int blocks = meta.block_count;
  if (blocks == 0) return cudaSuccess;
  switch (args.mode) {
    case ListMode::kCheckScale:
      list_kernel<ListMode::kCheckScale><<<blocks, kBlockThreads, 0, stream>>>(meta, args);
      break;
    case ListMode::kCheckNorm:
      list_kernel<ListMode::kCheckNorm><<<blocks, kBlockThreads, 0, stream>>>(meta, args);
      if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
      reduce_norm_kernel<<<1, kMaxTensorsPerLaunch, 0, stream>>>(
          meta, args.block_sumsq, args.total_sumsq, args.per_tensor_sumsq);
      break;
    case ListMode::kClip:
      list_kernel<ListMode::kClip><<<blocks, kBlockThreads, 0, stream>>>(meta, args);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_finish_norms(const double* total_sumsq, float* total_norm,
                                const double* per_tensor_sumsq, float* per_tensor_norms,
                                int64_t count, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t wanted = (count + kThreads - 1) / kThreads;
  const int blocks = wanted < 1 ? 1 : (wanted > 1024 ? 1024 : static_cast<int>(wanted));
  finish_norms_kernel<<<blocks, kThreads, 0, stream>>>(total_sumsq, total_norm, per_tensor_sumsq,
                                                       per_tensor_norms, count);
  return cudaGetLastError();
}

cudaError_t launch_update_scale(float* scale, int32_t* growth_tracker, int32_t* remaining,
                                int64_t* counters, const float* found_inf, const UpdateRule& rule,
                                cudaStream_t stream) {
  update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, remaining, counters, found_inf,
                                           rule);
  return cudaGetLastError();
}

}  // namespace amp::detail::cuda
