// Float8 training: time of one forward + backward of an MLP (Linear layers with GELU between
// them) in float32, under bf16 autocast, and with amp::fp8's recipes under bf16 autocast, side by
// side in one run; and the bytes the autograd graph holds after the forward (what is saved for
// the backward), counted by the allocator. On the CPU float8 is emulated (at::_scaled_mm converts
// to float32): a correctness feature, not a speed-up.
//
// Usage: amp_fp8_bench [rounds] [cpu|cuda]
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/CPUAllocator.h>
#ifdef AMP_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <amp/autocast.h>
#include <amp/fp8.h>

#include "bench_stats.h"

namespace {

const std::vector<std::string> kModes = {"fp32", "bf16", "fp8 tensorwise", "fp8 rowwise",
                                         "fp8 delayed"};

// The default CPU allocator with a count of the bytes it has handed out and not yet taken back.
// The context stays the data pointer (raw_allocate asserts it), so sizes live in a map.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) { instance_ = this; }
  c10::DataPtr allocate(size_t bytes) override {
    auto inner = base_->allocate(bytes);
    void* data = inner.get();
    const auto device = inner.device();
    TORCH_CHECK(inner.get_context() == data && base_->raw_deleter() != nullptr,
                "amp_fp8_bench: the default CPU allocator is not the plain one this counter wraps");
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = bytes;
    }
    live_ += static_cast<int64_t>(bytes);
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  int64_t live() const { return live_.load(); }

 private:
  static void release(void* data) {
    auto* self = instance_;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      const auto found = self->sizes_.find(data);
      if (found != self->sizes_.end()) {
        self->live_ -= static_cast<int64_t>(found->second);
        self->sizes_.erase(found);
      }
    }
    self->base_->raw_deleter()(data);
  }
  static inline CountingAllocator* instance_ = nullptr;
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0};
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
};

CountingAllocator* counting = nullptr;

int64_t live_bytes(const torch::Device& device) {
#ifdef AMP_BENCH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index())
        .allocated_bytes[0]
        .current;
  }
#endif
  return counting->live();
}

struct Model {
  std::string mode;
  torch::nn::Sequential net;
  torch::Device device;

  Model(std::string m, const std::vector<int64_t>& widths, torch::Device d)
      : mode(std::move(m)), device(d) {
    torch::manual_seed(0);
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      net->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
      if (i + 2 < widths.size()) net->push_back(torch::nn::GELU());
    }
    net->to(device);
    if (mode.rfind("fp8 ", 0) == 0) {
      amp::fp8::convert_to_float8_training(*net, amp::fp8::Recipe::from_name(mode.substr(4)));
    }
  }

  // The loss of one forward (under the mode's regions); the graph is kept for backward.
  torch::Tensor forward(const torch::Tensor& x) {
    const bool fp8 = mode.rfind("fp8 ", 0) == 0;
    amp::fp8::Float8AutocastGuard float8(fp8);
    amp::AutocastGuard autocast(
        amp::AutocastOptions(device.type()).dtype(torch::kBFloat16).enabled(mode != "fp32"));
    return net->forward(x).to(torch::kFloat).square().mean();
  }
};

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const bool cuda = argc > 2 && std::string(argv[2]) == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::fprintf(stderr, "amp_fp8_bench: no CUDA device\n");
    return 2;
  }
  static CountingAllocator allocator(c10::GetDefaultCPUAllocator());
  counting = &allocator;
  c10::SetCPUAllocator(&allocator, /*priority=*/100);

  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU);
  // CPU: the 256 x 1024 @ 1024 x 1024 GEMMs of the build notes; CUDA: sizes where float8 pays.
  const std::vector<int64_t> widths =
      cuda ? std::vector<int64_t>{4096, 8192, 8192, 4096} : std::vector<int64_t>{1024, 1024, 1024, 1024};
  const int64_t rows = cuda ? 8192 : 256;
  std::vector<Model> models;
  for (const auto& mode : kModes) models.emplace_back(mode, widths, device);
  torch::manual_seed(1);
  const auto x = torch::randn({rows, widths.front()}, device);

  std::vector<std::vector<double>> times(kModes.size());
  std::vector<int64_t> held(kModes.size());
  for (int round = -2; round < rounds; ++round) {  // two warm-up rounds
    for (size_t m = 0; m < models.size(); ++m) {
      models[m].net->zero_grad(/*set_to_none=*/true);
      sync(device);
      const int64_t before = live_bytes(device);
      const auto start = std::chrono::steady_clock::now();
      auto loss = models[m].forward(x);
      sync(device);
      if (round == 0) held[m] = live_bytes(device) - before;
      loss.backward();
      sync(device);
      const auto stop = std::chrono::steady_clock::now();
      if (round >= 0) times[m].push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    }
  }

  std::printf("forward + backward of an MLP %s (GELU between), %lld rows, on %s, %d threads, "
              "%d rounds; %s\n",
              [&] {
                std::string s;
                for (size_t i = 0; i < widths.size(); ++i) s += (i ? "-" : "") + std::to_string(widths[i]);
                return s;
              }().c_str(),
              static_cast<long long>(rows), cuda ? "CUDA" : "the CPU", torch::get_num_threads(), rounds,
              cuda ? "" : ("CPU: " + amp_bench::cpu_model() + ", load " + amp_bench::load_average()).c_str());
  std::printf("%-15s %26s %10s %18s\n", "mode", "median ms [95% CI]", "bf16/mode",
              "graph MiB after fwd");
  for (size_t m = 0; m < models.size(); ++m) {
    const auto ci = amp_bench::median_ci(times[m]);
    const auto ratio = amp_bench::median(amp_bench::ratios(times[1], times[m]));
    std::printf("%-15s %8.2f [%7.2f,%7.2f] %9.2fx %18.2f\n", kModes[m].c_str(),
                amp_bench::median(times[m]), ci.first, ci.second, ratio,
                static_cast<double>(held[m]) / (1 << 20));
  }
  return 0;
}
