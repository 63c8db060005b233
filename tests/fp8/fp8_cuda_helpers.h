// What the fp8 CUDA suites share: whether this GPU runs float8 GEMMs, and the warning a test that
// needs them gives where it does not.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <catch2/catch.hpp>

namespace amp_test {

/// Whether this GPU has compute capability 8.9 or newer, which at::_scaled_mm needs.
inline bool sm89_or_newer() {
  const auto* props = at::cuda::getCurrentDeviceProperties();
  return props->major > 8 || (props->major == 8 && props->minor >= 9);
}

/// Whether a test of float8 GEMMs can run on this GPU; where it cannot, warns why (for the test
/// to return untested rather than fail).
inline bool float8_gemms_run_here() {
  if (sm89_or_newer()) return true;
  WARN("not run: float8 GEMMs need compute capability 8.9 or newer");
  return false;
}

}  // namespace amp_test
