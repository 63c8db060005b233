// Low-precision weights: bytes per parameter (from the tensors, and on the CPU from peak RSS in a
// process of its own) and optimizer step time of FusedAdamW on a 25M-parameter MLP, fp32 against
// bf16 with master weights, Kahan summation, stochastic rounding (each with float32 moments, the
// default, and Kahan and SR also with the compact bfloat16 moments) and plain bf16.
//
// Usage: amp_low_precision_bench time [rounds] [cpu|cuda]   all modes side by side, one process
//        amp_low_precision_bench rss MODE                     one mode; peak RSS growth per param
// MODE: fp32, master, kahan, kahan-bf16, sr, sr-bf16, plain.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <amp/low_precision.h>
#include <amp/optim.h>

#include "bench_stats.h"

namespace {

using amp::optim::FusedAdamW;
using amp::optim::FusedAdamWOptions;

// kahan and sr keep float32 moments (the default); kahan-bf16 and sr-bf16 the compact bfloat16
// ones (state_dtype(kBFloat16)), which lose Adam's small second-moment updates.
const std::vector<std::string> kModes = {"fp32", "master",  "kahan", "kahan-bf16",
                                         "sr",   "sr-bf16", "plain"};

// Bytes each step reads and writes per parameter (params, grads, state; the step counts aside).
double bytes_moved(const std::string& mode) {
  if (mode == "fp32") return 28;        // read p g m v (16), write p m v (12)
  if (mode == "master") return 28;      // read master g m v (14), write master p m v (14)
  if (mode == "kahan") return 26;       // read p g m v c (14), write p m v c (12)
  if (mode == "kahan-bf16") return 18;  // read p g m v c (10), write p m v c (8)
  if (mode == "sr") return 22;          // read p g m v (12), write p m v (10)
  return 14;                            // sr-bf16, plain: read p g m v (8), write p m v (6)
}

// kB of the named line ("VmRSS:", "VmHWM:") of /proc/self/status.
double status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size()));
  }
  return 0;
}

struct Setup {
  std::string mode;
  torch::nn::Sequential model{nullptr};
  std::unique_ptr<FusedAdamW> optimizer;
  int64_t params = 0;

  torch::Device device;

  Setup(std::string m, torch::Device d) : mode(std::move(m)), device(d) {
    torch::manual_seed(0);
    model = amp_bench::make_mlp({2048, 4096, 4096});
    model->to(device);
    if (mode != "fp32") amp::to_low_precision(*model, torch::kBFloat16);
    const bool compact = mode.size() > 5 && mode.substr(mode.size() - 5) == "-bf16";
    const std::string kind = compact ? mode.substr(0, mode.size() - 5) : mode;
    auto options = FusedAdamWOptions(1e-4)
                       .master_weights(kind == "master")
                       .kahan_summation(kind == "kahan")
                       .stochastic_rounding(kind == "sr");
    if (compact) options.state_dtype(torch::kBFloat16);
    optimizer = std::make_unique<FusedAdamW>(model->parameters(), options);
    for (auto& p : model->parameters()) {
      params += p.numel();
      // normal_ in the parameter's dtype: no float32 temporary in the peak.
      p.mutable_grad() = torch::empty_like(p).normal_(0.0, 1e-3);
    }
  }

  // Params + grads + optimizer state, from the tensors.
  double tensor_bytes() const {
    double bytes = 0;
    for (const auto& p : model->parameters()) {
      bytes += p.nbytes() + p.grad().nbytes();
      const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(
          *optimizer->state().at(p.unsafeGetTensorImpl()));
      for (const auto& t : {s.exp_avg(), s.exp_avg_sq(), s.master_weight(), s.kahan_comp()}) {
        if (t.defined()) bytes += t.nbytes();
      }
    }
    return bytes;
  }

  double step_seconds() {
    if (device.is_cuda()) torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    optimizer->step();
    if (device.is_cuda()) torch::cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// Copy bandwidth (read + write bytes per second) over 256 MiB, the ceiling a step can reach.
double copy_bandwidth(torch::Device device) {
  auto src = torch::ones({64 << 20}, device);
  auto dst = torch::empty_like(src);
  std::vector<double> t;
  for (int i = 0; i < 9; ++i) {
    if (device.is_cuda()) torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    dst.copy_(src);
    if (device.is_cuda()) torch::cuda::synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * src.nbytes() / amp_bench::median(t);
}

int time_modes(int rounds, torch::Device device) {
  std::vector<std::unique_ptr<Setup>> setups;
  for (const auto& m : kModes) setups.push_back(std::make_unique<Setup>(m, device));
  for (auto& s : setups) s->step_seconds();  // creates the state
  std::vector<std::vector<double>> times(setups.size());
  for (int r = 0; r < rounds; ++r) {  // interleaved, so noise hits every mode alike
    for (size_t i = 0; i < setups.size(); ++i) times[i].push_back(setups[i]->step_seconds());
  }
  const double bandwidth = copy_bandwidth(device);
  std::printf("FusedAdamW step on %s, %lld parameters, %d threads, %d rounds; CPU: %s\n",
              device.str().c_str(), static_cast<long long>(setups[0]->params),
              torch::get_num_threads(), rounds, amp_bench::cpu_model().c_str());
  std::printf("copy bandwidth (read+write): %.2f GB/s\n", bandwidth / 1e9);
  std::printf("%-10s %10s %26s %10s %12s %14s\n", "mode", "B/param", "median ms [95% CI]",
              "fp32/mode", "moved B/p", "of bandwidth");
  for (size_t i = 0; i < setups.size(); ++i) {
    const auto ci = amp_bench::median_ci(times[i]);
    const auto ratio = amp_bench::median(amp_bench::ratios(times[0], times[i]));
    const double med = amp_bench::median(times[i]);
    const double moved = bytes_moved(setups[i]->mode) * setups[i]->params;
    std::printf("%-10s %10.2f %8.3f [%7.3f,%7.3f] %9.2fx %12.0f %13.0f%%\n",
                setups[i]->mode.c_str(), setups[i]->tensor_bytes() / setups[i]->params, med * 1e3,
                ci.first * 1e3, ci.second * 1e3, ratio, bytes_moved(setups[i]->mode),
                100.0 * moved / med / bandwidth);
  }
  return 0;
}

int peak_rss(const std::string& mode) {
  const double before = status_kb("VmRSS:");
  Setup setup(mode, torch::kCPU);
  setup.step_seconds();
  setup.step_seconds();
  const double peak = status_kb("VmHWM:");
  std::printf("%-10s tensors %.2f B/param, peak RSS growth %.2f B/param (%lld parameters)\n",
              mode.c_str(), setup.tensor_bytes() / setup.params,
              (peak - before) * 1024.0 / setup.params, static_cast<long long>(setup.params));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "time";
  if (what == "rss" && argc > 2) return peak_rss(argv[2]);
  if (what == "time") {
    const bool cuda = argc > 3 && std::string(argv[3]) == "cuda";
    if (cuda && !torch::cuda::is_available()) {
      std::fprintf(stderr, "amp_low_precision_bench: no CUDA device\n");
      return 77;
    }
    return time_modes(argc > 2 ? std::stoi(argv[2]) : 15,
                      cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU));
  }
  std::fprintf(stderr, "usage: amp_low_precision_bench time [rounds] [cpu|cuda] | rss MODE\n");
  return 2;
}
