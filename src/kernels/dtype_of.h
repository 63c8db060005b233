// ATen's ScalarType in amp's kernel vocabulary (dtype.h): the one switch from c10's dtypes to the
// enum a kernel launch carries. Host code only (nvcc never sees ATen's headers).
#pragma once

#include <optional>

#include <c10/core/ScalarType.h>

#include "kernels/dtype.h"

namespace amp::kernels {

/// The kernel dtype of `dtype`, or nullopt for a dtype no kernel of amp reads.
inline std::optional<Dtype> dtype_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return Dtype::kFloat;
    case c10::ScalarType::BFloat16:
      return Dtype::kBFloat16;
    case c10::ScalarType::Half:
      return Dtype::kHalf;
    case c10::ScalarType::Double:
      return Dtype::kDouble;
    default:
      return std::nullopt;
  }
}

}  // namespace amp::kernels
