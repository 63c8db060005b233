// GPU tests of amp::fp8 (sm_89+): the float8 GEMMs on CUDA against the CPU emulation on the same
// float8 operands (exact where every sum is exact), whole layers against the CPU for every recipe,
// views and layouts, the sentence for dimensions at::_scaled_mm cannot take, delayed scaling's
// state on the device, and an fp8 training step captured in a CUDA graph.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>
#include <vector>

#include <amp/fp8.h>

#include "fp8/scaling.h"
#include "fp8_cuda_helpers.h"
#include "fp8_helpers.h"

using amp::fp8::detail::Float8Operand;
using Catch::Matchers::Contains;

namespace {

const torch::Device kCuda(torch::kCUDA);

double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  const auto a = actual.detach().cpu().to(torch::kDouble);
  const auto e = expected.detach().cpu().to(torch::kDouble);
  return ((a - e).norm() / e.norm()).item<double>();
}

// Small integers in float8 (exact in e4m3 and e5m2) with power-of-two scales: every product and
// every partial sum is exact in float32, so any summation order gives the same bits.
Float8Operand integer_operand(std::vector<int64_t> sizes, c10::ScalarType dtype, int64_t seed,
                              std::optional<int64_t> axis) {
  torch::manual_seed(seed);
  auto values = torch::randint(-6, 7, sizes).to(torch::kFloat);
  torch::Tensor scale;
  if (axis) {
    auto scale_sizes = sizes;
    scale_sizes[*axis < 0 ? sizes.size() - 1 : 0] = 1;
    scale = torch::pow(2.0, torch::randint(-3, 4, scale_sizes).to(torch::kFloat));
  } else {
    scale = torch::full({}, 0.25f);
  }
  return Float8Operand{values.to(dtype), scale, torch::kFloat, axis, {}};
}

Float8Operand to_cuda(const Float8Operand& op) {
  return Float8Operand{op.data.to(kCuda), op.scale.to(kCuda), op.orig_dtype, op.axiswise_dim, {}};
}

}  // namespace

TEST_CASE("Float8 GEMMs on CUDA give the CPU emulation's bits when every sum is exact",
          "[fp8][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const bool rowwise = GENERATE(false, true);
  const bool fast_accum = GENERATE(false, true);
  const auto out_dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  CAPTURE(rowwise, fast_accum, out_dtype);
  // [48, 64] @ [64, 32]; b starts row-major so that the column-major copy is exercised.
  const auto a = integer_operand({48, 64}, torch::kFloat8_e4m3fn, 1,
                                 rowwise ? std::optional<int64_t>(-1) : std::nullopt);
  auto b = integer_operand({32, 64}, torch::kFloat8_e5m2, 2,
                           rowwise ? std::optional<int64_t>(-1) : std::nullopt)
               .t();
  const auto gpu = amp::fp8::detail::scaled_mm(to_cuda(a), to_cuda(b), out_dtype, fast_accum);
  CHECK(gpu.scalar_type() == out_dtype);
  CHECK(gpu.sizes() == std::vector<int64_t>{48, 32});
  // The dequantised product, exact in float32 whatever the order; rowwise GEMMs produce bfloat16
  // first (torchao's rule for float32 and float16 outputs).
  auto exact = (a.data.to(torch::kFloat) / a.scale).matmul(b.data.to(torch::kFloat) / b.scale);
  if (rowwise) exact = exact.to(torch::kBFloat16);
  CHECK(same_bytes(gpu, exact.to(out_dtype)));
  // The CPU emulation agrees (LibTorch 2.11's CPU takes tensorwise scales only).
  if (!rowwise || amp_test::cpu_takes_rowwise_scales()) {
    CHECK(same_bytes(amp::fp8::detail::scaled_mm(a, b, out_dtype, fast_accum), gpu));
  }
}

