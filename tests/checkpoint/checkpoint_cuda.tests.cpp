// GPU tests of amp::checkpoint: a block with dropout under CUDA bf16 autocast recomputes the
// forward's bits (the CUDA generator's state restored, not only the CPU's), the generator goes on
// from where backward found it, and a checkpointed deep MLP holds less CUDA memory after its
// forward than the plain one; a CUDA tensor nested in the arguments restores its generator too.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <c10/cuda/CUDACachingAllocator.h>

#include <optional>
#include <vector>

#include <amp/autocast.h>
#include <amp/checkpoint.h>

#include "support/bits.h"

namespace {

const torch::Device kCuda(torch::kCUDA);

// Linear -> dropout -> GELU -> Linear on CUDA.
struct CudaBlock : torch::nn::Module {
  CudaBlock() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
    to(kCuda);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::gelu(torch::dropout(fc1(x), 0.3, /*train=*/true)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct CudaRun {
  torch::Tensor output, input_grad, fc1_grad, rng_after;
};

// `nested`: the input reaches the checkpoint inside a std::vector, not as a tensor argument.
CudaRun run_on_cuda(bool checkpointed, bool preserve_rng, bool nested = false) {
  torch::manual_seed(11);  // seeds the CPU and every CUDA generator
  auto block = std::make_shared<CudaBlock>();
  auto x = torch::randn({32, 64}, kCuda).requires_grad_(true);
  torch::Tensor out;
  {
    amp::AutocastGuard autocast(c10::DeviceType::CUDA, torch::kBFloat16);
    const auto opts = amp::CheckpointOptions().preserve_rng_state(preserve_rng);
    if (!checkpointed) {
      out = block->forward(x);
    } else if (nested) {
      out = amp::checkpoint(
          opts, [block](const std::vector<torch::Tensor>& v) { return block->forward(v[0]); },
          std::vector<torch::Tensor>{x});
    } else {
      out = amp::checkpoint(
          opts, [block](const torch::Tensor& t) { return block->forward(t); }, x);
    }
  }
  out.to(torch::kFloat).square().sum().backward();
  return {out.detach(), x.grad(), block->fc1->weight.grad().clone(), torch::rand({8}, kCuda)};
}

int64_t cuda_allocated() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
}

}  // namespace

TEST_CASE("A checkpointed block with dropout under CUDA bf16 autocast gives the plain bits",
          "[checkpoint][cuda]") {
  const auto plain = run_on_cuda(false, true);
  const auto checkpointed = run_on_cuda(true, true);
  CHECK(checkpointed.output.scalar_type() == torch::kBFloat16);
  CHECK(amp_test::same_bits(checkpointed.output, plain.output));
  CHECK(amp_test::same_bits(checkpointed.input_grad, plain.input_grad));
  CHECK(amp_test::same_bits(checkpointed.fc1_grad, plain.fc1_grad));
  // The CUDA generator continues after backward as after the plain run's backward.
  CHECK(amp_test::same_bits(checkpointed.rng_after, plain.rng_after));
  // Without preserve_rng_state the recomputation draws another CUDA dropout mask: what makes the
  // gradients equal above is the CUDA state restored, not luck.
  const auto loose = run_on_cuda(true, false);
  CHECK(amp_test::same_bits(loose.output, plain.output));
  CHECK_FALSE(amp_test::same_bits(loose.input_grad, plain.input_grad));
}

TEST_CASE("A CUDA tensor nested in a checkpoint's arguments restores the CUDA generator",
          "[checkpoint][cuda]") {
  // Python finds the devices of tensors inside lists, tuples and dicts; without them the
  // recomputation redraws the CUDA dropout mask and the gradients differ.
  const auto plain = run_on_cuda(false, true);
  const auto nested = run_on_cuda(true, true, /*nested=*/true);
  CHECK(amp_test::same_bits(nested.output, plain.output));
  CHECK(amp_test::same_bits(nested.input_grad, plain.input_grad));
  CHECK(amp_test::same_bits(nested.fc1_grad, plain.fc1_grad));
  CHECK(amp_test::same_bits(nested.rng_after, plain.rng_after));
}

TEST_CASE("A checkpointed deep MLP holds less CUDA memory after its forward, same gradients",
          "[checkpoint][cuda]") {
  torch::manual_seed(5);
  torch::nn::Sequential plain;
  for (int i = 0; i < 8; ++i) {
    plain->push_back(torch::nn::Linear(512, 512));
    plain->push_back(torch::nn::GELU());
  }
  plain->to(kCuda);
  const auto x = torch::randn({1024, 512}, kCuda);
  // The bytes a forward leaves allocated (its graph's saved tensors and the output), and the
  // gradients its backward gives.
  const auto measure = [&](bool checkpointed) {
    plain->zero_grad(/*set_to_none=*/true);
    torch::cuda::synchronize();
    const int64_t before = cuda_allocated();
    auto y = checkpointed ? amp::checkpoint_sequential(plain, 4, x) : plain->forward(x);
    torch::cuda::synchronize();
    const int64_t held = cuda_allocated() - before;
    y.square().mean().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : plain->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(held, grads);
  };
  const auto [plain_bytes, plain_grads] = measure(false);
  const auto [checkpointed_bytes, checkpointed_grads] = measure(true);
  // 16 modules in 4 segments: the first 3 segments keep only their inputs (2 MiB each) instead
  // of every Linear's input and GELU's input (12 tensors of 2 MiB); the last segment is plain.
  CAPTURE(plain_bytes, checkpointed_bytes);
  CHECK(checkpointed_bytes < plain_bytes / 2);
  REQUIRE(plain_grads.size() == checkpointed_grads.size());
  for (size_t i = 0; i < plain_grads.size(); ++i) {
    CHECK(amp_test::same_bits(checkpointed_grads[i], plain_grads[i]));
  }
}
