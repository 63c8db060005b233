// GPU tests of the fused optimizers' low-precision modes: the CUDA kernels give the CPU kernels'
// bits (same element arithmetic) for every family, write-back and dtype, across chunk and launch
// boundaries and on misaligned views; a skipped step changes nothing and the step never
// synchronises with the host; checkpoints resume on the GPU.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/cuda_syncs.h"
#include "support/optim_helpers.h"

using amp::optim::FusedAdam;
using amp::optim::FusedAdamOptions;
using amp::optim::FusedSGDParamState;
using amp_test::syncs_in;

namespace {

const torch::Device kCuda(torch::kCUDA);
const torch::Device kCpu(torch::kCPU);

enum class Family { kAdamW, kAdamAmsgradL2, kSgdNesterov, kSgdPlain, kLion };
enum class Mode { kNearest, kMaster, kKahan, kStochastic };

std::string describe(Family family, Mode mode, torch::Dtype dtype) {
  const char* families[] = {"AdamW", "Adam (amsgrad, L2, fp32 state)",
                            "SGD (Nesterov, weight decay, fp16 state)", "SGD (no momentum)",
                            "Lion (weight decay)"};
  const char* modes[] = {"round to nearest", "master weights", "Kahan", "stochastic rounding"};
  return std::string(families[static_cast<int>(family)]) + ", " + modes[static_cast<int>(mode)] +
         ", " + (dtype == torch::kBFloat16 ? "bf16" : "fp16");
}

template <typename Options>
Options with_mode(Options o, Mode mode) {
  return o.master_weights(mode == Mode::kMaster)
      .kahan_summation(mode == Mode::kKahan)
      .stochastic_rounding(mode == Mode::kStochastic)
      .rounding_seed(77);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Family family, Mode mode,
                                                        const std::vector<torch::Tensor>& params) {
  switch (family) {
    case Family::kAdamW: {
      auto o = with_mode(FusedAdamWOptions(3e-3).weight_decay(0.1), mode);
      // Round to nearest needs one option to take amp's kernel: the state dtype.
      if (mode == Mode::kNearest) o.state_dtype(torch::kBFloat16);
      return std::make_unique<FusedAdamW>(params, o);
    }
    case Family::kAdamAmsgradL2:
      return std::make_unique<FusedAdam>(
          params, with_mode(FusedAdamOptions(1e-2).amsgrad(true).weight_decay(0.05), mode)
                      .state_dtype(torch::kFloat));
    case Family::kSgdNesterov:
      return std::make_unique<FusedSGD>(
          params,
          with_mode(FusedSGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01), mode)
              .state_dtype(torch::kHalf));
    case Family::kSgdPlain: {
      auto o = with_mode(FusedSGDOptions(0.1).maximize(true), mode);
      if (mode == Mode::kNearest) o.state_dtype(torch::kFloat);
      return std::make_unique<FusedSGD>(params, o);
    }
    case Family::kLion:
      // Round to nearest without a state dtype keeps the momentum in the parameter's dtype.
      return std::make_unique<amp::optim::FusedLion>(
          params, with_mode(amp::optim::FusedLionOptions(1e-3).weight_decay(0.1), mode));
  }
  return nullptr;
}

// Chunk boundaries of the CUDA kernel (16384 elements a block), a size under one vector, a
// prime, and a view at storage offset 1 (2-byte aligned only).
const std::vector<int64_t> kSizes = {1, 7, 16384, 16385, 3 * 16384 + 5, 40009};

std::vector<torch::Tensor> make_params(torch::Device device, torch::Dtype dtype) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> params;
  for (int64_t n : kSizes) {
    params.push_back(torch::randn({n}).to(dtype).to(device).requires_grad_(true));
  }
  const auto base = torch::randn({1002}).to(dtype).to(device);
  params.push_back(base.narrow(0, 1, 1001).detach().requires_grad_(true));
  return params;
}

