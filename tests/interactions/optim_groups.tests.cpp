// amp's optimizers with param groups and with checkpoints: a group keeps every option it states
// (Python's rule, also for low-precision options that the defaults turn on), float32 groups under
// low-precision options, and a resume on channels-last parameters with the uninterrupted bits.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <memory>
#include <sstream>
#include <vector>

#include <amp/low_precision.h>
#include <amp/optim.h>

#include "support/optim_helpers.h"

using amp::optim::FusedAdam;
using amp::optim::FusedAdamOptions;
using amp::optim::FusedLion;
using amp::optim::FusedLionOptions;
using torch::optim::OptimizerParamGroup;

namespace {

std::vector<torch::Tensor> leaves(uint64_t seed, int count, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> v;
  for (int i = 0; i < count; ++i) v.push_back(torch::randn({5, 3}).to(dtype).requires_grad_(true));
  return v;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> v;
  for (const auto& p : params) v.push_back(p.detach().clone().requires_grad_(true));
  return v;
}

// Gives every parameter the gradient of step k (the same for equal shapes and seeds).
void set_grads(const std::vector<torch::Tensor>& params, int k) {
  torch::manual_seed(900 + k);
  for (const auto& p : params) p.mutable_grad() = torch::randn(p.sizes()).to(p.scalar_type());
}

template <typename Options>
const Options& group_options(const torch::optim::Optimizer& opt, size_t g) {
  return static_cast<const Options&>(opt.param_groups()[g].options());
}

}  // namespace

TEST_CASE("A param group keeps each option it sets, even one equal to the type's default",
          "[interactions][optim]") {
  // Python keeps what a group states; LibTorch would read lr(1e-3)... weight_decay(0) as "unset"
  // where 0 is the type's default and train the group at the optimizer's 0.01.
  auto params = leaves(1, 2);
  FusedAdam opt({OptimizerParamGroup({params[0]}, std::make_unique<FusedAdamOptions>(
                                                      FusedAdamOptions(1e-3).weight_decay(0.0))),
                 OptimizerParamGroup({params[1]})},
                FusedAdamOptions(1e-4).weight_decay(1e-2).eps(1e-6));
  const auto& stated = group_options<FusedAdamOptions>(opt, 0);
  CHECK(stated.lr() == 1e-3);
  CHECK(stated.weight_decay() == 0.0);
  CHECK(stated.eps() == 1e-6);  // not stated: the optimizer's
  const auto& inherited = group_options<FusedAdamOptions>(opt, 1);
  CHECK(inherited.lr() == 1e-4);
  CHECK(inherited.weight_decay() == 1e-2);
  // It trains as a one-group optimizer with the options it stated.
  auto alone = copies({params[0]});
  FusedAdam single(alone, FusedAdamOptions(1e-3).weight_decay(0.0).eps(1e-6));
  for (int k = 0; k < 3; ++k) {
    set_grads(params, k);
    set_grads(alone, k);
    opt.step();
    single.step();
  }
  CHECK(same_bits(params[0].detach(), alone[0].detach()));

  // The same for SGD's momentum and Lion's weight decay, and for add_param_group.
  auto more = leaves(2, 2);
  FusedSGD sgd({OptimizerParamGroup({more[0]}, std::make_unique<FusedSGDOptions>(
                                                   FusedSGDOptions(0.1).momentum(0.0)))},
               FusedSGDOptions(0.5).momentum(0.9).nesterov(false));
  sgd.add_param_group(OptimizerParamGroup(
      {more[1]},
      std::make_unique<FusedSGDOptions>(FusedSGDOptions(0.2).dampening(0.0).maximize(false))));
  CHECK(group_options<FusedSGDOptions>(sgd, 0).momentum() == 0.0);
  CHECK(group_options<FusedSGDOptions>(sgd, 1).momentum() == 0.9);
  CHECK(group_options<FusedSGDOptions>(sgd, 1).lr() == 0.2);
  auto lion_params = leaves(3, 1);
  FusedLion lion({OptimizerParamGroup({lion_params[0]}, std::make_unique<FusedLionOptions>(
                                                            FusedLionOptions().weight_decay(0.0)))},
                 FusedLionOptions(3e-4).weight_decay(0.1));
  CHECK(group_options<FusedLionOptions>(lion, 0).weight_decay() == 0.0);
  CHECK(group_options<FusedLionOptions>(lion, 0).lr() == 3e-4);  // FusedLionOptions() sets no lr
}

