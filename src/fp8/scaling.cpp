// Float8 casts and GEMMs: torchao 0.18's float8_utils / float8_ops arithmetic op for op, and
// Transformer Engine's delayed-scaling update on device tensors.
#include "fp8/scaling.h"

#include <cmath>
#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "checkpoint/recompute_context.h"
#include "fp8/amax_batch.h"
#include "fp8/delayed_state.h"

namespace amp::fp8::detail {
namespace {

bool is_row_major(const at::Tensor& t) { return t.stride(0) > t.stride(1) && t.stride(1) == 1; }

}  // namespace

Float8Operand Float8Operand::t() const {
  Float8Operand out{data.t(), scale.dim() > 1 ? scale.t() : scale, orig_dtype, axiswise_dim, {}};
  if (alternate.defined()) out.alternate = alternate.t();
  if (axiswise_dim) out.axiswise_dim = *axiswise_dim == 0 ? -1 : 0;
  return out;
}

Float8Operand Float8Operand::in_alternate_layout() const {
  TORCH_INTERNAL_ASSERT(alternate.defined(), "amp::fp8: the operand has no second layout");
  return Float8Operand{alternate, scale, orig_dtype, axiswise_dim, {}};
}

Float8Operand Float8Operand::flatten_rows() const {
  const int64_t cols = data.size(-1);
  if (data.dim() == 2) return *this;
  Float8Operand out = *this;
  // reshape, as torchao: the cast keeps the layout of its input, and a permuted input (say
  // x.transpose(0, 1) of a [T, B, K] activation) cannot be viewed as rows; it is copied then.
  out.data = data.reshape({-1, cols});
  // torchao reshapes a rowwise scale along the last dim to [rows, 1]; a scale along dim 0 of an
  // N-d tensor does not occur in a linear layer's forward.
  if (scale.dim() > 1) {
    TORCH_INTERNAL_ASSERT(axiswise_dim && *axiswise_dim == -1);
    out.scale = scale.reshape({out.data.size(0), 1});
  }
  return out;
}

at::Tensor dynamic_amax(const at::Tensor& x, Granularity granularity, int64_t axis) {
  if (granularity == Granularity::tensorwise) return at::max(at::abs(x));
  return at::amax(at::abs(x), {axis}, /*keepdim=*/true);
}

at::Tensor amax_to_scale(const at::Tensor& amax, c10::ScalarType fp8_dtype, bool power_of_2) {
  // Python's `fp8_max / tensor` is tensor.reciprocal() * fp8_max: two roundings in float64.
  auto scale =
      (at::clamp(amax.to(at::kDouble), 1e-12).reciprocal() * fp8_max(fp8_dtype)).to(at::kFloat);
  if (power_of_2) scale = at::exp2(at::floor(at::log2(scale)));
  return scale;
}

at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType fp8_dtype) {
  const double max = fp8_max(fp8_dtype);
  return at::clamp(x.to(at::kFloat) * scale, -max, max).to(fp8_dtype);
}

Float8Operand cast_dynamic(const at::Tensor& x, const CastConfig& config, int64_t axis,
                           bool power_of_2) {
  const auto amax = dynamic_amax(x, config.granularity, axis);
  const auto scale = amax_to_scale(amax, config.dtype, power_of_2);
  Float8Operand out{quantize(x, scale, config.dtype), scale, x.scalar_type(), std::nullopt, {}};
  if (config.granularity == Granularity::rowwise) out.axiswise_dim = axis;
  return out;
}

DelayedCastScale delayed_cast_scale(const DelayedState& state) {
  // In a checkpoint's recomputation the cast repeats the forward's: its scale, and no update of
  // the history (amp::checkpoint records the scales in the forward; recompute_context.h).
  if (auto replayed =
          amp::detail::replayed_in_recomputation("casts to float8 with delayed scaling")) {
    return {*replayed, true};
  }
  // A batched reduction's earlier amax of this tensor is applied before its scale is read.
  flush_if_waiting(state);
  auto scale = state.scale.clone();
  amp::detail::record_for_recomputation(scale);
  return {scale, false};
}

