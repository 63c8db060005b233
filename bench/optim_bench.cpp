// Benchmark of amp's fused optimizers on the CPU: amp::optim::FusedAdamW against
// torch::optim::AdamW, for the optimizer step alone and for a whole fp16 AMP training step with
// and without GradScaler, interleaved round by round. bench/optim_bench.py measures Python's
// torch.optim.AdamW(fused=True) on the same shapes.
//
// Usage: amp_optim_bench [--threads 1,2] [--warmup N] [--reps-mlp N] [--reps-small N]
//                        [--rounds-mlp N] [--rounds-small N] [--batch-mlp N] [--only step|train]
//
// Part 1, the optimizer step alone, on (a) the parameters of the MLP 784-4096-4096-10 and (b) 240
// small tensors of 64..4096 floats, with fixed gradients: each rep runs one step of every
// variant in an order rotated from rep to rep, plus a memory-bandwidth ceiling (an in-place mul_
// of one flat float32 buffer that moves the same bytes as the fused step's minimum traffic).
// Part 2, a whole training step (zero_grad, fp16 autocast forward, cross-entropy, backward,
// step) on the MLP (batch 256) and on Linear(784, 10) (batch 64): amp's fused step with
// GradScaler, the same with LibTorch's AdamW, and both without a scaler (the scaler's overhead
// is the paired ratio to the unscaled step of the same optimizer). Every variant trains its own
// copy of the same initial model on the same batches. Headline numbers are medians and the
// median of the per-round ratio, with a distribution-free 95% interval.
//
// fp16 matrix products are fast on CPUs with AVX512-FP16 or AMX (about 0.2 s per MLP step on
// the Xeon of bench/results); elsewhere ATen falls back to a slow path (about 70 s per MLP step
// on an AVX2 EPYC), so lower --rounds-mlp or --batch-mlp there, or run --only step.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <amp/autocast.h>

#include <amp/grad_scaler.h>
#include <amp/info.h>
#include <amp/optim.h>
#include "bench_stats.h"

namespace {

using amp_bench::cpu_model;
using amp_bench::load_average;
using amp_bench::make_mlp;
using amp_bench::median;
using amp_bench::median_ci;
using amp_bench::quantile;
using amp_bench::ratios;
using Clock = std::chrono::steady_clock;

constexpr double kLr = 1e-3;
constexpr double kWeightDecay = 1e-2;
// Minimum traffic of one fused AdamW step per float32 element: reads param, grad, exp_avg and
// exp_avg_sq, writes param, exp_avg and exp_avg_sq (amsgrad off).
constexpr int64_t kAdamBytesPerElement = 7 * 4;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// "1.234x [1.200, 1.250]": the median of the paired ratios and its 95% interval.
std::string ratio_text(const std::vector<double>& paired) {
  const auto [lo, hi] = median_ci(paired);
  char text[64];
  std::snprintf(text, sizeof text, "%.3fx [%.3f, %.3f]", median(paired), lo, hi);
  return text;
}

/// Runs `variants` round by round, each round in an order rotated by one, `warmup` untimed
/// rounds first; calls variants[v](round) and returns the seconds of every timed call per
/// variant.
std::vector<std::vector<double>> interleave(
    const std::vector<std::function<void(int round)>>& variants, int warmup, int rounds) {
  const size_t n = variants.size();
  std::vector<std::vector<double>> seconds(n);
  for (int r = 0; r < warmup + rounds; ++r) {
    for (size_t k = 0; k < n; ++k) {
      const size_t v = (k + static_cast<size_t>(r)) % n;
      const auto start = Clock::now();
      variants[v](r);
      if (r >= warmup) seconds[v].push_back(seconds_since(start));
    }
  }
  return seconds;
}

std::string arch_name(const std::vector<int64_t>& widths) {
  std::string arch = std::to_string(widths.front());
  for (size_t i = 1; i < widths.size(); ++i) arch += "-" + std::to_string(widths[i]);
  return arch;
}

int64_t numel_of(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

// ---- part 1: the optimizer step alone ----

/// Parameters of the given shapes with fixed random gradients, as a leaf list an optimizer takes.
std::vector<at::Tensor> params_with_grads(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<at::Tensor> params;
  for (const auto& shape : shapes) {
    at::Tensor p = torch::randn(shape).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape) * 1e-2;
    params.push_back(p);
  }
  return params;
}

/// Copies of `params` (values and gradients) that a second optimizer can own.
std::vector<at::Tensor> copies_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    at::Tensor c = p.detach().clone().requires_grad_(true);
    c.mutable_grad() = p.grad().clone();
    out.push_back(c);
  }
  return out;
}