// Gradients of step k, the same values on both devices, already multiplied by the scale.
void set_grads(const std::vector<torch::Tensor>& params, int k, double scale, bool poison) {
  torch::manual_seed(1000 + k);
  for (const auto& p : params) {
    auto g = (torch::randn(p.sizes()) * 0.02 * scale).to(p.scalar_type());
    if (poison && p.numel() == 16385) g[16384] = std::numeric_limits<float>::infinity();
    p.mutable_grad() = g.to(p.device());
  }
}

// Every state tensor of every parameter, in parameter order, on the CPU.
std::vector<torch::Tensor> state_tensors(torch::optim::Optimizer& opt,
                                         const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  const auto add = [&](const torch::Tensor& t) {
    if (t.defined()) out.push_back(t.detach().cpu());
  };
  for (const auto& p : params) {
    auto& state = *opt.state().at(p.unsafeGetTensorImpl());
    if (auto* adam = dynamic_cast<FusedAdamParamState*>(&state)) {
      for (const auto& t : {adam->step(), adam->exp_avg(), adam->exp_avg_sq(),
                            adam->max_exp_avg_sq(), adam->master_weight(), adam->kahan_comp()}) {
        add(t);
      }
    } else if (auto* lion = dynamic_cast<amp::optim::FusedLionParamState*>(&state)) {
      for (const auto& t :
           {lion->step(), lion->exp_avg(), lion->master_weight(), lion->kahan_comp()}) {
        add(t);
      }
    } else {
      auto& sgd = dynamic_cast<FusedSGDParamState&>(state);
      for (const auto& t :
           {sgd.step(), sgd.momentum_buffer(), sgd.master_weight(), sgd.kahan_comp()}) {
        add(t);
      }
    }
  }
  return out;
}

// Steps two optimizers side by side on the same unscaled gradients of steps first .. end - 1.
void step_both(const std::vector<torch::Tensor>& a_params, torch::optim::Optimizer& a_opt,
               const std::vector<torch::Tensor>& b_params, torch::optim::Optimizer& b_opt,
               int first, int end) {
  for (int k = first; k < end; ++k) {
    set_grads(a_params, k, 1.0, false);
    set_grads(b_params, k, 1.0, false);
    a_opt.step();
    b_opt.step();
  }
}

std::vector<torch::Tensor> on_cpu(const std::vector<torch::Tensor>& ts, bool grads = false) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back((grads ? t.grad() : t).detach().cpu());
  return out;
}

}  // namespace

TEST_CASE("CUDA low-precision steps give the CPU's bits: every family, write-back and dtype",
          "[optim][low_precision][cuda]") {
  const Family family = GENERATE(Family::kAdamW, Family::kAdamAmsgradL2, Family::kSgdNesterov,
                                 Family::kSgdPlain, Family::kLion);
  const Mode mode = GENERATE(Mode::kNearest, Mode::kMaster, Mode::kKahan, Mode::kStochastic);
  const torch::Dtype dtype = GENERATE(torch::kBFloat16, torch::kHalf);
  if (mode == Mode::kStochastic && dtype == torch::kHalf) return;  // refused (tested on the CPU)
  INFO(describe(family, mode, dtype));

  auto cpu_params = make_params(kCpu, dtype);
  auto gpu_params = make_params(kCuda, dtype);
  auto cpu_opt = make_optimizer(family, mode, cpu_params);
  auto gpu_opt = make_optimizer(family, mode, gpu_params);
  amp::GradScaler cpu_scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(1024.0));
  amp::GradScaler gpu_scaler(c10::DeviceType::CUDA, amp::GradScalerOptions().init_scale(1024.0));
  for (int k = 0; k < 4; ++k) {
    INFO("step " << k);
    const bool poison = k == 2;  // an inf in the second chunk of one parameter: skipped
    const double scale = cpu_scaler.get_scale();
    set_grads(cpu_params, k, scale, poison);
    set_grads(gpu_params, k, scale, poison);
    const auto before = on_cpu(gpu_params);
    // The scalers start at their first scale() (the gradients were scaled by hand above).
    (void)cpu_scaler.scale(torch::ones({}));
    (void)gpu_scaler.scale(torch::ones({}, kCuda));
    cpu_scaler.step(*cpu_opt);
    gpu_scaler.step(*gpu_opt);
    cpu_scaler.update();
    gpu_scaler.update();
    CHECK(gpu_scaler.get_scale() == cpu_scaler.get_scale());
    CHECK(all_same_bits(on_cpu(gpu_params), on_cpu(cpu_params)));
    CHECK(all_same_bits(on_cpu(gpu_params, true), on_cpu(cpu_params, true)));  // unscaled
    CHECK(all_same_bits(state_tensors(*gpu_opt, gpu_params), state_tensors(*cpu_opt, cpu_params)));
    if (poison) {
      CHECK(all_same_bits(on_cpu(gpu_params), before));
    } else {
      CHECK_FALSE(all_same_bits(on_cpu(gpu_params), before));
    }
  }
}

