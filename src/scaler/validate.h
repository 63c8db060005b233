// Checks shared by GradScaler's constructor, setters, update and load_state_dict (one wording for
// each).
#pragma once

#include <cstdint>

#include <amp/grad_scaler.h>

namespace amp::detail {

/// Each throws c10::Error with a sentence naming the value and the fix when it is out of range.
/// check_scale_value: `what` starts the sentence ("The initial scale"), `name` is the argument or
/// key ("init_scale"), `fix` ends the sentence.
/// The scale must be finite, > 0 and a normal float32 value (it lives in a float32 tensor).
void check_scale_value(double scale, const char* what, const char* name, const char* fix);
/// A loaded growth tracker: in [0, 2^31-1] (an int32 tensor).
void check_growth_tracker(int64_t tracker);
void check_init_scale(double init_scale);
void check_growth_factor(double growth_factor);
void check_backoff_factor(double backoff_factor);
void check_growth_interval(int64_t growth_interval);
/// For a CUDA scaler on a machine with CUDA: refuses an amp built without its CUDA kernels, whose
/// ops would otherwise fail at the first unscale_.
void check_cuda_kernels_built(bool built_with_cuda);
/// Checks the extension options (hysteresis, min_scale, max_scale) and their order.
void check_extension_options(int64_t hysteresis, double min_scale, double max_scale);
/// What the scaler keeps of a scale it checks: its float32 rounding only (a new_scale filled into
/// the scale tensor), or the value itself until the first scale() and its rounding after (an
/// initial or loaded scale, which get_scale() returns unrounded before the first scale(), as
/// Python's _init_scale).
enum class ScaleHeld { kRounded, kExactThenRounded };
/// Checks that the scale the scaler will hold lies within [min_scale, max_scale], the bounds as
/// the update enforces them in float32.
void check_scale_in_bounds(double scale, double min_scale, double max_scale, ScaleHeld held,
                           const char* what, const char* name, const char* fix);

}  // namespace amp::detail
