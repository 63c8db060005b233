// Input checks of amp's ops (see validate.h).
#include "ops/validate.h"

#include <cmath>
#include <limits>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

namespace amp::detail {
namespace {

void check_scalar_tensor(const char* op, const char* name, const at::Tensor& tensor,
                         c10::ScalarType dtype, c10::Device device) {
  TORCH_CHECK(tensor.defined(), op, ": ", name, " is an undefined tensor; pass a 1-element ",
              c10::toString(dtype), " tensor.");
  TORCH_CHECK(tensor.scalar_type() == dtype, op, ": ", name, " must be a ", c10::toString(dtype),
              " tensor, but got dtype ", tensor.scalar_type(), "; create it with dtype ",
              c10::toString(dtype), ".");
  TORCH_CHECK(tensor.numel() == 1, op, ": ", name, " must be a 1-element tensor, but got ",
              tensor.numel(), " elements.");
  TORCH_CHECK(tensor.device() == device, op, ": ", name, " is on ", tensor.device(),
              " but must be on ", device, " (the device of the other arguments); move it there.");
}

void check_grads(const char* op, at::TensorList grads, c10::Device device) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    TORCH_CHECK(g.defined(), op, ": grads[", i,
                "] is an undefined tensor; leave it out of the list.");
    TORCH_CHECK(g.layout() == c10::kStrided, op, ": grads[", i, "] has layout ", g.layout(),
                " but must be strided (dense); unscale a sparse tensor's values() instead.");
    const auto dtype = g.scalar_type();
    TORCH_CHECK(
        dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble,
        op, ": grads[", i, "] has dtype ", dtype, " but must be Float, Half, BFloat16 or Double.");
    TORCH_CHECK(g.device() == device, op, ": grads[", i, "] is on ", g.device(),
                " but the other tensor arguments are on ", device,
                "; all grads must be on one device with them (group grads by device).");
  }
}

// The list ops' tensor arguments: two 1-element float32 tensors, the first of which fixes the
// device, and the grads on that device.
void check_list_args(const char* op, at::TensorList grads, const char* first_name,
                     const at::Tensor& first, const char* second_name, const at::Tensor& second) {
  TORCH_CHECK(first.defined(), op, ": ", first_name,
              " is an undefined tensor; pass a 1-element float32 tensor.");
  const c10::Device device = first.device();
  check_scalar_tensor(op, first_name, first, at::kFloat, device);
  check_scalar_tensor(op, second_name, second, at::kFloat, device);
  check_grads(op, grads, device);
}

}  // namespace

void check_unscale_args(const char* op, at::TensorList grads, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale, const std::optional<at::Tensor>& per_tensor) {
  check_list_args(op, grads, "found_inf", found_inf, "inv_scale", inv_scale);
  if (!per_tensor) return;
  const c10::Device device = found_inf.device();
  const at::Tensor& out = *per_tensor;
  const auto count = static_cast<int64_t>(grads.size());
  TORCH_CHECK(out.scalar_type() == at::kFloat, op,
              ": per_tensor_found_inf must be a float32 tensor, but got dtype ", out.scalar_type(),
              ".");
  TORCH_CHECK(out.numel() == count, op, ": per_tensor_found_inf must have one element per grad (",
              count, "), but has ", out.numel(), ".");
  TORCH_CHECK(out.is_contiguous(), op,
              ": per_tensor_found_inf must be contiguous; pass a fresh tensor.");
  TORCH_CHECK(out.device() == device, op, ": per_tensor_found_inf is on ", out.device(),
              " but must be on the grads' device ", device, ".");
}

UpdateRule check_update_args(const UpdateState& state, double growth_factor, double backoff_factor,
                             int64_t growth_interval, int64_t hysteresis,
                             bool consecutive_hysteresis, double min_scale,
                             std::optional<double> max_scale) {
  const auto& [scale, growth_tracker, found_inf, hysteresis_remaining, counters] = state;
  const char* op = "amp::update_scale_";
  TORCH_CHECK(scale.defined(), op, ": scale is an undefined tensor; pass a 1-element float32 ",
              "tensor.");
  const c10::Device device = scale.device();
  check_scalar_tensor(op, "scale", scale, at::kFloat, device);
  check_scalar_tensor(op, "growth_tracker", growth_tracker, at::kInt, device);
  check_scalar_tensor(op, "found_inf", found_inf, at::kFloat, device);
  // Larger than int32 is allowed, as in ATen: the int32 tracker then never reaches it.
  TORCH_CHECK(growth_interval >= 1, op, ": growth_interval must be >= 1, but got ", growth_interval,
              ".");
  TORCH_CHECK(hysteresis >= 1 && hysteresis <= std::numeric_limits<int32_t>::max(), op,
              ": hysteresis must be in [1, 2^31), but got ", hysteresis, ".");
  if (hysteresis_remaining) {
    check_scalar_tensor(op, "hysteresis_remaining", *hysteresis_remaining, at::kInt, device);
  } else {
    TORCH_CHECK(hysteresis == 1, op, ": hysteresis=", hysteresis,
                " needs the hysteresis_remaining tensor (1-element int32) that carries the "
                "allowance from one update to the next; pass it, or hysteresis=1.");
  }
  if (counters) {
    TORCH_CHECK(
        counters->scalar_type() == at::kLong && counters->numel() == 3 && counters->is_contiguous(),
        op,
        ": counters must be a contiguous int64 tensor of 3 elements [taken, skipped, "
        "consecutive skips], but got dtype ",
        counters->scalar_type(), " with ", counters->numel(), " elements.");
    TORCH_CHECK(counters->device() == device, op, ": counters is on ", counters->device(),
                " but must be on ", device, " with scale; move it there.");
  }
  const double cap = max_scale.value_or(std::numeric_limits<double>::infinity());
  TORCH_CHECK(std::isfinite(min_scale) && min_scale >= 0.0, op,
              ": min_scale must be finite and >= 0, but got ", min_scale, ".");
  TORCH_CHECK(cap > 0.0 && min_scale <= cap, op,
              ": max_scale must be > 0 and >= min_scale, but got max_scale=", cap,
              " and min_scale=", min_scale, ".");
  return UpdateRule{growth_factor,
                    backoff_factor,
                    growth_interval,
                    static_cast<int32_t>(hysteresis),
                    consecutive_hysteresis,
                    min_scale,
                    cap};
}

void check_clip_args(at::TensorList grads, const at::Tensor& inv_scale,
                     const at::Tensor& total_norm, double max_norm, double eps) {
  const char* op = "amp::clip_unscaled_";
  check_list_args(op, grads, "inv_scale", inv_scale, "total_norm", total_norm);
  TORCH_CHECK(max_norm > 0, op, ": max_norm must be > 0, but got ", max_norm, ".");
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, but got ", eps, ".");
}

}  // namespace amp::detail
