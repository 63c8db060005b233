// The fused float8 casts on CUDA tensors: device checks and the launches of cast_kernels.cu on
// the current stream (no host read). Registers itself as the CUDA entry of the fused casts'
// dispatch (fused_cast.h).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fp8/cuda/cast_kernels.cuh"
#include "fp8/fused_cast.h"
#include "kernels/dtype_of.h"

namespace amp::fp8::detail {
namespace {

using cast_element::Format;
using cast_element::MatrixView;
using cast_element::ScaleAxis;

cuda::Input2d input_of(const at::Tensor& x) {
  const auto type = kernels::dtype_of(x.scalar_type());
  TORCH_CHECK(type && *type != kernels::Dtype::kDouble,
              "amp::fp8: a float8 cast reads float32, bfloat16 or float16 tensors, not ",
              x.scalar_type(), ".");
  return cuda::Input2d{x.storage().data(), *type, x.size(0), x.size(1),
                       MatrixView{x.storage_offset(), x.stride(0), x.stride(1)}};
}

cuda::Output2d output_of(const at::Tensor& t) {
  if (!t.defined()) return cuda::Output2d{nullptr, MatrixView{0, 0, 0}};
  return cuda::Output2d{static_cast<uint8_t*>(t.storage().mutable_data()),
                        MatrixView{t.storage_offset(), t.stride(0), t.stride(1)}};
}

uint32_t* keys_of(const at::Tensor& keys) {
  return keys.defined() ? reinterpret_cast<uint32_t*>(keys.data_ptr<int32_t>()) : nullptr;
}

void amax_cuda(const at::Tensor& x, ScaleAxis axis, bool ignore_nan, const at::Tensor& keys) {
  const c10::cuda::CUDAGuard guard(x.device());
  C10_CUDA_CHECK(cuda::launch_amax(input_of(x), axis, ignore_nan, keys_of(keys),
                                   c10::cuda::getCurrentCUDAStream()));
}

void scale_cuda(const at::Tensor& keys, Format format, bool power_of_2, const at::Tensor& scale) {
  const c10::cuda::CUDAGuard guard(keys.device());
  C10_CUDA_CHECK(cuda::launch_scale(keys_of(keys), keys.numel(), format, power_of_2,
                                    scale.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()));
}

void quantize_cuda(const at::Tensor& x, const at::Tensor& scale, ScaleAxis axis, Format format,
                   const at::Tensor& data, const at::Tensor& alternate,
                   const at::Tensor& amax_keys) {
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(scale.is_cuda() && scale.device() == x.device(),
              "amp::fp8: a float8 cast's scale must be on the input's device (", x.device(),
              "), not ", scale.device(), ".");
  C10_CUDA_CHECK(cuda::launch_quantize(input_of(x), scale.data_ptr<float>(), axis, format,
                                       output_of(data), output_of(alternate), keys_of(amax_keys),
                                       c10::cuda::getCurrentCUDAStream()));
}

AMP_REGISTER_CUDA_KERNEL(fused_amax_kernel, amax_cuda);
AMP_REGISTER_CUDA_KERNEL(fused_scale_kernel, scale_cuda);
AMP_REGISTER_CUDA_KERNEL(fused_quantize_kernel, quantize_cuda);

}  // namespace
}  // namespace amp::fp8::detail
