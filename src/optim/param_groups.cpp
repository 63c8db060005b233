// The fused optimizers' param groups: parameter and gradient checks, dtype buckets, adoption.
#include "optim/param_groups.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace amp::optim::detail {

namespace {

std::string param_name(size_t group_index, size_t index) {
  return "parameter " + std::to_string(index) + " of group " + std::to_string(group_index);
}

void check_param(const at::Tensor& param, size_t group_index, size_t index, const char* optimizer,
                 bool capturable) {
  TORCH_CHECK(param.defined(), optimizer, ": ", param_name(group_index, index),
              " is an undefined tensor; pass the model's parameters.");
  TORCH_CHECK(at::isFloatingType(param.scalar_type()), optimizer, ": ",
              param_name(group_index, index), " has dtype ", param.scalar_type(),
              ", but ATen's fused optimizer kernels update floating-point parameters only "
              "(float32, float64, float16, bfloat16); leave it out of the optimizer.");
  const auto type = param.device().type();
  TORCH_CHECK(type == c10::kCPU || type == c10::kCUDA, optimizer, ": ",
              param_name(group_index, index), " is on ", param.device(),
              ", but amp's fused optimizers run on CPU and CUDA; use LibTorch's optimizers "
              "for other devices.");
  TORCH_CHECK(!capturable || type == c10::kCUDA, optimizer, ": ", param_name(group_index, index),
              " is on ", param.device(),
              ", but capturable(true) keeps the step state on the "
              "device for CUDA graph capture and needs CUDA parameters; use capturable(false) "
              "on the CPU.");
}

}  // namespace

GroupWork collect_group(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                        const char* optimizer, bool capturable) {
  GroupWork work;
  std::optional<size_t> first;
  const auto& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& param = params[i];
    check_param(param, group_index, i, optimizer, capturable);
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    TORCH_CHECK(grad.layout() == c10::kStrided, optimizer, ": the gradient of ",
                param_name(group_index, i),
                " is sparse, and ATen's fused optimizer kernels "
                "take dense gradients only; use a dense gradient (e.g. torch::nn::Embedding "
                "with sparse(false)) or LibTorch's non-fused optimizer for this parameter.");
    TORCH_CHECK(grad.scalar_type() == param.scalar_type() && grad.device() == param.device() &&
                    grad.sizes() == param.sizes(),
                optimizer, ": the gradient of ", param_name(group_index, i), " is ",
                grad.scalar_type(), " ", grad.sizes(), " on ", grad.device(),
                " but the parameter is ", param.scalar_type(), " ", param.sizes(), " on ",
                param.device(), "; a gradient must match its parameter.");
    if (!first) {
      first = i;
      work.device = param.device();
    }
    TORCH_CHECK(param.device() == work.device, optimizer, ": ", param_name(group_index, i),
                " is on ", param.device(), " but ", param_name(group_index, *first), " is on ",
                work.device,
                "; the parameters of one group must share a device (make one "
                "param group per device).");
    auto bucket = std::find_if(work.params_by_dtype.begin(), work.params_by_dtype.end(),
                               [&](const auto& b) { return b.first == param.scalar_type(); });
    if (bucket == work.params_by_dtype.end()) {
      bucket = work.params_by_dtype.insert(work.params_by_dtype.end(), {param.scalar_type(), {}});
    }
    bucket->second.push_back(param);
  }
  return work;
}

void check_params(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                  const char* optimizer, bool capturable) {
  const auto& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    check_param(params[i], group_index, i, optimizer, capturable);
  }
}

void deduplicate_params(const std::vector<torch::optim::OptimizerParamGroup>& existing,
                        std::vector<torch::optim::OptimizerParamGroup>& added, size_t first_index,
                        const char* optimizer) {
  // Where each parameter already is: (group, index in that group).
  std::unordered_map<const c10::TensorImpl*, std::pair<size_t, size_t>> owner;
  for (size_t g = 0; g < existing.size(); ++g) {
    const auto& params = existing[g].params();
    for (size_t i = 0; i < params.size(); ++i)
      owner.emplace(params[i].unsafeGetTensorImpl(), std::pair{g, i});
  }
  for (size_t a = 0; a < added.size(); ++a) {
    const size_t g = first_index + a;
    std::vector<at::Tensor> kept;
    const auto& params = added[a].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto [where, fresh] =
          owner.emplace(params[i].unsafeGetTensorImpl(), std::pair{g, kept.size()});
      if (fresh) {
        kept.push_back(params[i]);
        continue;
      }
      TORCH_CHECK(where->second.first == g, optimizer, ": ", param_name(g, i), " is also ",
                  param_name(where->second.first, where->second.second),
                  "; which group's options would apply to it is ambiguous (Python's optimizers "
                  "refuse this too). List each parameter in one group only.");
    }
    added[a].params() = std::move(kept);
  }
}

void adopt_groups(torch::optim::Optimizer& optimizer,
                  std::vector<torch::optim::OptimizerParamGroup> groups) {
  for (auto& group : groups) {
    optimizer.add_param_group(group);
    optimizer.param_groups().back().set_options(group.options().clone());
  }
}

void check_finite_at_least(double value, double low, const char* name, const std::string& where,
                           const char* advice) {
  TORCH_CHECK(std::isfinite(value) && value >= low, where, ": ", name,
              " must be finite and >= ", low, ". Got ", name, "=", value, "; ", advice);
}

}  // namespace amp::optim::detail
