// Benchmark of amp::GradScaler's overhead per CPU training step: the same fp16 autocast step with
// and without the scaler (bf16 without it for context), interleaved round by round on two models.
//
// Usage: amp_scaler_overhead_bench [--threads N] [--warmup N] [--rounds-small N] [--rounds-mlp N]
//
// Each round runs one training step of every variant, in an order rotated from round to round,
// so machine noise and drift hit all variants alike. Every variant trains its own copy of the same
// initial model with its own SGD on the same batches. The headline numbers are medians of the
// per-step time and the median of the per-round ratio (scaler step / plain step).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <amp/autocast.h>

#include <amp/grad_scaler.h>
#include <amp/info.h>
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

/// The parts of one training step, timed separately so a slow step can be attributed.
enum Phase : int { kForward, kScale, kBackward, kUnscale, kStep, kUpdate, kNumPhases };
constexpr std::array<const char*, kNumPhases> kPhaseNames = {
    "zero_grad+forward", "scale(loss)", "backward", "unscale_", "step", "update"};

/// The training-step variants compared in one run.
enum class Variant { kFp16, kFp16Scaler, kFp16ScalerSplit, kBf16 };

const char* describe(Variant v) {
  switch (v) {
    case Variant::kFp16:
      return "fp16 autocast, no scaler";
    case Variant::kFp16Scaler:
      return "fp16 autocast + GradScaler";
    case Variant::kFp16ScalerSplit:
      return "fp16 + GradScaler, explicit unscale_";
    case Variant::kBf16:
      return "bf16 autocast, no scaler";
  }
  return "?";
}

/// One variant's model, optimizer, optional scaler and recorded samples.
struct Runner {
  Variant variant;
  torch::nn::Sequential model;
  torch::optim::SGD optimizer;
  std::optional<amp::GradScaler> scaler;
  std::vector<double> totals;                          // seconds per step
  std::array<std::vector<double>, kNumPhases> phases;  // seconds per phase per step
  int64_t skipped = 0;                                 // steps the scaler skipped (timed only)

  Runner(Variant v, const torch::nn::Sequential& initial, double lr)
      : variant(v),
        model(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(initial->clone())),
        optimizer(model->parameters(), torch::optim::SGDOptions(lr)) {
    if (v == Variant::kFp16Scaler || v == Variant::kFp16ScalerSplit) scaler.emplace(torch::kCPU);
  }

  /// Runs one training step on (x, y); records its timings when `record`.
  void step(const torch::Tensor& x, const torch::Tensor& y, bool record) {
    std::array<double, kNumPhases> t{};
    auto mark = Clock::now();
    // Adds the time since the last mark to phase p and moves the mark.
    auto lap = [&](Phase p) {
      const auto now = Clock::now();
      t[p] += std::chrono::duration<double>(now - mark).count();
      mark = now;
    };
    const auto start = mark;

    optimizer.zero_grad();
    torch::Tensor loss;
    {
      amp::AutocastGuard autocast(torch::kCPU,
                                  variant == Variant::kBf16 ? torch::kBFloat16 : torch::kHalf);
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    lap(kForward);

    bool taken = true;
    if (!scaler) {
      loss.backward();
      lap(kBackward);
      optimizer.step();
      lap(kStep);
    } else {
      torch::Tensor scaled = scaler->scale(loss);
      lap(kScale);
      scaled.backward();
      lap(kBackward);
      if (variant == Variant::kFp16ScalerSplit) {
        scaler->unscale_(optimizer);
        lap(kUnscale);
      }
      taken = scaler->step(optimizer).read_taken();
      lap(kStep);
      scaler->update();
      lap(kUpdate);
    }

    if (!record) return;
    totals.push_back(std::chrono::duration<double>(mark - start).count());
    for (int p = 0; p < kNumPhases; ++p) phases[p].push_back(t[p]);
    if (!taken) ++skipped;
  }
};

/// Median seconds of `fn` over `reps` calls (after one warm-up call).
template <class Fn>
double time_median(int reps, Fn&& fn) {
  fn();
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    fn();
    s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(s);
}

/// Times the ATen calls GradScaler::unscale_ and step() make, one by one, on `model`'s
/// gradients (inv_scale 1, so the gradients keep their values): attributes the unscale_ phase.
void print_unscale_components(const torch::nn::Sequential& model, const at::Tensor& scale,
                              int reps) {
  std::vector<at::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad());
  const at::Tensor one = at::ones({}, scale.options());
  at::Tensor found = at::zeros({}, scale.options());
  const double inv = time_median(
      reps, [&] { const at::Tensor r = scale.to(at::kDouble).reciprocal().to(at::kFloat); });
  const double full =
      time_median(reps, [&] { const at::Tensor f = at::full({}, 0.0, scale.options()); });
  const double check =
      time_median(reps, [&] { at::_amp_foreach_non_finite_check_and_unscale_(grads, found, one); });
  const double item = time_median(reps, [&] { (void)found.item<float>(); });
  std::printf(
      "unscale_ components (ATen calls alone, median of %d): inv_scale (to double, "
      "reciprocal, to float) %.4f ms; found_inf = full() %.4f ms; "
      "_amp_foreach_non_finite_check_and_unscale_ over %zu grads %.4f ms; found_inf.item() "
      "(step's read) %.4f ms\n",
      reps, 1e3 * inv, 1e3 * full, grads.size(), 1e3 * check, 1e3 * item);
}

