// amp::optim::Adam and AdamW: LibTorch's Adam and AdamW running the op sequence of Python's
// torch.optim.Adam / AdamW (their default CPU path), so a run moved between the languages goes on
// bit for bit.
#pragma once

#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <amp/export.h>

namespace amp::optim {

/// torch::optim::Adam with Python's arithmetic. LibTorch's own Adam and AdamW update the first
/// moment as `m.mul_(beta1).add_(g, 1 - beta1)` where Python's use `m.lerp_(g, 1 - beta1)`: two
/// roundings against one, in kernels whose vector code depends on the CPU. On some machines the
/// two sequences were seen to give different bits from the second step on, on others (an
/// AVX-512 AMD EPYC, 5 steps of the tests' data) the same bits; nothing promises either. This
/// class runs the ATen ops of Python's single-tensor step in Python's order, so its results
/// equal `torch.optim.Adam(..., foreach=False)`'s bit for bit on every machine (and, for float32
/// and complex parameters, the foreach path's; for bf16 ones its _foreach_mul_ rounds the decay
/// factors to bf16 first). Options, state, save/load and `amp::GradScaler`'s step
/// are LibTorch's Adam's; `amp::save_optimizer_state_dict` marks its files `"foreach": False`.
/// The options are checked as amp's FusedAdam checks them (a sentence naming the group, the
/// value and the fix).
class AMP_EXPORT Adam : public torch::optim::Adam {
 public:
  explicit Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                torch::optim::AdamOptions defaults = {});
  explicit Adam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults = {});
  at::Tensor step(LossClosure closure = nullptr) override;
};

/// torch::optim::AdamW with Python's arithmetic: `torch.optim.AdamW(..., foreach=False)` bit for
/// bit (see Adam for how LibTorch's may differ and what is kept).
class AMP_EXPORT AdamW : public torch::optim::AdamW {
 public:
  explicit AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                 torch::optim::AdamWOptions defaults = {});
  explicit AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {});
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace amp::optim
