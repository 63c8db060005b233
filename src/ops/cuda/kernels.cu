// amp's CUDA kernels: multi-tensor check/unscale/norm/clip over mixed dtypes in one launch, the
// norm finish, and the scale updates. No ATen headers here (see kernels.cuh).
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

/// Processes elements [begin, end) of `data`: 16-byte vectors when the tensor is 16-byte aligned
/// (chunk starts are multiples of kChunkElems, so every chunk then is), scalars otherwise.
template <typename T, bool kCheck, bool kStore, bool kNorm>
__device__ void process_chunk(T* data, int64_t begin, int64_t end, float factor_in,
                              ThreadState& st) {
  using C = typename Compute<T>::type;
  const C factor = static_cast<C>(factor_in);
  constexpr int kVec = 16 / sizeof(T);
  int64_t scalar_from = begin;
  if (reinterpret_cast<uintptr_t>(data) % 16 == 0) {
    const int64_t vec_count = (end - begin) / kVec;
    uint4* vdata = reinterpret_cast<uint4*>(data + begin);
    for (int64_t v = threadIdx.x; v < vec_count; v += blockDim.x) {
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
    scalar_from = begin + vec_count * kVec;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
    const T u = step<T, kCheck, kNorm>(data[i], factor, st);
    if (kStore) data[i] = u;
  }
}

template <bool kCheck, bool kStore, bool kNorm>
__device__ void dispatch_chunk(void* data, ElemType type, int64_t begin, int64_t end, float factor,
                               ThreadState& st) {
  switch (type) {
    case ElemType::kFloat:
      process_chunk<float, kCheck, kStore, kNorm>(static_cast<float*>(data), begin, end, factor,
                                                  st);
      break;
    case ElemType::kHalf:
      process_chunk<__half, kCheck, kStore, kNorm>(static_cast<__half*>(data), begin, end, factor,
                                                   st);
      break;
    case ElemType::kBFloat16:
      process_chunk<__nv_bfloat16, kCheck, kStore, kNorm>(static_cast<__nv_bfloat16*>(data), begin,
                                                          end, factor, st);
      break;
    case ElemType::kDouble:
      process_chunk<double, kCheck, kStore, kNorm>(static_cast<double*>(data), begin, end, factor,
                                                   st);
      break;
  }
}

/// Sum of `value` over the block, valid in thread 0.
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
    list_kernel(const LaunchMeta meta, const ListArgs args) {
  const int slot = meta.block_slot[blockIdx.x];
  const int64_t numel = meta.numel[slot];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kChunkElems;
  const int64_t end = begin + kChunkElems < numel ? begin + kChunkElems : numel;
  const float inv = *args.inv_scale;
  ThreadState st;

  if constexpr (kMode == ListMode::kCheckScale) {
    // As ATen: inv_scale == 1 leaves the values untouched, so only check them.
    if (inv == 1.0f) {
      dispatch_chunk<true, false, false>(meta.data[slot], meta.type[slot], begin, end, inv, st);
    } else {
      dispatch_chunk<true, true, false>(meta.data[slot], meta.type[slot], begin, end, inv, st);
    }
  } else if constexpr (kMode == ListMode::kCheckNorm) {
    dispatch_chunk<true, false, true>(meta.data[slot], meta.type[slot], begin, end, inv, st);
  } else {
    const float coef = args.max_norm / (*args.total_norm + args.eps);
    const float factor = inv * (coef < 1.0f ? coef : 1.0f);
    dispatch_chunk<false, true, false>(meta.data[slot], meta.type[slot], begin, end, factor, st);
  }

  if constexpr (kMode != ListMode::kClip) {
    // A benign race: every thread that saw a non-finite value stores the same 1.0.
    if (st.non_finite) {
      *args.found_inf = 1.0f;
      if (args.per_tensor_found) args.per_tensor_found[meta.index[slot]] = 1.0f;
    }
  }
  if constexpr (kMode == ListMode::kCheckNorm) {
    const double sum = block_sum(st.sumsq);
    if (threadIdx.x == 0) {
      atomicAdd(args.total_sumsq, sum);
      if (args.per_tensor_sumsq) atomicAdd(args.per_tensor_sumsq + meta.index[slot], sum);
    }
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

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker, const float* found_inf,
                                    double growth_factor, double backoff_factor,
                                    int64_t growth_interval) {
  apply_update_rule(scale, growth_tracker, *found_inf, growth_factor, backoff_factor,
                    growth_interval);
}

__global__ void update_scale_extended_kernel(float* scale, int32_t* growth_tracker,
                                             int32_t* hysteresis_remaining, int64_t* counters,
                                             const float* found_inf, ExtendedRule rule) {
  apply_extended_rule(scale, growth_tracker, hysteresis_remaining, counters, *found_inf, rule);
}

}  // namespace

// ---- launchers ----

cudaError_t launch_list_kernel(const LaunchMeta& meta, int blocks, const ListArgs& args,
                               cudaStream_t stream) {
  if (blocks == 0) return cudaSuccess;
  switch (args.mode) {
    case ListMode::kCheckScale:
      list_kernel<ListMode::kCheckScale><<<blocks, kBlockThreads, 0, stream>>>(meta, args);
      break;
    case ListMode::kCheckNorm:
      list_kernel<ListMode::kCheckNorm><<<blocks, kBlockThreads, 0, stream>>>(meta, args);
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

cudaError_t launch_update_scale(float* scale, int32_t* growth_tracker, const float* found_inf,
                                double growth_factor, double backoff_factor,
                                int64_t growth_interval, cudaStream_t stream) {
  update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf, growth_factor,
                                           backoff_factor, growth_interval);
  return cudaGetLastError();
}

cudaError_t launch_update_scale_extended(float* scale, int32_t* growth_tracker,
                                         int32_t* hysteresis_remaining, int64_t* counters,
                                         const float* found_inf, const ExtendedRule& rule,
                                         cudaStream_t stream) {
  update_scale_extended_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, hysteresis_remaining,
                                                    counters, found_inf, rule);
  return cudaGetLastError();
}

}  // namespace amp::detail::cuda
