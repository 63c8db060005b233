// Launchers of the fused float8 cast kernels: raw pointers, sizes and a stream, no ATen types
// (fused_cast_cuda.cpp does the ATen work, so nvcc never parses ATen's headers).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fp8/cast_element.h"
#include "kernels/dtype.h"

namespace amp::fp8::cuda {

/// A 2-d input: element (r, c) at data[view.at(r, c)] (the view's offset included).
struct Input2d {
  const void* data;
  kernels::Dtype type;  // kFloat, kBFloat16 or kHalf
  int64_t rows, cols;
  cast_element::MatrixView view;
};

/// A 2-d float8 output of the input's shape; data null when not written.
struct Output2d {
  uint8_t* data;
  cast_element::MatrixView view;
};

/// atomicMax of each block's |x| keys into keys (1, rows or cols values by axis; zeroed by the
/// caller).
cudaError_t launch_amax(const Input2d& x, cast_element::ScaleAxis axis, bool ignore_nan,
                        uint32_t* keys, cudaStream_t stream);

/// scale[i] = scale_from_amax(key_amax(keys[i])) for i < count.
cudaError_t launch_scale(const uint32_t* keys, int64_t count, cast_element::Format format,
                         bool power_of_2, float* scale, cudaStream_t stream);

/// The cast of every element into `data` and `alternate` (when its data is not null), through a
/// shared-memory tile so both are written along their own contiguous dim; with amax_keys not
/// null, also atomicMax of the NaN-ignoring keys into amax_keys[0] (zeroed by the caller).
cudaError_t launch_quantize(const Input2d& x, const float* scale, cast_element::ScaleAxis axis,
                            cast_element::Format format, const Output2d& data,
                            const Output2d& alternate, uint32_t* amax_keys, cudaStream_t stream);

}  // namespace amp::fp8::cuda
