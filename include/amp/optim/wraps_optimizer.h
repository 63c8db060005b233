// amp::optim::WrapsOptimizer: how an optimizer that runs another optimizer's steps (amp's
// ZeroRedundancyOptimizer around FusedAdamW, say) names that optimizer, so that the Python-format
// state dicts of amp/state_dict.h describe and check its param groups as the inner one's.
#pragma once

#include <torch/optim/optimizer.h>

#include <amp/export.h>

namespace amp::optim {

/// Derive from it next to torch::optim::Optimizer. amp::optimizer_state_dict then writes the
/// group flags that make Python continue with the wrapped optimizer's implementation (`fused`,
/// `foreach`, `decoupled_weight_decay`), and amp::load_optimizer_state_dict refuses a group the
/// wrapped optimizer would not compute, as it does for that optimizer itself.
class AMP_EXPORT WrapsOptimizer {
 public:
  virtual ~WrapsOptimizer() = default;
  /// An optimizer of the type whose steps this one runs (for ZeroRedundancyOptimizer: this
  /// rank's shard, an optimizer of the inner type).
  virtual const torch::optim::Optimizer& wrapped_optimizer() const = 0;
};

}  // namespace amp::optim