TEST_CASE("A Float8Linear trains on CUDA as on the CPU, for every recipe", "[fp8][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const auto recipe = GENERATE(from_range(amp_test::kRecipeNames));
  const auto dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  CAPTURE(recipe, dtype);
  if (recipe.rfind("rowwise", 0) == 0 && !amp_test::cpu_takes_rowwise_scales()) {
    WARN("not run: the CPU reference needs rowwise scales, which this LibTorch's CPU lacks");
    return;
  }
  torch::manual_seed(21);
  Float8Linear cpu(Float8LinearOptions(64, 48).recipe(Recipe::from_name(recipe)));
  cpu->to(dtype);
  auto gpu = std::dynamic_pointer_cast<amp::fp8::Float8LinearImpl>(cpu->clone(kCuda));
  REQUIRE(gpu);
  torch::optim::SGD cpu_opt(cpu->parameters(), 0.1);
  torch::optim::SGD gpu_opt(gpu->parameters(), 0.1);
  Float8AutocastGuard float8;
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    torch::manual_seed(30 + step);
    const auto x = torch::randn({2, 16, 64}).to(dtype);
    auto x_cpu = x.clone().requires_grad_(true);
    auto x_gpu = x.to(kCuda).requires_grad_(true);
    auto out_cpu = cpu->forward(x_cpu);
    auto out_gpu = gpu->forward(x_gpu);
    if (step == 0 && recipe != "delayed") {
      // The casts are elementwise and the amaxes exact: the float8 inputs agree, and the first
      // output differs only by the GEMM's accumulation (fast accumulation on the GPU).
      CHECK(relative_error(out_gpu, out_cpu) < (dtype == torch::kFloat ? 1e-3 : 1e-2));
    }
    CHECK(out_gpu.scalar_type() == dtype);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    out_cpu.to(torch::kFloat).square().mean().backward();
    out_gpu.to(torch::kFloat).square().mean().backward();
    CHECK(relative_error(x_gpu.grad(), x_cpu.grad()) < 2e-2);
    CHECK(relative_error(gpu->weight.grad(), cpu->weight.grad()) < 2e-2);
    cpu_opt.step();
    gpu_opt.step();
  }
  CHECK(relative_error(gpu->weight, cpu->weight) < 1e-2);
  if (recipe == "delayed") {
    // The input histories depend only on the inputs: the same bits on both devices.
    CHECK(same_bytes(gpu->named_buffers()["amax_history_input"],
                     cpu->named_buffers()["amax_history_input"]));
    CHECK(gpu->named_buffers()["scale_input"].is_cuda());
  }
}

TEST_CASE("Transposed and offset inputs give the bits of their contiguous copies on CUDA",
          "[fp8][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const auto recipe = GENERATE(as<std::string>{}, "tensorwise", "rowwise");
  CAPTURE(recipe);
  torch::manual_seed(22);
  Float8Linear layer(Float8LinearOptions(32, 32).recipe(Recipe::from_name(recipe)));
  layer->to(kCuda);
  Float8AutocastGuard float8;
  const auto storage = torch::randn({32 * 16 + 1}, kCuda);
  const auto offset = storage.narrow(0, 1, 32 * 16).view({16, 32});  // storage offset 1
  const auto transposed = torch::randn({32, 16}, kCuda).t();         // column-major [16, 32]
  for (const auto& x : {offset, transposed}) {
    CHECK(same_bytes(layer(x), layer(x.contiguous())));
  }
}

TEST_CASE("Permuted inputs of three or more dims give the bits of their contiguous copies on CUDA",
          "[fp8][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const auto recipe = GENERATE(from_range(amp_test::kRecipeNames));
  CAPTURE(recipe);
  torch::manual_seed(23);
  for (const auto& x : {torch::randn({16, 2, 32}, kCuda).transpose(0, 1),
                        torch::randn({2, 32, 4, 4}, kCuda).permute({0, 2, 3, 1})}) {
    CAPTURE(x.sizes());
    // Two layers with the same state (the delayed recipe updates its history at every cast).
    torch::manual_seed(24);
    Float8Linear permuted(Float8LinearOptions(32, 16).recipe(Recipe::from_name(recipe)));
    torch::manual_seed(24);
    Float8Linear contiguous(Float8LinearOptions(32, 16).recipe(Recipe::from_name(recipe)));
    permuted->to(kCuda);
    contiguous->to(kCuda);
    Float8AutocastGuard float8;
    auto a_in = x.clone().requires_grad_(true);  // clone keeps the permuted strides
    auto b_in = x.contiguous().requires_grad_(true);
    REQUIRE_FALSE(a_in.is_contiguous());
    const auto a = permuted(a_in);
    const auto b = contiguous(b_in);
    CHECK(same_bytes(a, b));
    a.square().sum().backward();
    b.square().sum().backward();
    CHECK(same_bytes(a_in.grad().contiguous(), b_in.grad()));
    CHECK(same_bytes(permuted->weight.grad(), contiguous->weight.grad()));
  }
}

