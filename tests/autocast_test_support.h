// Helpers shared by the autocast suites: the thread's full autocast state for before/after
// comparisons, and the weight-cast observation.
#pragma once

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <initializer_list>

#include <amp/autocast.h>

namespace amp_test {

/// The lower-precision dtypes CPU autocast accepts, for GENERATE(values(...)).
inline const std::initializer_list<c10::ScalarType> kLowerPrecision = {torch::kBFloat16,
                                                                       torch::kHalf};

/// The calling thread's autocast nesting count. It is only readable through increment/decrement,
/// which return the new value; a decrement to 0 here does not clear the cache (only an explicit
/// clear_cache does).
inline int nesting_count() {
  const int count = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  return count;
}

/// Everything a region may touch on the calling thread.
struct FullAutocastState {
  amp::AutocastState state;
  int nesting;
  bool operator==(const FullAutocastState&) const = default;
};

inline FullAutocastState full_autocast_state() {
  return {amp::capture_autocast_state(), nesting_count()};
}

/// The autograd node that cast the second operand of `mm_output` (mm(x, weight)). A cached
/// cast is one node shared by every use of the weight, so equal nodes mean the cache was hit.
inline const torch::autograd::Node* weight_cast_node(const torch::Tensor& mm_output) {
  return mm_output.grad_fn()->next_edges().at(1).function.get();
}

}  // namespace amp_test
