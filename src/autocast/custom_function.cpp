// The non-template half of custom_fwd / custom_bwd: recording autocast state in an autograd
// context, reading it back, and custom_fwd's input cast.
#include <amp/custom_function.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace amp::detail {
namespace {

// Keys in AutogradContext::saved_data; the prefix keeps them apart from the user's own keys.
constexpr const char* kDeviceKey = "amp.autocast_device";
constexpr const char* kDtypeKey = "amp.autocast_dtype";
constexpr const char* kEnabledKey = "amp.autocast_enabled";

}  // namespace

bool record_forward_state(torch::autograd::AutogradContext* ctx, c10::DeviceType device,
                          bool casts_inputs) {
  TORCH_CHECK(ctx != nullptr,
              "amp::custom_fwd: ctx is null; pass the AutogradContext* that forward received.");
  TORCH_CHECK(at::autocast::is_autocast_available(device), "amp::custom_fwd: device type '",
              c10::DeviceTypeName(device, /*lower_case=*/true),
              "' has no autocast; use the device type of the tensors forward computes on "
              "(e.g. torch::kCUDA or torch::kCPU).");
  const bool autocast_on = at::autocast::is_autocast_enabled(device);
  ctx->saved_data[kDeviceKey] = static_cast<int64_t>(device);
  ctx->saved_data[kDtypeKey] = at::autocast::get_autocast_dtype(device);
  // With cast_inputs, forward ran in the cast dtype with autocast off, so backward must too.
  ctx->saved_data[kEnabledKey] = casts_inputs ? false : autocast_on;
  return autocast_on;
}

RecordedAutocastState recorded_autocast_state(torch::autograd::AutogradContext* ctx,
                                              c10::DeviceType device) {
  TORCH_CHECK(ctx != nullptr,
              "amp::custom_bwd: ctx is null; pass the AutogradContext* that backward received.");
  const auto device_it = ctx->saved_data.find(kDeviceKey);
  const auto dtype_it = ctx->saved_data.find(kDtypeKey);
  const auto enabled_it = ctx->saved_data.find(kEnabledKey);
  TORCH_CHECK(device_it != ctx->saved_data.end() && dtype_it != ctx->saved_data.end() &&
                  enabled_it != ctx->saved_data.end(),
              "amp::custom_bwd: the context holds no autocast state; wrap the body of this "
              "function's forward in amp::custom_fwd(ctx, ...) so backward can run under the "
              "same autocast state.");
  const auto recorded_device = static_cast<c10::DeviceType>(device_it->second.toInt());
  TORCH_CHECK(recorded_device == device, "amp::custom_bwd: device type '",
              c10::DeviceTypeName(device, /*lower_case=*/true), "' differs from the device type '",
              c10::DeviceTypeName(recorded_device, /*lower_case=*/true),
              "' that amp::custom_fwd recorded; pass the same device type to both.");
  return {recorded_device, dtype_it->second.toScalarType(), enabled_it->second.toBool()};
}

at::Tensor cast_forward_input(const at::Tensor& tensor, c10::DeviceType device,
                              c10::ScalarType dtype) {
  const bool eligible = tensor.defined() && tensor.is_floating_point() &&
                        tensor.device().type() == device && tensor.scalar_type() != at::kDouble;
  return eligible ? tensor.to(dtype) : tensor;
}

}  // namespace amp::detail