struct ModelCase {
  std::string name;
  std::vector<int64_t> widths;
  int64_t batch;
  int rounds;
};

/// Times every variant on one model and prints the tables; returns the median paired overhead.
double run_case(const ModelCase& mc, int warmup) {
  torch::manual_seed(0);
  const torch::nn::Sequential initial = make_mlp(mc.widths);
  // A few fixed batches shaped like MNIST images in [0, 1); every variant sees the same batch in
  // the same round.
  constexpr int kBatches = 4;
  std::vector<torch::Tensor> xs, ys;
  for (int b = 0; b < kBatches; ++b) {
    xs.push_back(torch::rand({mc.batch, mc.widths.front()}));
    ys.push_back(torch::randint(0, mc.widths.back(), {mc.batch}, torch::kLong));
  }

  std::vector<Runner> runners;
  for (Variant v :
       {Variant::kFp16, Variant::kFp16Scaler, Variant::kFp16ScalerSplit, Variant::kBf16}) {
    runners.emplace_back(v, initial, 0.01);
  }
  const size_t n = runners.size();

  const auto wall_start = Clock::now();
  for (int r = 0; r < warmup + mc.rounds; ++r) {
    for (size_t k = 0; k < n; ++k) {
      Runner& runner = runners[(k + static_cast<size_t>(r)) % n];  // rotated order
      runner.step(xs[r % kBatches], ys[r % kBatches], r >= warmup);
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - wall_start).count();

  int64_t params = 0;
  for (const auto& p : initial->parameters()) params += p.numel();
  std::string arch = std::to_string(mc.widths.front());
  for (size_t i = 1; i < mc.widths.size(); ++i) arch += "-" + std::to_string(mc.widths[i]);
  std::printf(
      "\n== %s: %s, %lld parameters, batch %lld, SGD lr 0.01, %d warm-up + %d timed "
      "rounds (%.1f s) ==\n",
      mc.name.c_str(), arch.c_str(), static_cast<long long>(params),
      static_cast<long long>(mc.batch), warmup, mc.rounds, wall);

  const Runner& base = runners[0];
  const double base_median = median(base.totals);
  std::printf("%-38s %11s %11s %11s %10s %12s\n", "variant", "median ms", "p10 ms", "p90 ms",
              "vs fp16", "paired med");
  for (const Runner& rn : runners) {
    const double m = median(rn.totals);
    std::printf("%-38s %11.4f %11.4f %11.4f %+9.2f%% %+11.2f%%\n", describe(rn.variant), 1e3 * m,
                1e3 * quantile(rn.totals, 0.1), 1e3 * quantile(rn.totals, 0.9),
                100.0 * (m / base_median - 1.0),
                100.0 * (median(ratios(rn.totals, base.totals)) - 1.0));
  }

  // Where the time goes: median of each phase (a phase a variant does not have shows "-").
  std::printf("\nmedian per phase, ms:\n%-38s", "variant");
  for (const char* p : kPhaseNames) std::printf(" %17s", p);
  std::printf("\n");
  for (const Runner& rn : runners) {
    std::printf("%-38s", describe(rn.variant));
    for (int p = 0; p < kNumPhases; ++p) {
      const bool present =
          !(p == kScale || p == kUpdate || p == kUnscale) ||
          (rn.scaler && (p != kUnscale || rn.variant == Variant::kFp16ScalerSplit));
      if (present) {
        std::printf(" %17.4f", 1e3 * median(rn.phases[p]));
      } else {
        std::printf(" %17s", "-");
      }
    }
    std::printf("\n");
  }

  const Runner& scaled = runners[1];
  const Runner& split = runners[2];
  std::printf(
      "\nscaler state after the run: scale %g (%lld skipped of %d timed steps); explicit-"
      "unscale_ variant: scale %g (%lld skipped)\n",
      scaled.scaler->get_scale(), static_cast<long long>(scaled.skipped), mc.rounds,
      split.scaler->get_scale(), static_cast<long long>(split.skipped));

  // The scaler's own calls in the split variant, and the step time they are a share of.
  const double scaler_calls =
      median(split.phases[kScale]) + median(split.phases[kUnscale]) + median(split.phases[kUpdate]);
  std::printf(
      "scaler calls (scale + unscale_ + update, medians, split variant): %.4f ms = %.2f%% "
      "of the plain fp16 step\n",
      1e3 * scaler_calls, 100.0 * scaler_calls / base_median);
  // step() beyond optimizer.step(): the found_inf read and the state machine.
  std::printf("step() minus plain optimizer.step() (split variant vs fp16, medians): %+.4f ms\n",
              1e3 * (median(split.phases[kStep]) - median(base.phases[kStep])));
  std::printf("backward with the scaled loss minus plain backward (medians): %+.4f ms\n",
              1e3 * (median(scaled.phases[kBackward]) - median(base.phases[kBackward])));

  print_unscale_components(split.model, split.scaler->scale_tensor(), mc.rounds);

  const std::vector<double> paired = ratios(scaled.totals, base.totals);
  const double overhead = median(paired) - 1.0;
  const auto [ci_lo, ci_hi] = median_ci(paired);
  std::printf("95%% CI of the paired median overhead: [%+.2f%%, %+.2f%%]\n", 100.0 * (ci_lo - 1.0),
              100.0 * (ci_hi - 1.0));
  std::printf(
      "OVERHEAD %s: GradScaler step vs plain fp16 step: %+.2f%% (paired median), "
      "%+.2f%% (ratio of medians)\n",
      mc.name.c_str(), 100.0 * overhead, 100.0 * (median(scaled.totals) / base_median - 1.0));
  return overhead;
}

int parse_int(const char* flag, const char* value, int minimum) {
  TORCH_CHECK(value != nullptr, "amp_scaler_overhead_bench: ", flag, " needs a value; pass e.g. ",
              flag, " 4.");
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  TORCH_CHECK(end != value && *end == '\0' && v >= minimum && v <= 1000000,
              "amp_scaler_overhead_bench: ", flag, " must be an integer >= ", minimum, "; got '",
              value, "'.");
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  int warmup = 10;
  ModelCase small{"example", {784, 10}, 64, 5000};
  ModelCase mlp{"mlp", {784, 4096, 4096, 10}, 256, 120};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
      if (arg == "--threads") {
        threads = parse_int("--threads", value, 1);
      } else if (arg == "--warmup") {
        warmup = parse_int("--warmup", value, 0);
      } else if (arg == "--rounds-small") {
        small.rounds = parse_int("--rounds-small", value, 1);
      } else if (arg == "--rounds-mlp") {
        mlp.rounds = parse_int("--rounds-mlp", value, 1);
      } else {
        TORCH_CHECK(false, "amp_scaler_overhead_bench: unknown argument '", arg,
                    "'; use --threads N, --warmup N, --rounds-small N or --rounds-mlp N.");
      }
      ++i;
    }

    // Pinned so both variants run the same kernels with the same parallelism on a shared host.
    at::set_num_threads(threads);
    at::set_num_interop_threads(1);
    std::printf("amp_scaler_overhead_bench: CPU, GradScaler overhead per training step\n");
    std::printf("cpu: %s, %u logical CPUs online, load average at start %s\n", cpu_model().c_str(),
                std::thread::hardware_concurrency(), load_average().c_str());
    std::printf("torch %s, amp %s, at::get_num_threads() = %d\n", TORCH_VERSION,
                amp::version().c_str(), at::get_num_threads());

    const double small_overhead = run_case(small, warmup);
    const double mlp_overhead = run_case(mlp, warmup);

    std::printf("\nload average at end %s\n", load_average().c_str());
    std::printf(
        "SUMMARY example model overhead %+.2f%%; MLP overhead %+.2f%% (target <= 5%%: %s)\n",
        100.0 * small_overhead, 100.0 * mlp_overhead, mlp_overhead <= 0.05 ? "met" : "MISSED");
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s\n", e.what_without_backtrace());
    return 2;
  }
  return 0;
}
