// The one host/device function marker of amp's kernel code: headers that both nvcc and the host
// compiler read (element arithmetic, the scale update rule) mark their functions with it.
#pragma once

#if defined(__CUDACC__)
/// A function callable from host and device code.
#define AMP_HOST_DEVICE __host__ __device__
/// The same, always inlined: element arithmetic in the hot loops.
#define AMP_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define AMP_HOST_DEVICE
#define AMP_HOST_DEVICE_INLINE inline
#endif
