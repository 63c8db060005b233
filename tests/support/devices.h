// What devices the test machine offers; CUDA tests are tagged [cuda] and skipped without a GPU.
#pragma once

namespace amp_test {

/// Exit code CTest reads as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
inline constexpr int kSkipReturnCode = 77;

/// True when this build of amp has CUDA code and a CUDA device is present.
bool cuda_usable();

/// True when LibTorch sees a CUDA device, whether or not amp was built with CUDA.
bool cuda_present();

}  // namespace amp_test
