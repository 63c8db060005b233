// What the fp8 suites share: their common names (same_bytes, from support/bits.h, among them),
// the recipes' names, and whether this LibTorch's CPU float8 GEMM takes rowwise scales.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include <amp/fp8.h>

#include "support/bits.h"

// The fp8 types every suite names, for the whole file that includes this header.
using amp::fp8::Float8AutocastGuard;
using amp::fp8::Float8Linear;
using amp::fp8::Float8LinearOptions;
using amp::fp8::Recipe;

namespace amp_test {

/// Every float8 recipe by name, in the order the suites that try them all go through them.
inline const std::vector<std::string> kRecipeNames = {"tensorwise", "rowwise", "rowwise_with_gw_hp",
                                                      "delayed"};

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

using amp_test::same_bytes;