TEST_CASE("CUDA FusedLion on float32 parameters gives the CPU's bits, skipped steps included",
          "[optim][lion][cuda]") {
  // The rule's fused multiply-adds are __fmaf_rn on the GPU and fmaf on the CPU: one rounding
  // each, the same bits; the sizes cross the kernel's chunks and its 8-element vector path.
  auto cpu_params = make_params(kCpu, torch::kFloat);
  auto gpu_params = make_params(kCuda, torch::kFloat);
  amp::optim::FusedLion cpu_opt(cpu_params, amp::optim::FusedLionOptions(1e-3).weight_decay(0.1));
  amp::optim::FusedLion gpu_opt(gpu_params, amp::optim::FusedLionOptions(1e-3).weight_decay(0.1));
  amp::GradScaler cpu_scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(1024.0));
  amp::GradScaler gpu_scaler(c10::DeviceType::CUDA, amp::GradScalerOptions().init_scale(1024.0));
  for (int k = 0; k < 4; ++k) {
    INFO("step " << k);
    const bool poison = k == 1;
    const double scale = cpu_scaler.get_scale();
    set_grads(cpu_params, k, scale, poison);
    set_grads(gpu_params, k, scale, poison);
    (void)cpu_scaler.scale(torch::ones({}));
    (void)gpu_scaler.scale(torch::ones({}, kCuda));
    cpu_scaler.step(cpu_opt);
    gpu_scaler.step(gpu_opt);
    cpu_scaler.update();
    gpu_scaler.update();
    CHECK(all_same_bits(on_cpu(gpu_params), on_cpu(cpu_params)));
    CHECK(all_same_bits(state_tensors(gpu_opt, gpu_params), state_tensors(cpu_opt, cpu_params)));
  }
}

TEST_CASE("A CUDA low-precision step with GradScaler never synchronises with the host",
          "[optim][low_precision][cuda]") {
  const Mode mode = GENERATE(Mode::kMaster, Mode::kKahan, Mode::kStochastic);
  const bool sgd = GENERATE(false, true);
  INFO(describe(sgd ? Family::kSgdNesterov : Family::kAdamW, mode, torch::kBFloat16));
  auto params = make_params(kCuda, torch::kBFloat16);
  auto opt = make_optimizer(sgd ? Family::kSgdNesterov : Family::kAdamW, mode, params);
  amp::GradScaler scaler(c10::DeviceType::CUDA, amp::GradScalerOptions().init_scale(256.0));
  for (int k = 0; k < 4; ++k) {
    INFO("step " << k);
    (void)scaler.scale(torch::ones({}, kCuda));  // starts the scaler at step 0
    set_grads(params, k, scaler.get_scale(), /*poison=*/k == 2);
    torch::cuda::synchronize();
    // Step 0 creates the state (a warm-up, not counted); the others must read nothing back.
    const int syncs = syncs_in([&] {
      scaler.step(*opt);
      scaler.update();
    });
    if (k > 0) CHECK(syncs == 0);
  }
  // Three steps taken (0, 1, 3), one skipped: the counts stayed on the device and say so.
  for (const auto& t : state_tensors(*opt, params)) {
    if (t.dim() == 0) CHECK(t.item<float>() == 3.0f);
  }
}

