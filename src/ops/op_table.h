// Each of amp's ops declared once: its name, its schema and its C++ signature. ops.cpp defines
// the ops and calls them through these; every kernel file registers against them, so a kernel
// whose signature differs from its op's fails to compile.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include "ops/update_rule.h"
#include "ops/validate.h"

namespace amp::detail::ops {

struct NonFiniteCheckAndUnscale {
  static constexpr const char* kName = "non_finite_check_and_unscale_";
  static constexpr const char* kSchema =
      "non_finite_check_and_unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale, "
      "Tensor(c!)? per_tensor_found_inf=None) -> ()";
  using Signature = void(at::TensorList grads, const at::Tensor& found_inf,
                         const at::Tensor& inv_scale,
                         const std::optional<at::Tensor>& per_tensor_found_inf);
};

struct UpdateScale {
  static constexpr const char* kName = "update_scale_";
  // The extension arguments are keyword-only in Python; max_scale None means no cap.
  static constexpr const char* kSchema =
      "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor found_inf, "
      "float growth_factor, float backoff_factor, int growth_interval, *, "
      "Tensor(c!)? hysteresis_remaining=None, Tensor(d!)? counters=None, int hysteresis=1, "
      "bool consecutive_hysteresis=False, float min_scale=0., float? max_scale=None) -> ()";
  using Signature = void(const at::Tensor& scale, const at::Tensor& growth_tracker,
                         const at::Tensor& found_inf, double growth_factor, double backoff_factor,
                         int64_t growth_interval,
                         const std::optional<at::Tensor>& hysteresis_remaining,
                         const std::optional<at::Tensor>& counters, int64_t hysteresis,
                         bool consecutive_hysteresis, double min_scale,
                         std::optional<double> max_scale);

  /// The kernel every backend registers: the arguments checked once, then the backend's
  /// kApply(state, rule) does the update on its device.
  template <void (*kApply)(const UpdateState&, const UpdateRule&)>
  static void kernel(const at::Tensor& scale, const at::Tensor& growth_tracker,
                     const at::Tensor& found_inf, double growth_factor, double backoff_factor,
                     int64_t growth_interval, const std::optional<at::Tensor>& hysteresis_remaining,
                     const std::optional<at::Tensor>& counters, int64_t hysteresis,
                     bool consecutive_hysteresis, double min_scale,
                     std::optional<double> max_scale) {
    const UpdateState state{scale, growth_tracker, found_inf, hysteresis_remaining, counters};
    kApply(state, check_update_args(state, growth_factor, backoff_factor, growth_interval,
                                    hysteresis, consecutive_hysteresis, min_scale, max_scale));
  }
};

struct UnscaleNorm {
  static constexpr const char* kName = "unscale_norm";
  static constexpr const char* kSchema =
      "unscale_norm(Tensor[] grads, Tensor(a!) found_inf, Tensor inv_scale, bool per_tensor=False) "
      "-> (Tensor total_norm, Tensor per_tensor_norms)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(at::TensorList grads,
                                                       const at::Tensor& found_inf,
                                                       const at::Tensor& inv_scale,
                                                       bool per_tensor);
};

struct ClipUnscaled {
  static constexpr const char* kName = "clip_unscaled_";
  static constexpr const char* kSchema =
      "clip_unscaled_(Tensor(a!)[] grads, Tensor inv_scale, Tensor total_norm, float max_norm, "
      "float eps=1e-06) -> ()";
  using Signature = void(at::TensorList grads, const at::Tensor& inv_scale,
                         const at::Tensor& total_norm, double max_norm, double eps);
};

/// The op's typed dispatcher handle (looked up once per op).
template <typename Op>
const c10::TypedOperatorHandle<typename Op::Signature>& handle() {
  static const auto typed = c10::Dispatcher::singleton()
                                .findSchemaOrThrow((std::string("amp::") + Op::kName).c_str(), "")
                                .template typed<typename Op::Signature>();
  return typed;
}

/// Registers `kKernel` as Op's kernel in a TORCH_LIBRARY_IMPL block.
template <typename Op, typename Op::Signature* kKernel>
void impl(torch::Library& library) {
  library.impl(Op::kName, c10::CompileTimeFunctionPointer<typename Op::Signature, kKernel>());
}

/// Registers one backend's kernels for every op (the backend's TORCH_LIBRARY_IMPL block is this
/// one call): the unscale, the update's device step (see UpdateScale::kernel), norm and clip.
template <NonFiniteCheckAndUnscale::Signature* kUnscale,
          void (*kUpdate)(const UpdateState&, const UpdateRule&),
          UnscaleNorm::Signature* kUnscaleNorm, ClipUnscaled::Signature* kClip>
void register_kernels(torch::Library& library) {
  impl<NonFiniteCheckAndUnscale, kUnscale>(library);
  impl<UpdateScale, UpdateScale::kernel<kUpdate>>(library);
  impl<UnscaleNorm, kUnscaleNorm>(library);
  impl<ClipUnscaled, kClip>(library);
}

}  // namespace amp::detail::ops