void record_delayed_amax(DelayedState& state, const at::Tensor& amax, c10::ScalarType fp8_dtype,
                         const DelayedScalingOptions& options) {
  if (defer_delayed_amax(state, amax, fp8_dtype, options)) return;
  if (options.amax_reduction()) options.amax_reduction()(amax);
  state.amax_history[0].copy_(amax);
  update_delayed_scale(state, fp8_dtype, options);
}

Float8Operand cast_delayed(const at::Tensor& x, c10::ScalarType fp8_dtype, DelayedState& state,
                           const DelayedScalingOptions& options) {
  const auto [scale, replayed] = delayed_cast_scale(state);
  Float8Operand out{quantize(x, scale, fp8_dtype), scale, x.scalar_type(), std::nullopt, {}};
  if (replayed) return out;
  auto amax =
      at::nan_to_num(at::abs(x).to(at::kFloat), 0.0, std::numeric_limits<double>::infinity()).max();
  record_delayed_amax(state, amax, fp8_dtype, options);
  return out;
}

at::Tensor scaled_mm(const Float8Operand& a, const Float8Operand& b, c10::ScalarType out_dtype,
                     bool use_fast_accum) {
  // torchao runs these ops below autocast (in its tensor subclass's dispatch), so autocast must
  // not cast the float32 scales here either.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  // torchao's preprocess_addmm: at::_scaled_mm wants a row-major and b column-major. A fused
  // cast may have written that layout already, as the operand's alternate.
  auto a_data = is_row_major(a.data)                                 ? a.data
                : a.alternate.defined() && is_row_major(a.alternate) ? a.alternate
                                                                     : a.data.contiguous();
  auto b_data = !is_row_major(b.data)                                 ? b.data
                : b.alternate.defined() && !is_row_major(b.alternate) ? b.alternate
                                                                      : b.data.t().contiguous().t();
  auto a_scale = a.scale;
  auto b_scale = b.scale;
  // One rowwise operand makes the other's tensorwise scale a row (column) of equal scales.
  if (!a.axiswise_dim && b.axiswise_dim) {
    a_scale = a_scale.repeat({a_data.size(0)}).reshape({-1, 1});
  } else if (a.axiswise_dim && !b.axiswise_dim) {
    b_scale = b_scale.repeat({b_data.size(1)}).reshape({1, -1});
  }

  // torchao's addmm_float8_unwrapped.
  auto a_inverse = a_scale.reciprocal();
  auto b_inverse = b_scale.reciprocal();
  const bool rowwise = a_scale.dim() == 2 && a_scale.size(0) == a_data.size(0) &&
                       a_scale.size(1) == 1 && b_scale.dim() == 2 && b_scale.size(0) == 1 &&
                       b_scale.size(1) == b_data.size(1);
  at::Tensor post_inverse;
  if (rowwise && !use_fast_accum) {
    // The rowwise kernel without fast accumulation is slow on CUDA: torchao runs the tensorwise
    // one with unit scales and applies the scales' product afterwards, and so does amp.
    post_inverse = a_inverse * b_inverse;
    a_inverse = at::ones({}, a_inverse.options());
    b_inverse = at::ones({}, a_inverse.options());
  }
  const bool via_bf16 = rowwise && (out_dtype == at::kHalf || out_dtype == at::kFloat);
  at::Tensor out;
  try {
    out = at::_scaled_mm(a_data, b_data, a_inverse, b_inverse, /*bias=*/std::nullopt,
                         /*scale_result=*/std::nullopt, via_bf16 ? at::kBFloat16 : out_dtype,
                         use_fast_accum);
  } catch (const c10::Error& error) {
    // LibTorch 2.11's CPU emulation takes tensorwise scales only.
    const std::string text = error.what_without_backtrace();
    TORCH_CHECK(!(a_data.is_cpu() && text.find("per-tensor") != std::string::npos),
                "amp::fp8: rowwise scales on the CPU need a LibTorch whose CPU at::_scaled_mm "
                "takes them (2.14 does; this one says: ",
                text.substr(0, text.find('\n')),
                "). Use the tensorwise or delayed recipe on this LibTorch, or run on CUDA.");
    throw;
  }
  if (post_inverse.defined()) out.mul_(post_inverse);
  if (via_bf16) out = out.to(out_dtype);
  return out;
}

}  // namespace amp::fp8::detail
