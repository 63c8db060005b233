// The range checks of Adam's options, shared by amp's fused and unfused Adam and AdamW.
#pragma once

#include <string>

#include <c10/util/Exception.h>

#include "optim/param_groups.h"

namespace amp::optim::detail {

/// Checks lr, eps, weight_decay and betas of any Adam-style options (amp's or LibTorch's), with
/// the sentence check_finite_at_least writes; `where` names the optimizer and the group.
template <typename AdamOptions>
void check_adam(const AdamOptions& options, const std::string& where) {
  check_finite_at_least(options.lr(), 0.0, "lr", where, "pass a learning rate such as 1e-3.");
  check_finite_at_least(options.eps(), 0.0, "eps", where, "the default is 1e-8.");
  check_finite_at_least(options.weight_decay(), 0.0, "weight_decay", where,
                        "pass 0 for no weight decay.");
  const auto [beta1, beta2] = options.betas();
  TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, where,
              ": betas[0] must be in [0, 1). Got betas[0]=", beta1, "; the default is 0.9.");
  TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, where,
              ": betas[1] must be in [0, 1). Got betas[1]=", beta2, "; the default is 0.999.");
}

}  // namespace amp::optim::detail
