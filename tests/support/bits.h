// Bit-level comparison of tensors for the kernel tests (CPU and CUDA alike).
#pragma once

#include <torch/torch.h>

namespace amp_test {

/// The tensor's bits as an integer tensor of the same element size (contiguous).
inline torch::Tensor raw_bits(const torch::Tensor& t) {
  const auto c = t.contiguous();
  switch (c.scalar_type()) {
    case torch::kDouble:
      return c.view(torch::kLong);
    case torch::kFloat:
      return c.view(torch::kInt);
    default:
      return c.view(torch::kShort);
  }
}

/// Bit-for-bit equality, compared on `a`'s device; NaNs compare by position only (their payload
/// depends on whether a kernel took its vector or its scalar path).
inline bool same_bits(const torch::Tensor& a, const torch::Tensor& b_any) {
  const auto b = b_any.to(a.device());
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto nan_a = torch::isnan(a), nan_b = torch::isnan(b);
  if (!torch::equal(nan_a, nan_b)) return false;
  const auto keep = nan_a.logical_not().flatten();
  return torch::equal(raw_bits(a).flatten().index({keep}), raw_bits(b).flatten().index({keep}));
}

}  // namespace amp_test