/// The 240 small tensors: 64..4096 floats each, spread by a fixed stride (the .py uses the same).
std::vector<std::vector<int64_t>> small_shapes() {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t i = 0; i < 240; ++i) shapes.push_back({64 + (i * 997) % 4033});
  return shapes;
}

std::vector<std::vector<int64_t>> mlp_shapes(const std::vector<int64_t>& widths) {
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    shapes.push_back({widths[i + 1], widths[i]});
    shapes.push_back({widths[i + 1]});
  }
  return shapes;
}

void step_case(const std::string& name, const std::vector<std::vector<int64_t>>& shapes, int warmup,
               int reps) {
  torch::manual_seed(0);
  const std::vector<at::Tensor> fused_params = params_with_grads(shapes);
  const std::vector<at::Tensor> torch_params = copies_of(fused_params);
  amp::optim::FusedAdamW fused(fused_params,
                               amp::optim::FusedAdamWOptions(kLr).weight_decay(kWeightDecay));
  torch::optim::AdamW reference(torch_params,
                                torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
  const int64_t elements = numel_of(fused_params);
  const int64_t bytes = kAdamBytesPerElement * elements;
  // An in-place mul_ reads and writes each element: half the bytes, in float32 elements.
  at::Tensor flat = torch::randn({bytes / 2 / 4});
  bool flip = false;
  const auto seconds =
      interleave({
                     [&](int) {
                       flat.mul_(flip ? 2.0 : 0.5);  // exact: the values stay bounded
                       flip = !flip;
                     },
                     [&](int) { fused.step(); },
                     [&](int) { reference.step(); },
                 },
                 warmup, reps);

  std::printf(
      "\n-- step alone: %s: %zu tensors, %lld elements; minimum traffic of a fused step %.2f MB "
      "(%lld B per element); %d warm-up + %d reps --\n",
      name.c_str(), shapes.size(), static_cast<long long>(elements),
      static_cast<double>(bytes) / 1e6, static_cast<long long>(kAdamBytesPerElement), warmup, reps);
  std::printf("%-40s %10s %10s %10s %9s %9s  %s\n", "variant", "median ms", "p10 ms", "p90 ms",
              "GB/s", "frac", "paired time / FusedAdamW [95% CI]");
  const char* names[] = {"ceiling: flat in-place mul_, same bytes", "amp::optim::FusedAdamW",
                         "torch::optim::AdamW"};
  const double ceiling = median(seconds[0]);
  for (size_t v = 0; v < seconds.size(); ++v) {
    const double m = median(seconds[v]);
    std::printf("%-40s %10.4f %10.4f %10.4f %9.2f %9.2f  %s\n", names[v], 1e3 * m,
                1e3 * quantile(seconds[v], 0.1), 1e3 * quantile(seconds[v], 0.9),
                static_cast<double>(bytes) / m / 1e9, ceiling / m,
                ratio_text(ratios(seconds[v], seconds[1])).c_str());
  }
  std::printf(
      "(GB/s: the fused step's minimum traffic over the median time, for every row; frac: "
      "ceiling time / row time)\n");
  std::fflush(stdout);
}

// ---- part 2: the whole training step ----

enum class Variant { kFusedScaler, kTorchScaler, kFused, kTorch };

const char* describe(Variant v) {
  switch (v) {
    case Variant::kFusedScaler:
      return "fp16 + GradScaler + FusedAdamW";
    case Variant::kTorchScaler:
      return "fp16 + GradScaler + torch AdamW";
    case Variant::kFused:
      return "fp16, no scaler, FusedAdamW";
    case Variant::kTorch:
      return "fp16, no scaler, torch AdamW";
  }
  return "?";
}

/// One variant's model, optimizer, optional scaler and timings.
struct Trainer {
  Variant variant;
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<amp::GradScaler> scaler;
  std::vector<double> steps;  // seconds of the optimizer part: (scaler.)step + update

  Trainer(Variant v, const torch::nn::Sequential& initial)
      : variant(v), model(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(initial->clone())) {
    const bool fused = v == Variant::kFusedScaler || v == Variant::kFused;
    if (fused) {
      optimizer = std::make_unique<amp::optim::FusedAdamW>(
          model->parameters(), amp::optim::FusedAdamWOptions(kLr).weight_decay(kWeightDecay));
    } else {
      optimizer = std::make_unique<torch::optim::AdamW>(
          model->parameters(), torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
    }
    if (v == Variant::kFusedScaler || v == Variant::kTorchScaler) scaler.emplace(torch::kCPU);
  }

  void step(const at::Tensor& x, const at::Tensor& y, bool record) {
    optimizer->zero_grad();
    at::Tensor loss;
    {
      amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    if (scaler) {
      scaler->scale(loss).backward();
    } else {
      loss.backward();
    }
    const auto step_start = Clock::now();
    if (scaler) {
      // No read of the result: with FusedAdamW the step is decided on the device.
      scaler->step(*optimizer);
      scaler->update();
    } else {
      optimizer->step();
    }
    if (record) steps.push_back(seconds_since(step_start));
  }
};

void train_case(const std::string& name, const std::vector<int64_t>& widths, int64_t batch,
                int warmup, int rounds) {
  torch::manual_seed(0);
  const torch::nn::Sequential initial = make_mlp(widths);
  constexpr int kBatches = 4;
  std::vector<at::Tensor> xs, ys;
  for (int b = 0; b < kBatches; ++b) {
    xs.push_back(torch::rand({batch, widths.front()}));
    ys.push_back(torch::randint(0, widths.back(), {batch}, torch::kLong));
  }
  std::vector<Trainer> trainers;
  for (Variant v :
       {Variant::kFusedScaler, Variant::kTorchScaler, Variant::kFused, Variant::kTorch}) {
    trainers.emplace_back(v, initial);
  }
  std::vector<std::function<void(int)>> variants;
  for (Trainer& t : trainers) {
    variants.push_back([&t, &xs, &ys, warmup](int round) {
      t.step(xs[round % kBatches], ys[round % kBatches], round >= warmup);
    });
  }
  const auto wall_start = Clock::now();
  const auto totals = interleave(variants, warmup, rounds);
  const double wall = seconds_since(wall_start);
  // Without a skipped step the scale doubled every growth interval (2000 clean steps); any skip
  // halves it and restarts the count, so the final scale would be lower.
  const double clean_scale = 65536.0 * std::pow(2.0, (warmup + rounds) / 2000);

  const int64_t params = numel_of(initial->parameters());
  std::printf(
      "\n-- training step: %s: %s, %lld parameters, batch %lld, AdamW lr %g weight decay %g, "
      "%d warm-up + %d rounds (%.1f s) --\n",
      name.c_str(), arch_name(widths).c_str(), static_cast<long long>(params),
      static_cast<long long>(batch), kLr, kWeightDecay, warmup, rounds, wall);
  std::printf("%-34s %10s %10s %10s %14s  %-30s %s\n", "variant", "median ms", "p10 ms", "p90 ms",
              "step+update ms", "paired time / fused+scaler", "skipped steps");
  for (size_t v = 0; v < trainers.size(); ++v) {
    const Trainer& t = trainers[v];
    std::string skipped = "-";
    if (t.scaler) {
      const double scale = t.scaler->get_scale();
      char text[96];
      std::snprintf(text, sizeof text, "%s (scale %g)", scale == clean_scale ? "none" : "SOME",
                    scale);
      skipped = text;
    }
    std::printf("%-34s %10.4f %10.4f %10.4f %14.4f  %-30s %s\n", describe(t.variant),
                1e3 * median(totals[v]), 1e3 * quantile(totals[v], 0.1),
                1e3 * quantile(totals[v], 0.9), 1e3 * median(t.steps),
                ratio_text(ratios(totals[v], totals[0])).c_str(), skipped.c_str());
  }
  const auto overhead = [&](size_t scaled, size_t plain) {
    const std::vector<double> paired = ratios(totals[scaled], totals[plain]);
    const auto [lo, hi] = median_ci(paired);
    std::printf("  %-30s vs %-30s: %+.2f%% [%+.2f%%, %+.2f%%]\n",
                describe(trainers[scaled].variant), describe(trainers[plain].variant),
                100.0 * (median(paired) - 1.0), 100.0 * (lo - 1.0), 100.0 * (hi - 1.0));
  };
  std::printf("GradScaler overhead (paired median [95%% CI]):\n");
  overhead(0, 2);
  overhead(1, 3);
  std::printf(
      "optimizer traffic per step (minimum, fp32 state): fused AdamW %.2f MB; under the scaler "
      "+%.2f MB for its inf check of the gradients (FusedAdamW unscales inside its own pass)\n",
      static_cast<double>(kAdamBytesPerElement * params) / 1e6,
      4.0 * static_cast<double>(params) / 1e6);
  std::printf(
      "(skipped steps: none when the scale ended at %g, its value without a skipped step; "
      "SOME: the timed steps include skipped ones)\n",
      clean_scale);
  std::fflush(stdout);
}

// ---- the program ----

int parse_int(const std::string& flag, const char* value, int minimum) {
  TORCH_CHECK(value != nullptr, "amp_optim_bench: ", flag, " needs a value; pass e.g. ", flag,
              " 4.");
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  TORCH_CHECK(end != value && *end == '\0' && v >= minimum && v <= 1000000,
              "amp_optim_bench: ", flag, " must be an integer from ", minimum, " to 1000000; got '",
              value, "'.");
  return static_cast<int>(v);
}

std::vector<int> parse_threads(const char* value) {
  TORCH_CHECK(value != nullptr,
              "amp_optim_bench: --threads needs a value; pass e.g. --threads 1,2.");
  std::vector<int> threads;
  std::stringstream list(value);
  std::string item;
  while (std::getline(list, item, ',')) threads.push_back(parse_int("--threads", item.c_str(), 1));
  TORCH_CHECK(!threads.empty(), "amp_optim_bench: --threads is empty; pass e.g. --threads 1,2.");
  return threads;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int warmup = 5;
  int reps_mlp = 40;
  int reps_small = 2000;
  int rounds_mlp = 40;
  int rounds_small = 2000;
  int batch_mlp = 256;
  std::string only;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
      if (arg == "--threads") {
        threads = parse_threads(value);
      } else if (arg == "--warmup") {
        warmup = parse_int(arg, value, 0);
      } else if (arg == "--reps-mlp") {
        reps_mlp = parse_int(arg, value, 1);
      } else if (arg == "--reps-small") {
        reps_small = parse_int(arg, value, 1);
      } else if (arg == "--rounds-mlp") {
        rounds_mlp = parse_int(arg, value, 1);
      } else if (arg == "--rounds-small") {
        rounds_small = parse_int(arg, value, 1);
      } else if (arg == "--batch-mlp") {
        batch_mlp = parse_int(arg, value, 1);
      } else if (arg == "--only") {
        TORCH_CHECK(
            value != nullptr && (std::string(value) == "step" || std::string(value) == "train"),
            "amp_optim_bench: --only takes step or train; got '", value ? value : "", "'.");
        only = value;
      } else {
        TORCH_CHECK(false, "amp_optim_bench: unknown argument '", arg,
                    "'; use --threads LIST, --warmup N, --reps-mlp N, --reps-small N, "
                    "--rounds-mlp N, --rounds-small N, --batch-mlp N or --only step|train.");
      }
      ++i;
    }

    const std::vector<int64_t> mlp = {784, 4096, 4096, 10};
    const std::vector<int64_t> linear = {784, 10};
    std::printf("amp_optim_bench: CPU, fused AdamW against LibTorch's AdamW\n");
    std::printf("cpu: %s, %u logical CPUs online, load average at start %s\n", cpu_model().c_str(),
                std::thread::hardware_concurrency(), load_average().c_str());
    std::printf("torch %s, amp %s, ATen CPU capability %s\n", TORCH_VERSION, amp::version().c_str(),
                at::get_cpu_capability().c_str());
    at::set_num_interop_threads(1);
    for (const int t : threads) {
      // Pinned so every variant runs with the same parallelism.
      at::set_num_threads(t);
      std::printf("\n==== threads %d (at::get_num_threads() = %d) ====\n", t,
                  at::get_num_threads());
      if (only != "train") {
        step_case("mlp " + arch_name(mlp), mlp_shapes(mlp), warmup, reps_mlp);
        step_case("240 small tensors (64..4096 floats)", small_shapes(), warmup, reps_small);
      }
      if (only != "step") {
        train_case("mlp", mlp, batch_mlp, warmup, rounds_mlp);
        train_case("example", linear, 64, warmup, rounds_small);
      }
    }
    std::printf("\nload average at end %s\n", load_average().c_str());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s\n", e.what_without_backtrace());
    return 2;
  }
  return 0;
}
