// Checks shared by GradScaler's constructor, setters and load_state_dict (one wording for each).
#pragma once

#include <cstdint>

#include <amp/grad_scaler.h>

namespace amp::detail {

/// Each throws c10::Error with a sentence naming the value and the fix when it is out of range.
void check_init_scale(double init_scale);
void check_growth_factor(double growth_factor);
void check_backoff_factor(double backoff_factor);
void check_growth_interval(int64_t growth_interval);
/// For a CUDA scaler on a machine with CUDA: refuses an amp built without its CUDA kernels, whose
/// ops would otherwise fail at the first unscale_.
void check_cuda_kernels_built(bool built_with_cuda);
/// Checks the extension options (hysteresis, min_scale, max_scale) against each other and
/// against `scale`.
void check_extension_options(int64_t hysteresis, double min_scale, double max_scale, double scale);

}  // namespace amp::detail
