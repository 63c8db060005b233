// amp's fused float8 casts (Recipe::fused_casts): torchao's casts and Transformer Engine's delayed
// cast with the same bits as the eager sequences in scaling.cpp, in two passes over the tensor
// (amax, then a cast that writes the float8 layouts the GEMMs need) for a dynamic cast and one
// pass for a delayed one. The element arithmetic is cast_element.h; the CPU loops are in
// fused_cast.cpp, the CUDA kernels in cuda/.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <amp/fp8.h>

#include "fp8/cast_element.h"
#include "fp8/scaling.h"
#include "kernels/dispatch.h"

namespace amp::fp8::detail {

/// Which float8 copies a fused cast writes. A 2-d operand's layout is row-major or column-major;
/// the GEMMs want the first operand row-major and the second column-major, so a cast that writes
/// the layout its GEMM wants spares at::_scaled_mm's caller a transposed copy.
enum class Layouts {
  kSame,   ///< the input's layout (what the eager cast produces)
  kOther,  ///< only the other layout (the same values, transposed storage)
  kBoth,   ///< both: `data` in the input's layout, `alternate` in the other
};

/// A dynamic cast of `x` (torchao's, as cast_dynamic) through the fused kernels. The operand is
/// 2-d ([rows, last dim]; what flatten_rows() gives for the eager cast), its data in `layouts`.
AMP_EXPORT Float8Operand fused_cast_dynamic(const at::Tensor& x, const CastConfig& config,
                                            int64_t axis, bool power_of_2, Layouts layouts);

/// A delayed cast (as cast_delayed, the history and scale updated the same way) through the fused
/// kernel: one pass reads x, writes the float8 copies and takes the amax.
AMP_EXPORT Float8Operand fused_cast_delayed(const at::Tensor& x, c10::ScalarType fp8_dtype,
                                            DelayedState& state,
                                            const DelayedScalingOptions& options, Layouts layouts);

/// The kernels behind the fused casts, one entry per device (the CUDA one registered by
/// cuda/fused_cast_cuda.cpp). Tensors are as the glue prepares them: `x` 2-d with any strides
/// (float32, bfloat16 or float16); `keys` int32 holding amax_key()s, zeroed by the caller;
/// `scale` float32 (1, rows or cols values by `axis`); outputs uint8-viewed float8, 2-d with
/// their own strides, `alternate` undefined when not written.
namespace kernels_api {
using cast_element::ScaleAxis;
using AmaxFn = void (*)(const at::Tensor& x, ScaleAxis axis, bool ignore_nan,
                        const at::Tensor& keys);
using ScaleFn = void (*)(const at::Tensor& keys, cast_element::Format format, bool power_of_2,
                         const at::Tensor& scale);
using QuantizeFn = void (*)(const at::Tensor& x, const at::Tensor& scale, ScaleAxis axis,
                            cast_element::Format format, const at::Tensor& data,
                            const at::Tensor& alternate, const at::Tensor& amax_keys);
}  // namespace kernels_api

/// max |x| per `axis` into `keys` (NaN propagating, or ignored with ignore_nan).
extern amp::kernels::DeviceDispatch<kernels_api::AmaxFn> fused_amax_kernel;
/// scale_from_amax() of each key into `scale`.
extern amp::kernels::DeviceDispatch<kernels_api::ScaleFn> fused_scale_kernel;
/// quantize() of each element of x into `data` (and `alternate` when defined); when `amax_keys`
/// is defined (1 value), the NaN-ignoring amax of x too, in the same pass.
extern amp::kernels::DeviceDispatch<kernels_api::QuantizeFn> fused_quantize_kernel;

}  // namespace amp::fp8::detail
