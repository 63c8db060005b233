// Activation checkpointing: the peak memory of one forward + backward of a deep MLP (Linear +
// GELU blocks) without checkpointing, with every block checkpointed (amp::CheckpointWrapper) and
// with checkpoint_sequential's segments, in float32, under bf16 autocast and with float8 layers
// (amp::fp8, tensorwise), side by side in one run; and the time the recomputation costs. Peak bytes
// are counted by the allocator (the counting CPU allocator, CUDA's caching-allocator statistics on
// a GPU), from the moment before the forward, so the parameters and the input are not in them and
// the gradients are.
//
// The benchmark checks what it exists to show: a checkpointed run whose peak is not below the
// plain run's of the same precision makes it exit with status 1.
//
// Usage: amp_checkpoint_bench [rounds] [cpu|cuda]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#ifdef AMP_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <amp/autocast.h>
#include <amp/checkpoint.h>
#include <amp/fp8.h>

#include "bench_stats.h"
#include "support/counting_allocator.h"

namespace {

enum class Strategy { kPlain, kPerBlock, kSegments };

enum class Precision { kFp32, kBf16, kFp8 };

struct Mode {
  std::string name;
  Strategy strategy;
  Precision precision;
};

// Each precision's plain mode comes first: the others are compared with it.
const std::vector<Mode> kModes = {
    {"fp32 plain", Strategy::kPlain, Precision::kFp32},
    {"fp32 per block", Strategy::kPerBlock, Precision::kFp32},
    {"fp32 4 segments", Strategy::kSegments, Precision::kFp32},
    {"bf16 plain", Strategy::kPlain, Precision::kBf16},
    {"bf16 per block", Strategy::kPerBlock, Precision::kBf16},
    {"bf16 4 segments", Strategy::kSegments, Precision::kBf16},
    {"fp8 plain", Strategy::kPlain, Precision::kFp8},
    {"fp8 per block", Strategy::kPerBlock, Precision::kFp8},
};

size_t plain_mode_of(size_t m) {
  size_t plain = m;
  while (plain > 0 && kModes[plain - 1].precision == kModes[m].precision) --plain;
  return plain;
}
constexpr int64_t kSegments = 4;

amp_test::CountingAllocator* counting = nullptr;

int64_t device_index(const torch::Device& device) {
  return device.index() < 0 ? 0 : device.index();
}

void reset_peak(const torch::Device& device) {
#ifdef AMP_BENCH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_index(device));
    return;
  }
#endif
  counting->reset_peak();
}

int64_t live_bytes(const torch::Device& device) {
#ifdef AMP_BENCH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_index(device))
        .allocated_bytes[0]
        .current;
  }
#endif
  return counting->live();
}

int64_t peak_bytes(const torch::Device& device) {
#ifdef AMP_BENCH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_index(device))
        .allocated_bytes[0]
        .peak;
  }
#endif
  return counting->peak();
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Linear (or Float8Linear) then GELU. A Sequential cannot be a Sequential's element (its forward
// is a template).
struct BlockImpl : torch::nn::Module {
  torch::nn::AnyModule linear;
  torch::nn::GELU gelu;
  explicit BlockImpl(torch::nn::AnyModule l)
      : linear(std::move(l)), gelu(register_module("gelu", torch::nn::GELU())) {
    register_module("linear", linear.ptr());
  }
  torch::Tensor forward(const torch::Tensor& x) { return gelu(linear.forward(x)); }
};
TORCH_MODULE(Block);

struct Model {
  Mode mode;
  torch::nn::Sequential net;  // the blocks (per block: each wrapped) or, for segments, flat
  torch::Device device;

