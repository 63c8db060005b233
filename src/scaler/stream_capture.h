// Whether the current stream of a device is being captured into a CUDA graph (false off CUDA).
#pragma once

#include <c10/core/Device.h>

namespace amp::detail {

/// True while the current CUDA stream of `device` records a graph capture; false for every other
/// device and in a build without CUDA. LibTorch 2.11 has no device-generic query for this.
bool current_stream_is_capturing(c10::Device device);

}  // namespace amp::detail
