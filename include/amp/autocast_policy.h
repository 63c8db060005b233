// Autocast policies for users' own operators (registered with TORCH_LIBRARY): how an autocast
// region casts their arguments, as ATen does for its built-in ops.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/library.h>

#include <string>

#include <amp/export.h>

namespace amp {

/// How an operator's floating-point tensor arguments are cast inside an autocast region.
/// In every policy, tensors on other device types, float64 tensors, non-floating tensors and
/// arguments the operator writes to (in-place or out= arguments) are passed through unchanged.
enum class AutocastPolicy {
  /// Cast to the region's lower-precision dtype (bf16/fp16), like mm, linear and conv. Casts of
  /// fp32 weights (leaves that require grad) come from autocast's weight-cast cache.
  lower_precision,
  /// Cast to float32, like the losses and other numerically sensitive ops.
  fp32,
  /// Cast to the widest floating dtype among the eligible arguments, like cat and stack: the
  /// region's lower-precision dtype when all are in it, else float32.
  promote,
};

/// A boxed kernel that applies `policy` to any operator, for a registration block on the
/// autocast dispatch key of `device` (AutocastCPU for kCPU, AutocastCUDA for kCUDA, ...):
///
///     TORCH_LIBRARY_IMPL(myops, AutocastCPU, m) {
///       m.impl("fused_gelu", amp::autocast_kernel(torch::kCPU, amp::AutocastPolicy::fp32));
///     }
///
/// When called inside an autocast region the kernel excludes the autocast key (so the op does
/// not come back to it), casts the arguments, and calls the operator again, which reaches the
/// backend kernel (through autograd, so the casts are differentiable). Works for any schema.
/// Args: device: the device type whose autocast key the kernel is registered on; policy: the
///   cast to apply.
/// Returns: the kernel, to pass to torch::Library::impl.
/// Errors: c10::Error when `device` has no autocast dispatch key.
AMP_EXPORT torch::CppFunction autocast_kernel(c10::DeviceType device, AutocastPolicy policy);

/// One-line form of the registration above, for use at run time (say from main, after the
/// library defining the operator is loaded): registers autocast_kernel(device, policy) for the
/// operator `qualified_name` ("namespace::name" or "namespace::name.overload") on the autocast
/// key of `device`. The registration lasts until the process ends; registering the same
/// operator and device type again replaces the previous policy.
/// Args: qualified_name: the operator; device: kCPU, kCUDA or another autocast device type;
///   policy: the cast to apply.
/// Errors: c10::Error when the name is not qualified, no such operator is defined, or `device`
///   has no autocast dispatch key.
AMP_EXPORT void register_autocast(const std::string& qualified_name, c10::DeviceType device,
                                  AutocastPolicy policy);

}  // namespace amp
