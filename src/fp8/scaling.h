// Float8 casts and GEMMs as torchao 0.18 performs them, op for op (so the CPU gives its bits), and
// Transformer Engine's delayed-scaling update; Float8Linear's autograd function is built on these.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <amp/fp8.h>

#include "fp8/delayed_state.h"

namespace amp::fp8::detail {

/// A tensor cast to float8 with its scale (exported with cast_delayed for the unit tests):
/// torchao's Float8TrainingTensor without the subclass. value ≈ data / scale.
struct AMP_EXPORT Float8Operand {
  /// Float8_e4m3fn or Float8_e5m2, in the layout the cast produced.
  at::Tensor data;
  /// float32; 0-dim for a tensorwise cast, the amax's keepdim shape for a rowwise one.
  at::Tensor scale;
  /// The dtype a GEMM with this operand first produces (torchao's _orig_dtype).
  c10::ScalarType orig_dtype = c10::ScalarType::Float;
  /// For rowwise casts, the dimension the scale is constant along (0 or -1).
  std::optional<int64_t> axiswise_dim;

  /// The transpose (data and a rowwise scale transposed, the axis flipped).
  Float8Operand t() const;
  /// Viewed as [-1, last dim] (a rowwise scale follows to [rows, 1]).
  Float8Operand flatten_rows() const;

  /// A fused cast's second copy (Layouts::kBoth): data's values in the other layout (row-major
  /// where data is column-major and back), for the GEMM that wants that one; undefined otherwise.
  /// Only 2-d operands carry one.
  at::Tensor alternate;
  /// The operand with `alternate` as its data (and no alternate): what a backward keeps.
  Float8Operand in_alternate_layout() const;
};

/// The amax of `x` as torchao takes it (in x's dtype, NaN propagating): max(|x|) for a tensorwise
/// cast, amax(|x|, axis, keepdim) for a rowwise one.
at::Tensor dynamic_amax(const at::Tensor& x, Granularity granularity, int64_t axis);

/// torchao's amax_to_scale: fp8_max / clamp(amax, 1e-12) in float64 (as Python evaluates it:
/// reciprocal, then multiply), stored as float32, optionally rounded down to a power of two.
AMP_EXPORT at::Tensor amax_to_scale(const at::Tensor& amax, c10::ScalarType fp8_dtype,
                                    bool power_of_2);

/// The saturated cast: clamp(x.float() * scale, ±fp8_max).to(fp8_dtype). NaN stays NaN.
AMP_EXPORT at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale,
                               c10::ScalarType fp8_dtype);

/// A dynamic cast of `x` per `config` (rowwise along `axis`); orig_dtype is x's dtype.
AMP_EXPORT Float8Operand cast_dynamic(const at::Tensor& x, const CastConfig& config, int64_t axis,
                                      bool power_of_2);

/// The scale a delayed cast quantises with: in a checkpoint's recomputation the forward's cast's
/// (`replayed`: the history must not move), otherwise a copy of state.scale (the operand's
/// dequantisation factor must not see the update that follows), recorded for a recomputation.
struct DelayedCastScale {
  at::Tensor scale;
  bool replayed = false;
};
DelayedCastScale delayed_cast_scale(const DelayedState& state);

/// The end of a delayed cast: `amax` (float32, 0-dim, NaN already ignored) reduced across ranks
/// when the options say so, entered into the history, and the scale updated from it. With a
/// batched reduction (amax_batch.h) the amax waits in history[0] for the next flush instead.
void record_delayed_amax(DelayedState& state, const at::Tensor& amax, c10::ScalarType fp8_dtype,
                         const DelayedScalingOptions& options);

/// A delayed cast (DelayedScalingOptions' rule): quantises `x` with state.scale, then records
/// its amax (NaN ignored, as Transformer Engine's fmaxf does; reduced across ranks when the
/// options say so) and updates the history and scale in place. No host read.
AMP_EXPORT Float8Operand cast_delayed(const at::Tensor& x, c10::ScalarType fp8_dtype,
                                      DelayedState& state, const DelayedScalingOptions& options);

/// torchao's float8 mm of a [M, K] and b [K, N]: the layouts at::_scaled_mm wants (a row-major,
/// b column-major), a tensorwise scale repeated when the other operand is rowwise, the inverse
/// scales passed as dequantisation factors, and for rowwise scales without fast accumulation a
/// bfloat16 GEMM followed by the scales' product. The result has `out_dtype`.
AMP_EXPORT at::Tensor scaled_mm(const Float8Operand& a, const Float8Operand& b,
                                c10::ScalarType out_dtype, bool use_fast_accum);

}  // namespace amp::fp8::detail