  Model(Mode m, int64_t width, int64_t depth, torch::Device d) : mode(std::move(m)), device(d) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < depth; ++i) {
      // Float8Linear initialises its weight as Linear does: the same weights in every mode.
      auto linear = mode.precision == Precision::kFp8
                        ? torch::nn::AnyModule(amp::fp8::Float8Linear(width, width))
                        : torch::nn::AnyModule(torch::nn::Linear(width, width));
      if (mode.strategy == Strategy::kSegments) {
        net->push_back(linear);
        net->push_back(torch::nn::GELU());
        continue;
      }
      Block block(linear);
      if (mode.strategy == Strategy::kPerBlock) {
        net->push_back(amp::CheckpointWrapper(torch::nn::AnyModule(block)));
      } else {
        net->push_back(block);
      }
    }
    net->to(device);
  }

  torch::Tensor loss(const torch::Tensor& x) {
    amp::AutocastGuard autocast(amp::AutocastOptions(device.type())
                                    .dtype(torch::kBFloat16)
                                    .enabled(mode.precision == Precision::kBf16));
    amp::fp8::Float8AutocastGuard float8(mode.precision == Precision::kFp8);
    const auto y = mode.strategy == Strategy::kSegments
                       ? amp::checkpoint_sequential(net, kSegments, x)
                       : net->forward(x);
    return y.to(torch::kFloat).square().mean();
  }
};

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const bool cuda = argc > 2 && std::string(argv[2]) == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::fprintf(stderr, "amp_checkpoint_bench: no CUDA device\n");
    return 2;
  }
  counting = &amp_test::CountingAllocator::install();

  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU);
  // Rows well above the width, as in training with large batches: the activations, which
  // checkpointing drops, outweigh the weights' gradients, which it cannot.
  const int64_t width = cuda ? 2048 : 512;
  const int64_t rows = cuda ? 16384 : 2048;
  const int64_t depth = 16;
  std::vector<Model> models;
  for (const auto& mode : kModes) models.emplace_back(mode, width, depth, device);
  torch::manual_seed(1);
  const auto x = torch::randn({rows, width}, device);

  std::vector<std::vector<double>> times(kModes.size());
  std::vector<int64_t> held(kModes.size());
  std::vector<int64_t> peak(kModes.size());
  for (int round = -2; round < rounds; ++round) {  // two warm-up rounds
    for (size_t m = 0; m < models.size(); ++m) {
      models[m].net->zero_grad(/*set_to_none=*/true);
      sync(device);
      const int64_t before = live_bytes(device);
      reset_peak(device);
      const auto start = std::chrono::steady_clock::now();
      auto loss = models[m].loss(x);
      sync(device);
      if (round == 0) held[m] = live_bytes(device) - before;
      loss.backward();
      sync(device);
      const auto stop = std::chrono::steady_clock::now();
      if (round == 0) peak[m] = peak_bytes(device) - before;
      if (round >= 0) {
        times[m].push_back(std::chrono::duration<double, std::milli>(stop - start).count());
      }
    }
  }

  std::printf(
      "forward + backward of %lld blocks Linear(%lld, %lld) (fp8: Float8Linear) + GELU, %lld rows, "
      "on %s, "
      "%d threads, %d rounds%s\n",
      static_cast<long long>(depth), static_cast<long long>(width), static_cast<long long>(width),
      static_cast<long long>(rows), cuda ? "CUDA" : "the CPU", torch::get_num_threads(), rounds,
      cuda ? ""
           : ("; CPU: " + amp_bench::cpu_model() + ", load " + amp_bench::load_average()).c_str());
  std::printf("%-16s %26s %13s %14s %14s %11s\n", "mode", "median ms [95% CI]", "time/plain",
              "graph MiB", "peak MiB", "peak/plain");
  bool saved = true;
  for (size_t m = 0; m < models.size(); ++m) {
    const size_t plain = plain_mode_of(m);
    const auto ci = amp_bench::median_ci(times[m]);
    const auto ratio = amp_bench::median(amp_bench::ratios(times[m], times[plain]));
    const double peak_ratio = static_cast<double>(peak[m]) / static_cast<double>(peak[plain]);
    std::printf("%-16s %8.2f [%7.2f,%7.2f] %12.2fx %14s %14s %10.2fx\n", kModes[m].name.c_str(),
                amp_bench::median(times[m]), ci.first, ci.second, ratio, mib(held[m]).c_str(),
                mib(peak[m]).c_str(), peak_ratio);
    if (m != plain && peak[m] >= peak[plain]) {
      std::printf("FAILED: %s peaks at %s MiB, not below the plain run's %s MiB\n",
                  kModes[m].name.c_str(), mib(peak[m]).c_str(), mib(peak[plain]).c_str());
      saved = false;
    }
  }
  return saved ? 0 : 1;
}
