// Shared by the fused optimizer suites: the names they use unqualified, and list comparisons.
#pragma once

#include <vector>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <amp/optim.h>

#include "support/bits.h"

namespace amp_test {

/// Whether two lists of tensors (parameters, snapshots) have the same length and the same bits
/// element by element (autograd history ignored).
inline bool all_same_bits(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_bits(a[i].detach(), b[i].detach())) return false;
  }
  return true;
}

}  // namespace amp_test

// The optimizer suites' common names, brought in for the whole test file that includes this.
using amp::optim::FusedAdamParamState;
using amp::optim::FusedAdamW;
using amp::optim::FusedAdamWOptions;
using amp::optim::FusedSGD;
using amp::optim::FusedSGDOptions;
using amp_test::all_same_bits;
using amp_test::same_bits;
using Catch::Contains;
