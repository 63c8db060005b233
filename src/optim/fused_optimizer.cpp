// The non-template parts of detail::FusedOptimizer: the scaling hand-over per device and the
// capturable learning-rate tensors.
#include "optim/fused_optimizer.h"

#include <ATen/ATen.h>

namespace amp::optim::detail {

StepScaling::StepScaling(const SupportsAmpScaling& optimizer)
    : grad_scale_(optimizer.grad_scale()), found_inf_(optimizer.found_inf()) {}

std::optional<at::Tensor> StepScaling::on(const at::Tensor& source,
                                          std::vector<std::pair<c10::Device, at::Tensor>>& copies,
                                          const c10::Device& device) {
  if (!source.defined()) return std::nullopt;
  if (source.device() == device) return source;
  for (const auto& [dev, copy] : copies) {
    if (dev == device) return copy;
  }
  copies.emplace_back(device, source.to(device, /*non_blocking=*/true));
  return copies.back().second;
}

std::optional<at::Tensor> StepScaling::grad_scale(const c10::Device& device) {
  return on(grad_scale_, grad_scale_copies_, device);
}

std::optional<at::Tensor> StepScaling::found_inf(const c10::Device& device) {
  return on(found_inf_, found_inf_copies_, device);
}

const at::Tensor& capturable_lr(std::vector<std::pair<double, at::Tensor>>& cache,
                                size_t group_index, double lr, const c10::Device& device) {
  if (cache.size() <= group_index) cache.resize(group_index + 1);
  auto& [value, tensor] = cache[group_index];
  if (!tensor.defined() || tensor.device() != device) {
    tensor = at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(device));
    value = lr;
  } else if (value != lr) {
    tensor.fill_(lr);  // in place: a captured graph reads this address
    value = lr;
  }
  return tensor;
}

std::string group_where(const char* name, size_t group_index) {
  return std::string(name) + " (param group " + std::to_string(group_index) + ")";
}

}  // namespace amp::optim::detail
