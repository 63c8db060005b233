// amp::to_low_precision: casts a module tree's floating tensors, subtree by subtree, skipping
// the subtrees the keep predicate selects.
#include <amp/low_precision.h>

#include <amp/detail/buffer_roles.h>

#include <array>
#include <string_view>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace amp {
namespace {

void cast_in_place(at::Tensor& tensor, c10::ScalarType dtype) {
  if (!tensor.defined() || !at::isFloatingType(tensor.scalar_type()) ||
      tensor.scalar_type() == dtype) {
    return;
  }
  tensor.set_data(tensor.detach().to(dtype));
  if (tensor.grad().defined()) tensor.mutable_grad() = tensor.grad().to(dtype);
}

void cast_tree(torch::nn::Module& module, const std::string& name, c10::ScalarType dtype,
               const KeepPredicate& keep) {
  if (keep && keep(name, module)) return;
  for (auto& param : module.named_parameters(/*recurse=*/false))
    cast_in_place(param.value(), dtype);
  // Buffers a module declares float32 (a float8 layer's amax histories and scales) stay so.
  for (auto& buffer : module.named_buffers(/*recurse=*/false)) {
    if (!detail::keeps_float32_buffer(module, buffer.key())) cast_in_place(buffer.value(), dtype);
  }
  for (const auto& child : module.named_children()) {
    cast_tree(*child.value(), name.empty() ? child.key() : name + "." + child.key(), dtype, keep);
  }
}

}  // namespace

bool is_normalization(const std::string& /*name*/, const torch::nn::Module& module) {
  static constexpr std::array<std::string_view, 10> kNames = {
      "torch::nn::BatchNorm1dImpl",       "torch::nn::BatchNorm2dImpl",
      "torch::nn::BatchNorm3dImpl",       "torch::nn::InstanceNorm1dImpl",
      "torch::nn::InstanceNorm2dImpl",    "torch::nn::InstanceNorm3dImpl",
      "torch::nn::LayerNormImpl",         "torch::nn::GroupNormImpl",
      "torch::nn::LocalResponseNormImpl", "torch::nn::CrossMapLRN2dImpl"};
  const std::string& type = module.name();
  for (const auto& candidate : kNames) {
    if (type == candidate) return true;
  }
  return false;
}

void to_low_precision(torch::nn::Module& module, c10::ScalarType dtype, const KeepPredicate& keep) {
  TORCH_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf,
              "amp::to_low_precision: dtype must be BFloat16 or Half. Got dtype=", dtype,
              "; for float32 use module.to(torch::kFloat).");
  at::NoGradGuard no_grad;
  cast_tree(module, "", dtype, keep);
}

}  // namespace amp
