// current_stream_is_capturing: cudaStreamIsCapturing on the device's current stream.
#include "scaler/stream_capture.h"

#include <amp/version.h>

#if AMP_BUILT_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace amp::detail {

bool current_stream_is_capturing(c10::Device device) {
#if AMP_BUILT_WITH_CUDA
  if (device.is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()), &status));
    return status != cudaStreamCaptureStatusNone;
  }
#endif
  return false;
}

}  // namespace amp::detail
