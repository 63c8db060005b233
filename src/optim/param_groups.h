// The fused optimizers' param groups: the checks on a group's parameters and gradients, their
// buckets by dtype, and adding groups with their own options types.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>

namespace amp::optim::detail {

/// The parameters of one group that have a gradient, all on `device`, split by dtype (ATen's
/// CUDA kernels take one dtype per call; the order within a bucket follows the group).
struct GroupWork {
  c10::Device device{c10::kCPU};
  std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> params_by_dtype;
  bool empty() const { return params_by_dtype.empty(); }
};

/// Collects and checks group `group_index`'s parameters with gradients: floating dtype, CPU or
/// CUDA (CUDA only when capturable), one device for the whole group, dense gradients of the
/// parameter's dtype, shape and device. Throws c10::Error naming `optimizer`, the group, the
/// parameter index and the fix.
GroupWork collect_group(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                        const char* optimizer, bool capturable);

/// Checks at construction what can be checked before gradients exist (dtype, device type).
void check_params(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                  const char* optimizer, bool capturable);

/// Keeps each parameter of `added` once within its group (LibTorch's Module::parameters() lists
/// a module registered under two names twice; stepping a tensor twice would apply two updates
/// and race on CUDA), and throws c10::Error naming `optimizer` and both places when a parameter
/// is also in another group (in `existing`, or earlier in `added`); `added`'s groups are
/// numbered from `first_index`.
void deduplicate_params(const std::vector<torch::optim::OptimizerParamGroup>& existing,
                        std::vector<torch::optim::OptimizerParamGroup>& added, size_t first_index,
                        const char* optimizer);

/// Adds `groups` (options already merged and checked) to `optimizer` with exactly those options:
/// Optimizer::add_param_group merges only LibTorch's own option types.
void adopt_groups(torch::optim::Optimizer& optimizer,
                  std::vector<torch::optim::OptimizerParamGroup> groups);

/// Throws "<where>: <name> must be finite and >= <low>. Got <name>=<value>; <advice>" unless
/// `value` is finite and >= `low`: the options' range checks share this wording.
void check_finite_at_least(double value, double low, const char* name, const std::string& where,
                           const char* advice);

}  // namespace amp::optim::detail
