// What the fp8 suites share: whether this LibTorch's CPU float8 GEMM takes rowwise scales.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace amp_test {

/// Whether this LibTorch's CPU at::_scaled_mm takes rowwise scales (2.14's does, 2.11's not).
inline bool cpu_takes_rowwise_scales() {
  const auto a = at::ones({16, 16}).to(at::kFloat8_e4m3fn);
  try {
    at::_scaled_mm(a, a.t(), at::ones({16, 1}), at::ones({1, 16}), std::nullopt, std::nullopt,
                   at::kBFloat16, true);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace amp_test
