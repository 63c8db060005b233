// A reference for amp's extended scale update, written with plain tensor ops (no fused kernel):
// the fused op and GradScaler are compared with it.
#pragma once

#include <ATen/core/Tensor.h>

#include <amp/ops.h>

namespace amp_test {

/// The extended update rule (hysteresis, min/max bounds, counters) in ATen tensor ops, with the
/// same arguments and the same results as amp::update_scale_extended_.
void reference_update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                                      at::Tensor& hysteresis_remaining, at::Tensor& counters,
                                      const at::Tensor& found_inf,
                                      const amp::ScaleUpdateOptions& options);

}  // namespace amp_test