TEST_CASE("A param group can turn off a low-precision option the defaults turn on",
          "[interactions][optim][low_precision]") {
  auto bf16 = leaves(4, 2, torch::kBFloat16);
  auto norm = leaves(5, 1);  // float32, as amp::to_low_precision leaves normalisation layers
  SECTION("master_weights(false) for a group of float32 norm weights") {
    FusedAdamW opt({OptimizerParamGroup(bf16),
                    OptimizerParamGroup(norm, std::make_unique<FusedAdamWOptions>(
                                                  FusedAdamWOptions().master_weights(false)))},
                   FusedAdamWOptions(1e-3).master_weights(true));
    CHECK(group_options<FusedAdamWOptions>(opt, 0).master_weights());
    CHECK_FALSE(group_options<FusedAdamWOptions>(opt, 1).master_weights());
  }
  SECTION("a group choosing master weights under Kahan defaults gets master weights only") {
    for (const bool also_turns_kahan_off : {false, true}) {
      CAPTURE(also_turns_kahan_off);
      auto group = FusedAdamWOptions().master_weights(true);
      if (also_turns_kahan_off) group.kahan_summation(false);
      FusedAdamW opt({OptimizerParamGroup({bf16[0]}),
                      OptimizerParamGroup({bf16[1]}, std::make_unique<FusedAdamWOptions>(group))},
                     FusedAdamWOptions(1e-3).kahan_summation(true));
      CHECK(group_options<FusedAdamWOptions>(opt, 0).kahan_summation());
      CHECK(group_options<FusedAdamWOptions>(opt, 1).master_weights());
      CHECK_FALSE(group_options<FusedAdamWOptions>(opt, 1).kahan_summation());
      set_grads(bf16, 0);
      opt.step();
      const auto& state =
          static_cast<const FusedAdamParamState&>(*opt.state().at(bf16[1].unsafeGetTensorImpl()));
      CHECK(state.master_weight().defined());
      CHECK_FALSE(state.kahan_comp().defined());
    }
  }
  SECTION("a float32 group that states nothing is updated as without the options") {
    FusedAdamW opt({OptimizerParamGroup(bf16), OptimizerParamGroup(norm)},
                   FusedAdamWOptions(1e-3).master_weights(true));
    auto alone = copies(norm);
    FusedAdamW plain(alone, FusedAdamWOptions(1e-3));
    for (int k = 0; k < 3; ++k) {
      set_grads(bf16, k);
      set_grads(norm, k);
      set_grads(alone, k);
      opt.step();
      plain.step();
    }
    CHECK(same_bits(norm[0].detach(), alone[0].detach()));
    CHECK(opt.state().count(norm[0].unsafeGetTensorImpl()) == 1);
    CHECK_FALSE(
        static_cast<const FusedAdamParamState&>(*opt.state().at(norm[0].unsafeGetTensorImpl()))
            .master_weight()
            .defined());
  }
}

TEST_CASE("A bf16 model with decay and no-decay groups trains under master weights",
          "[interactions][optim][low_precision]") {
  // What a ported Python loop builds: amp::to_low_precision (norm layers stay float32), then
  // weight decay on the matrices only.
  torch::manual_seed(6);
  torch::nn::Sequential model(torch::nn::Linear(8, 16),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})),
                              torch::nn::Linear(16, 4));
  amp::to_low_precision(*model, torch::kBFloat16);
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->named_parameters()) {
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  }
  FusedAdamW opt({OptimizerParamGroup(decay),
                  OptimizerParamGroup(no_decay, std::make_unique<FusedAdamWOptions>(
                                                    FusedAdamWOptions().weight_decay(0.0)))},
                 FusedAdamWOptions(1e-3).weight_decay(0.1).master_weights(true));
  for (int k = 0; k < 2; ++k) {
    opt.zero_grad();
    model->forward(torch::randn({4, 8}, torch::kBFloat16))
        .to(torch::kFloat)
        .square()
        .mean()
        .backward();
    opt.step();
  }
  CHECK(group_options<FusedAdamWOptions>(opt, 1).weight_decay() == 0.0);
  CHECK(group_options<FusedAdamWOptions>(opt, 1).master_weights());
}

TEST_CASE("Resuming on channels-last parameters continues with the uninterrupted bits",
          "[interactions][optim][save_load]") {
  // A conv weight in channels-last: the loaded state keeps the parameter's layout (ATen's fused
  // CPU kernels walk parameter and state by one linear index).
  const auto make_param = [] {
    torch::manual_seed(7);
    return torch::randn({8, 4, 3, 3})
        .contiguous(torch::MemoryFormat::ChannelsLast)
        .requires_grad_(true);
  };
  const auto grad_for = [](const torch::Tensor& p, int k) {
    torch::manual_seed(950 + k);
    p.mutable_grad() = torch::randn(p.sizes()).contiguous(torch::MemoryFormat::ChannelsLast);
  };
  const auto check = [&](auto make_optimizer) {
    auto whole = make_param();
    auto whole_opt = make_optimizer(whole);
    for (int k = 0; k < 6; ++k) {
      grad_for(whole, k);
      whole_opt->step();
    }
    auto first = make_param();
    auto first_opt = make_optimizer(first);
    for (int k = 0; k < 3; ++k) {
      grad_for(first, k);
      first_opt->step();
    }
    std::stringstream file;
    torch::save(*first_opt, file);
    auto resumed = first.detach().clone(torch::MemoryFormat::Preserve).requires_grad_(true);
    auto resumed_opt = make_optimizer(resumed);
    torch::load(*resumed_opt, file);
    for (int k = 3; k < 6; ++k) {
      grad_for(resumed, k);
      resumed_opt->step();
    }
    CHECK(resumed.is_contiguous(torch::MemoryFormat::ChannelsLast));
    CHECK(same_bits(resumed.detach(), whole.detach()));
  };
  SECTION("FusedAdam") {
    check([](const torch::Tensor& p) {
      return std::make_unique<FusedAdam>(std::vector<torch::Tensor>{p}, FusedAdamOptions(1e-2));
    });
  }
  SECTION("FusedSGD with momentum") {
    check([](const torch::Tensor& p) {
      return std::make_unique<FusedSGD>(std::vector<torch::Tensor>{p},
                                        FusedSGDOptions(0.1).momentum(0.9));
    });
  }
  SECTION("FusedAdamW with amsgrad") {
    check([](const torch::Tensor& p) {
      return std::make_unique<FusedAdamW>(std::vector<torch::Tensor>{p},
                                          FusedAdamWOptions(1e-2).amsgrad(true));
    });
  }
}