TEST_CASE("A frozen weight on CUDA takes any number of rows and still gives grad_input",
          "[fp8][cuda]") {
  // The rows are only the reduction dim of the grad_weight GEMM, which a frozen weight skips.
  if (!amp_test::float8_gemms_run_here()) return;
  const auto recipe = GENERATE(from_range(amp_test::kRecipeNames));
  CAPTURE(recipe);
  const auto make = [&](bool weight_trains) {
    torch::manual_seed(25);
    Float8Linear layer(Float8LinearOptions(32, 16).recipe(Recipe::from_name(recipe)));
    layer->weight.requires_grad_(weight_trains);
    layer->to(kCuda);
    return layer;
  };
  Float8AutocastGuard float8;
  auto frozen = make(false);
  auto x = torch::randn({8, 32}, kCuda).requires_grad_(true);
  frozen(x).square().sum().backward();
  CHECK_FALSE(frozen->weight.grad().defined());
  CHECK(frozen->bias.grad().defined());
  // The same grad_input as a layer whose weight trains, with 16 rows (which it needs); fresh
  // layers, so that delayed histories start equal.
  auto frozen16 = make(false);
  auto trained = make(true);
  const auto x16 = torch::cat({x.detach(), x.detach()});
  auto a = x16.clone().requires_grad_(true);
  auto b = x16.clone().requires_grad_(true);
  frozen16(a).square().sum().backward();
  trained(b).square().sum().backward();
  CHECK(same_bytes(a.grad(), b.grad()));
  // A weight that trains still needs the rows divisible by 16, with the layer's sentence.
  CHECK_THROWS_WITH(trained(torch::randn({8, 32}, kCuda)),
                    Contains("the number of input rows (the product of all dims but the last) "
                             "is 8"));
}

TEST_CASE("On CUDA a dimension not divisible by 16 is refused with the layer's name",
          "[fp8][cuda]") {
  auto root = std::make_shared<torch::nn::Module>();
  root->register_module("proj", torch::nn::Linear(30, 32));
  root->register_module("head", torch::nn::Linear(32, 16));
  amp::fp8::convert_to_float8_training(*root);
  root->to(kCuda);
  auto proj = root->named_modules()["proj"]->as<amp::fp8::Float8LinearImpl>();
  auto head = root->named_modules()["head"]->as<amp::fp8::Float8LinearImpl>();
  Float8AutocastGuard float8;
  CHECK_THROWS_WITH(proj->forward(torch::randn({16, 30}, kCuda)),
                    Contains("amp::fp8::Float8Linear 'proj' (in_features=30, out_features=32): on "
                             "CUDA the float8 GEMMs (at::_scaled_mm) need every dimension "
                             "divisible by 16, but in_features is 30"));
  CHECK_THROWS_WITH(head->forward(torch::randn({8, 32}, kCuda)),
                    Contains("but the number of input rows (the product of all dims but the "
                             "last) is 8"));
  // Without gradients the rows are free (no grad_weight GEMM).
  torch::NoGradGuard no_grad;
  if (amp_test::sm89_or_newer()) CHECK(head->forward(torch::randn({8, 32}, kCuda)).sizes()[0] == 8);
}