TEST_CASE("Over a hundred parameters and one larger than a launch: each counted once, CPU bits",
          "[optim][low_precision][cuda]") {
  const bool sgd = GENERATE(false, true);
  INFO((sgd ? "FusedSGD with Kahan" : "FusedAdamW with stochastic rounding"));
  const auto build = [&](torch::Device device) {
    torch::manual_seed(11);
    std::vector<torch::Tensor> params;
    for (int k = 0; k < 130; ++k) {
      params.push_back(
          torch::randn({100 + k}).to(torch::kBFloat16).to(device).requires_grad_(true));
    }
    // 2048 blocks of 16384 elements fill one launch; this one spills into a second.
    params.push_back(
        torch::randn({2049 * 16384 + 3}).to(torch::kBFloat16).to(device).requires_grad_(true));
    return params;
  };
  auto cpu_params = build(kCpu);
  auto gpu_params = build(kCuda);
  const Mode mode = sgd ? Mode::kKahan : Mode::kStochastic;
  const Family family = sgd ? Family::kSgdNesterov : Family::kAdamW;
  auto cpu_opt = make_optimizer(family, mode, cpu_params);
  auto gpu_opt = make_optimizer(family, mode, gpu_params);
  step_both(cpu_params, *cpu_opt, gpu_params, *gpu_opt, 0, 2);
  CHECK(all_same_bits(on_cpu(gpu_params), on_cpu(cpu_params)));
  const auto gpu_state = state_tensors(*gpu_opt, gpu_params);
  CHECK(all_same_bits(gpu_state, state_tensors(*cpu_opt, cpu_params)));
  for (const auto& t : gpu_state) {
    if (t.dim() == 0) CHECK(t.item<float>() == 2.0f);
  }
}

TEST_CASE("A CUDA checkpoint of a low-precision optimizer resumes bit for bit on the GPU",
          "[optim][low_precision][cuda]") {
  const Mode mode = GENERATE(Mode::kMaster, Mode::kKahan, Mode::kStochastic);
  const bool sgd = GENERATE(false, true);
  const Family family = sgd ? Family::kSgdNesterov : Family::kAdamW;
  INFO(describe(family, mode, torch::kBFloat16));
  auto straight = make_params(kCuda, torch::kBFloat16);
  auto straight_opt = make_optimizer(family, mode, straight);
  for (int k = 0; k < 2; ++k) {
    set_grads(straight, k, 1.0, false);
    straight_opt->step();
  }
  std::stringstream saved;
  torch::save(*straight_opt, saved);
  auto resumed = make_params(kCuda, torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < resumed.size(); ++i) resumed[i].copy_(straight[i]);
  }
  auto resumed_opt = make_optimizer(family, mode, resumed);
  torch::load(*resumed_opt, saved);
  step_both(straight, *straight_opt, resumed, *resumed_opt, 2, 4);
  CHECK(all_same_bits(on_cpu(resumed), on_cpu(straight)));
  CHECK(
      all_same_bits(state_tensors(*resumed_opt, resumed), state_tensors(*straight_opt, straight)));
  // The loaded state lives on the parameters' device, counts included.
  for (const auto& p : resumed) {
    auto& state = *resumed_opt->state().at(p.unsafeGetTensorImpl());
    if (auto* adam = dynamic_cast<FusedAdamParamState*>(&state)) {
      CHECK(adam->step().is_cuda());
    } else {
      CHECK(dynamic_cast<FusedSGDParamState&>(state).step().is_cuda());
    }
  }
}
