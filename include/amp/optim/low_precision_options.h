// The options every amp optimizer shares for bfloat16/float16 parameters (master weights, Kahan
// summation, stochastic rounding, the state dtype, the rounding seed), as a mixin of each
// optimizer's options type.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include <c10/core/ScalarType.h>

#include <amp/optim/explicit_options.h>

namespace amp::optim {

/// Low-precision options, mixed into FusedAdamOptions, FusedAdamWOptions, FusedSGDOptions and
/// FusedLionOptions (`Derived`): each setter returns the derived options, so they chain with the
/// optimizer's own (`FusedAdamWOptions(1e-3).kahan_summation(true).weight_decay(0.0)`). They act
/// on bfloat16/float16 parameters only; float32 ones (normalisation layers after
/// amp::to_low_precision), in the same group or in a group of their own, are updated as without
/// them. Each setter records its field as set (ExplicitOptions), so that a param group keeps what
/// it states.
template <typename Derived>
class LowPrecisionOptions : public ExplicitOptions {
 public:
  /// Keep an fp32 copy of each low-precision parameter in the optimizer state, step on it, and
  /// write the rounded result to the parameter (Apex O2, Megatron). Checkpoints hold the copy
  /// under "master_weight".
  Derived& master_weights(bool value) { return set("master_weights", master_weights_, value); }
  bool master_weights() const { return master_weights_; }
  /// Add each update through a compensation buffer in the parameter's dtype ("kahan_comp"), so
  /// updates smaller than the parameter's rounding step still land.
  Derived& kahan_summation(bool value) { return set("kahan_summation", kahan_summation_, value); }
  bool kahan_summation() const { return kahan_summation_; }
  /// bfloat16 parameters: round each updated value up or down at random, with probability by
  /// distance (unbiased). The bits come from rounding_seed, the parameter's position in the
  /// optimizer and its step count, so a run and its resume draw the same bits.
  Derived& stochastic_rounding(bool value) {
    return set("stochastic_rounding", stochastic_rounding_, value);
  }
  bool stochastic_rounding() const { return stochastic_rounding_; }
  /// The dtype of the moment/momentum buffers of low-precision parameters (float32, bfloat16 or
  /// float16). Unset: float32, so that no update of the state is lost either (in bfloat16,
  /// Adam's second moment stops moving once its increment is below half a rounding step).
  /// bfloat16 saves 2 bytes per parameter and buffer at that cost.
  Derived& state_dtype(std::optional<c10::ScalarType> value) {
    return set("state_dtype", state_dtype_, value);
  }
  std::optional<c10::ScalarType> state_dtype() const { return state_dtype_; }
  /// The seed of stochastic_rounding's bits.
  Derived& rounding_seed(int64_t value) { return set("rounding_seed", rounding_seed_, value); }
  int64_t rounding_seed() const { return rounding_seed_; }

 protected:
  LowPrecisionOptions() = default;
  LowPrecisionOptions(const LowPrecisionOptions&) = default;
  LowPrecisionOptions& operator=(const LowPrecisionOptions&) = default;
  ~LowPrecisionOptions() = default;

 private:
  template <typename T, typename U>
  Derived& set(const char* name, T& field, U&& value) {
    field = std::forward<U>(value);
    mark_set(name);
    return static_cast<Derived&>(*this);
  }

  bool master_weights_ = false;
  bool kahan_summation_ = false;
  bool stochastic_rounding_ = false;
  std::optional<c10::ScalarType> state_dtype_;
  int64_t rounding_seed_ = 0;
};

}  // namespace amp::optim
