// Benchmark of amp's fused unscale ops against ATen's path and the memory-bandwidth ceiling
// (an in-place read-modify-write of one flat buffer of the same bytes), timed side by side.
// Usage: amp_unscale_bench [cpu|cuda] [reps]   (prints one table row per case; on the CPU the
// last cases repeat (b), (c) and (c') while another thread keeps one core busy)
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <amp/ops.h>

namespace {

using Clock = std::chrono::steady_clock;

struct Runner {
  torch::Device device;
  int reps;

  void sync() const {
    if (device.is_cuda()) torch::cuda::synchronize();
  }

  /// Median seconds of each function, run interleaved rep by rep so noise hits all alike.
  std::vector<double> time(const std::vector<std::function<void()>>& fns) const {
    for (const auto& f : fns) f();  // warm-up
    sync();
    std::vector<std::vector<double>> samples(fns.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t i = 0; i < fns.size(); ++i) {
        const auto start = Clock::now();
        fns[i]();
        sync();
        samples[i].push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    std::vector<double> medians;
    for (auto& s : samples) {
      std::sort(s.begin(), s.end());
      medians.push_back(s[s.size() / 2]);
    }
    return medians;
  }
};

std::vector<int64_t> gpt2_small_sizes() {
  std::vector<int64_t> sizes = {50257 * 768, 1024 * 768};
  for (int layer = 0; layer < 12; ++layer) {
    for (int64_t s : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072,
                      3072 * 768, 768}) {
      sizes.push_back(s);
    }
  }
  sizes.push_back(768);
  sizes.push_back(768);
  return sizes;
}

std::vector<torch::Tensor> make_list(const std::vector<int64_t>& sizes,
                                     const std::vector<torch::ScalarType>& dtypes,
                                     torch::Device device) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(torch::randn(
        {sizes[i]}, torch::TensorOptions().dtype(dtypes[i % dtypes.size()]).device(device)));
  }
  return out;
}

int64_t bytes_of(const std::vector<torch::Tensor>& list) {
  int64_t b = 0;
  for (const auto& t : list) b += t.numel() * t.element_size();
  return b;
}

/// ATen's path as GradScaler takes it: one fused call per dtype group.
void aten_unscale(const std::vector<std::vector<torch::Tensor>>& groups, torch::Tensor& found,
                  const torch::Tensor& inv) {
  for (const auto& g : groups) at::_amp_foreach_non_finite_check_and_unscale_(g, found, inv);
}

std::vector<std::vector<torch::Tensor>> group_by_dtype(const std::vector<torch::Tensor>& list) {
  std::map<int, std::vector<torch::Tensor>> groups;
  for (const auto& t : list) groups[static_cast<int>(t.scalar_type())].push_back(t);
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& [k, v] : groups) out.push_back(v);
  return out;
}

void report(const char* name, int64_t traffic_bytes, double ceiling_s, double amp_s,
            double aten_s) {
  std::printf("%-34s %10.3f ms %8.1f GB/s  ceiling %8.1f GB/s  frac %.2f | ", name, amp_s * 1e3,
              traffic_bytes / amp_s / 1e9, traffic_bytes / ceiling_s / 1e9, ceiling_s / amp_s);
  if (aten_s > 0) {
    std::printf("ATen %10.3f ms  ratio %.2fx\n", aten_s * 1e3, aten_s / amp_s);
  } else {
    std::printf("ATen cannot (its kernel lacks a dtype of the list on this device)\n");
  }
  std::fflush(stdout);
}