TEST_CASE("A float8 training step captured in a CUDA graph replays as eager steps do",
          "[fp8][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const auto recipe = GENERATE(as<std::string>{}, "tensorwise", "delayed");
  CAPTURE(recipe);
  auto make = [&] {
    torch::manual_seed(23);
    Float8Linear layer(Float8LinearOptions(64, 32).recipe(Recipe::from_name(recipe)));
    layer->to(kCuda);
    return layer;
  };
  auto graphed = make();
  auto eager = make();
  torch::optim::SGD graph_opt(graphed->parameters(), 0.05);
  torch::optim::SGD eager_opt(eager->parameters(), 0.05);
  auto static_x = torch::zeros({32, 64}, kCuda);
  const auto step = [](Float8Linear& layer, torch::optim::SGD& opt, const torch::Tensor& x) {
    Float8AutocastGuard float8;
    layer(x).square().mean().backward();
    opt.step();
  };
  auto batch = [](int k) {
    torch::manual_seed(40 + k);
    return torch::randn({32, 64}, kCuda) * (1 + k);
  };
  const auto side = c10::cuda::getStreamFromPool();
  for (int k = 0; k < 2; ++k) {  // warm-up on the capture stream, mirrored eagerly
    static_x.copy_(batch(k));
    torch::cuda::synchronize();
    {
      const c10::cuda::CUDAStreamGuard guard(side);
      graph_opt.zero_grad(false);
      step(graphed, graph_opt, static_x);
    }
    torch::cuda::synchronize();
    eager_opt.zero_grad(false);
    step(eager, eager_opt, batch(k));
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    graph_opt.zero_grad(false);
    graph.capture_begin();
    step(graphed, graph_opt, static_x);
    graph.capture_end();
  }
  torch::cuda::synchronize();
  for (int replay = 0; replay < 4; ++replay) {
    INFO("replay " << replay);
    const auto x = batch(10 + replay);
    static_x.copy_(x);
    for (auto& p : graphed->parameters()) p.mutable_grad().zero_();
    const auto before = graphed->weight.detach().clone();
    graph.replay();
    eager_opt.zero_grad(false);
    step(eager, eager_opt, x);
    torch::cuda::synchronize();
    // The replay moved the weights as the eager step did (cuBLAS may pick another algorithm for
    // the capture stream's workspace, so the comparison allows for summation order).
    CHECK_FALSE(same_bytes(graphed->weight, before));
    CHECK(relative_error(graphed->weight, eager->weight) < 1e-5);
    CHECK(relative_error(graphed->bias, eager->bias) < 1e-5);
    for (const auto& buffer : eager->named_buffers()) {
      INFO(buffer.key());
      CHECK(relative_error(graphed->named_buffers()[buffer.key()], buffer.value()) < 1e-5);
    }
  }
}

TEST_CASE("Weight casts kept and reused on CUDA give the bits of fresh casts", "[fp8][cuda]") {
  if (!amp_test::float8_gemms_run_here()) return;
  const auto name = GENERATE(as<std::string>{}, "tensorwise", "rowwise", "delayed");
  const bool fused = GENERATE(false, true);
  CAPTURE(name, fused);
  auto recipe = Recipe::from_name(name);
  recipe.fused_casts = fused;
  // Two steps of three micro-batches of a bf16 layer: casting each time, or keeping the weight's
  // casts on the first micro-batch and reusing them on the others.
  const auto train = [&](bool keep_and_reuse) {
    torch::manual_seed(23);
    Float8Linear layer(Float8LinearOptions(64, 48).recipe(recipe));
    layer->to(kCuda, torch::kBFloat16);
    torch::optim::SGD opt(layer->parameters(), 0.1);
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      for (int micro = 0; micro < 3; ++micro) {
        const auto casts = !keep_and_reuse ? amp::fp8::WeightCasts::fresh
                           : micro == 0    ? amp::fp8::WeightCasts::keep
                                           : amp::fp8::WeightCasts::reuse;
        torch::manual_seed(40 + 10 * step + micro);
        const auto x = torch::randn({32, 64}).to(kCuda, torch::kBFloat16).requires_grad_(true);
        torch::Tensor loss;
        {
          Float8AutocastGuard float8(true, casts);
          loss = layer(x).to(torch::kFloat).square().mean();
        }
        loss.backward();
      }
      opt.step();
    }
    return layer;
  };
  auto fresh = train(false);
  auto kept = train(true);
  if (name != "delayed") {
    CHECK(same_bytes(kept->weight, fresh->weight));
    CHECK(same_bytes(kept->bias, fresh->bias));
  } else {
    // The weight's scale follows its history, which moves once per step with kept casts (two
    // entries) and once per micro-batch without (six); the input's moves with every forward.
    const auto recorded = [](Float8Linear& layer, const char* key) {
      return layer->named_buffers()[key].ne(0).sum().item<int64_t>();
    };
    CHECK(recorded(kept, "amax_history_weight") == 2);
    CHECK(recorded(fresh, "amax_history_weight") == 6);
    CHECK(recorded(kept, "amax_history_input") == 6);
    CHECK(same_bytes(kept->named_buffers()["amax_history_input"].slice(0, 0, 1),
                     torch::zeros({1}, torch::kFloat)));
  }
}
