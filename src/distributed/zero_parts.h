// What ZeroRedundancyOptimizer's step and its checkpoints share: sizes, copies of param groups,
// and an optimizer's state moved as bytes or between optimizers over the same parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace amp::distributed::detail {

/// A parameter's size for the partition: its bytes.
int64_t param_bytes(const at::Tensor& param);

/// The groups with the same parameters and copies of their options.
std::vector<torch::optim::OptimizerParamGroup> clone_groups(
    const std::vector<torch::optim::OptimizerParamGroup>& groups);

/// `optimizer.save` as the bytes of a LibTorch archive, and `optimizer.load` from them.
std::string to_bytes(const torch::optim::Optimizer& optimizer);
void from_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes);

/// Moves the state entries of `params` from `from` to `to` (both over these parameters); a
/// parameter without state in `from` has none in `to` afterwards.
void move_states(torch::optim::Optimizer& from, torch::optim::Optimizer& to,
                 const std::vector<at::Tensor>& params);

}  // namespace amp::distributed::detail
