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

/// Whether `a` and `b` have the same dtype, shape and bytes, NaN payloads and float8 included
/// (read on the CPU, from any device; same_bits above ignores NaN payloads).
inline bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.detach().cpu().reshape({-1}).contiguous();
  const auto y = b.detach().cpu().reshape({-1}).contiguous();
  return x.scalar_type() == y.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(x.view(at::kByte), y.view(at::kByte));
}

}  // namespace amp_test