/// Whether ATen's op runs on every dtype group (torch 2.11's CUDA kernel has no bfloat16).
bool aten_supports(const std::vector<std::vector<torch::Tensor>>& groups,
                   const torch::TensorOptions& opts) {
  auto found = torch::zeros({1}, opts);
  const auto one = torch::ones({1}, opts);
  try {
    for (const auto& g : groups) {
      at::_amp_foreach_non_finite_check_and_unscale_({g.front().narrow(0, 0, 1).clone()}, found,
                                                     one);
    }
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

/// Cases (a)-(d): the op on `list` against ATen's grouped calls and the flat in-place ceiling.
void unscale_case(const Runner& run, const char* name, std::vector<torch::Tensor> list) {
  const auto opts = torch::TensorOptions().device(run.device);
  auto found = torch::zeros({1}, opts);
  // Alternate 0.5 and 2: exact in every dtype, so repeated runs keep the values bounded.
  const auto half = torch::full({1}, 0.5f, opts), two = torch::full({1}, 2.0f, opts);
  const int64_t bytes = bytes_of(list);
  auto flat = torch::randn({bytes / 4}, opts);
  const auto groups = group_by_dtype(list);
  const bool with_aten = aten_supports(groups, opts);
  bool flip = false;
  std::vector<std::function<void()>> fns = {
      [&] { flat.mul_(flip ? 2.0 : 0.5); },
      [&] {
        amp::non_finite_check_and_unscale_(list, found, flip ? two : half);
        flip = !flip;
      },
  };
  if (with_aten) fns.push_back([&] { aten_unscale(groups, found, flip ? two : half); });
  const auto times = run.time(fns);
  report(name, 2 * bytes, times[0], times[1], with_aten ? times[2] : 0.0);
}

/// Case (e): unscale + clip (2 reads, 1 write) against unscale_ + clip_grad_norm_.
void clip_case(const Runner& run, const char* name, const std::vector<int64_t>& sizes) {
  const auto opts = torch::TensorOptions().device(run.device);
  auto mine = make_list(sizes, {torch::kFloat}, run.device);
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> ref_grads;
  for (const auto& g : mine) {
    auto p = torch::zeros_like(g).requires_grad_(true);
    p.mutable_grad() = g.clone();
    params.push_back(p);
    ref_grads.push_back(p.grad());
  }
  auto found = torch::zeros({1}, opts);
  const auto inv = torch::full({1}, 1.0f / 1024.0f, opts);
  const int64_t bytes = bytes_of(mine);
  auto flat = torch::randn({bytes / 4}, opts);
  const auto times = run.time({
      [&] { flat.mul_(0.999); },
      [&] {
        const at::Tensor total = std::get<0>(amp::unscale_norm(mine, found, inv));
        amp::clip_unscaled_(mine, inv, total, 1.0);
      },
      [&] {
        at::_amp_foreach_non_finite_check_and_unscale_(ref_grads, found, inv);
        torch::nn::utils::clip_grad_norm_(params, 1.0);
      },
  });
  // Traffic of the fused path (2 reads + 1 write); the ceiling moves 2 per element.
  std::printf(
      "%-34s %10.3f ms %8.1f GB/s  (3 passes)                         | ATen %10.3f ms  "
      "ratio %.2fx  [ceiling rmw %.3f ms]\n",
      name, times[1] * 1e3, 3.0 * bytes / times[1] / 1e9, times[2] * 1e3, times[2] / times[1],
      times[0] * 1e3);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool cuda = argc > 1 && std::strcmp(argv[1], "cuda") == 0;
  const Runner run{cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU),
                   argc > 2 ? std::atoi(argv[2]) : 15};
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  std::printf("device %s, threads %d, reps %d (median)\n", cuda ? "cuda" : "cpu",
              at::get_num_threads(), run.reps);
  const auto gpt2 = gpt2_small_sizes();
  unscale_case(run, "(a) 1 x 256M fp32",
               make_list({int64_t{256} << 20}, {torch::kFloat}, run.device));
  unscale_case(run, "(b) GPT-2 small fp32 (148 tensors)",
               make_list(gpt2, {torch::kFloat}, run.device));
  std::vector<int64_t> small;
  for (int i = 0; i < 2000; ++i) small.push_back(512 + (i * 7919) % 3584);
  unscale_case(run, "(c) 2000 small fp32 (512-4095)",
               make_list(small, {torch::kFloat}, run.device));
  std::vector<int64_t> tiny;
  for (int i = 0; i < 2000; ++i) tiny.push_back(16 + (i * 7919) % 1009);
  unscale_case(run, "(c') 2000 small fp32 (16-1024)", make_list(tiny, {torch::kFloat}, run.device));
  unscale_case(run, "(d) GPT-2 small fp16/bf16/fp32",
               make_list(gpt2, {torch::kHalf, torch::kBFloat16, torch::kFloat}, run.device));
  clip_case(run, "(e) unscale+clip GPT-2 fp32", gpt2);
  if (!cuda) {
    // Training next to a data loader: one core kept busy by another thread, where a parallel
    // region waits for its second thread to be scheduled.
    std::atomic<bool> stop{false};
    std::thread busy([&] {
      volatile uint64_t spin = 0;
      while (!stop.load(std::memory_order_relaxed)) spin = spin + 1;
    });
    unscale_case(run, "(f) (c) with one core busy", make_list(small, {torch::kFloat}, run.device));
    unscale_case(run, "(f') (c') with one core busy", make_list(tiny, {torch::kFloat}, run.device));
    unscale_case(run, "(f'') (b) with one core busy", make_list(gpt2, {torch::kFloat}, run.device));
    stop = true;
    busy.join();
  }
  return 0;
}
