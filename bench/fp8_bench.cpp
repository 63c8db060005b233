// Float8 training, side by side in one run:
//  1. a GELU MLP and a Llama-like block (attention projections + SwiGLU MLP, bf16 weights), one
//     forward + backward each in float32 (MLP only), under bf16 autocast, and with amp::fp8's
//     recipes under bf16 autocast, eager and with fused casts (Recipe::fused_casts); per mode the
//     time, the speed against bf16, and the bytes the autograd graph holds after the forward;
//  2. the float8 GEMMs of the MLP alone (tensorwise operands already cast) and the bf16 GEMMs,
//     so that each mode's time splits into GEMMs and the rest;
//  3. the casts alone on a bf16 activation: eager (torchao's chain of ATen ops, plus the
//     transposed copy the backward's GEMM makes) against fused, with the bytes each moves per
//     element by construction and the bandwidth that implies;
//  4. gradient accumulation over 4 micro-batches with the weights cast every time or once per
//     step (WeightCasts::keep and reuse).
// On the CPU float8 is emulated (at::_scaled_mm converts to float32): a correctness feature, not
// a speed-up; the casts' section is meaningful there too.
//
// Usage: amp_fp8_bench [rounds] [cpu|cuda]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#ifdef AMP_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <amp/autocast.h>
#include <amp/fp8.h>

#include "bench_stats.h"
#include "fp8/fused_cast.h"
#include "fp8/scaling.h"
#include "support/counting_allocator.h"

namespace {

using Clock = std::chrono::steady_clock;

amp_test::CountingAllocator* counting = nullptr;

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

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// A mode: "fp32", "bf16", or "fp8 <recipe>" with an optional " fused".
struct Mode {
  std::string name;
  bool fp8() const { return name.rfind("fp8 ", 0) == 0; }
  bool fused() const { return name.size() > 6 && name.substr(name.size() - 6) == " fused"; }
  amp::fp8::Recipe recipe() const {
    const auto rest = name.substr(4, name.size() - 4 - (fused() ? 6 : 0));
    auto recipe = amp::fp8::Recipe::from_name(rest);
    recipe.fused_casts = fused();
    return recipe;
  }
};

const std::vector<std::string> kFp8Modes = {"fp8 tensorwise",    "fp8 rowwise",
                                            "fp8 delayed",       "fp8 tensorwise fused",
                                            "fp8 rowwise fused", "fp8 delayed fused"};

// Linear layers that are float8 inside a float8 region (Linear outside it, for bf16 and fp32).
amp::fp8::Float8Linear layer(int64_t in, int64_t out, const Mode& mode, bool bias) {
  auto recipe = mode.fp8() ? mode.recipe() : amp::fp8::Recipe::tensorwise();
  return amp::fp8::Float8Linear(amp::fp8::Float8LinearOptions(in, out).bias(bias).recipe(recipe));
}

struct MlpImpl : torch::nn::Module {
  MlpImpl(const std::vector<int64_t>& widths, const Mode& mode) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers->push_back(layer(widths[i], widths[i + 1], mode, /*bias=*/true));
      if (i + 2 < widths.size()) layers->push_back(torch::nn::GELU());
    }
    register_module("layers", layers);
  }
  torch::Tensor forward(const torch::Tensor& x) { return layers->forward(x); }
  torch::nn::Sequential layers;
};
TORCH_MODULE(Mlp);

// A Llama-like transformer block: RMSNorm, causal self-attention with q/k/v/o projections,
// RMSNorm, SwiGLU MLP (gate, up, down), residuals; no biases.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t hidden, int64_t heads, const Mode& mode)
      : heads(heads),
        q(register_module("q", layer(dim, dim, mode, false))),
        k(register_module("k", layer(dim, dim, mode, false))),
        v(register_module("v", layer(dim, dim, mode, false))),
        o(register_module("o", layer(dim, dim, mode, false))),
        gate(register_module("gate", layer(dim, hidden, mode, false))),
        up(register_module("up", layer(dim, hidden, mode, false))),
        down(register_module("down", layer(hidden, dim, mode, false))) {
    norm1 = register_parameter("norm1", torch::ones({dim}));
    norm2 = register_parameter("norm2", torch::ones({dim}));
  }
  static torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight) {
    const auto xf = x.to(torch::kFloat);
    return (xf * torch::rsqrt(xf.square().mean(-1, true) + 1e-5)).to(x.scalar_type()) * weight;
  }
  torch::Tensor forward(const torch::Tensor& x) {  // [batch, seq, dim]
    const int64_t b = x.size(0), s = x.size(1), d = x.size(2);
    const auto h = rms_norm(x, norm1);
    const auto split = [&](const torch::Tensor& t) {
      return t.view({b, s, heads, d / heads}).transpose(1, 2);
    };
    auto attn = torch::scaled_dot_product_attention(split(q(h)), split(k(h)), split(v(h)), {}, 0.0,
                                                    /*is_causal=*/true);
    const auto x1 = x + o(attn.transpose(1, 2).reshape({b, s, d}));
    const auto h2 = rms_norm(x1, norm2);
    return x1 + down(torch::silu(gate(h2)) * up(h2));
  }
  int64_t heads;
  amp::fp8::Float8Linear q, k, v, o, gate, up, down;
  torch::Tensor norm1, norm2;
};
TORCH_MODULE(Block);

// Times forward + backward of `models` (one per mode, run in turn each round) and prints the
// table; bf16 is the reference of the speed column.
void run_models(const std::string& title, const std::vector<Mode>& modes,
                const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                const std::vector<std::function<torch::Tensor()>>& forwards,
                const torch::Device& device, int rounds) {
  std::vector<std::vector<double>> times(modes.size());
  std::vector<int64_t> held(modes.size());
  for (int round = -2; round < rounds; ++round) {  // two warm-up rounds
    for (size_t m = 0; m < modes.size(); ++m) {
      modules[m]->zero_grad(/*set_to_none=*/true);
      sync(device);
      const int64_t before = live_bytes(device);
      const auto start = Clock::now();
      torch::Tensor loss;
      {
        amp::fp8::Float8AutocastGuard float8(modes[m].fp8());
        amp::AutocastGuard autocast(amp::AutocastOptions(device.type())
                                        .dtype(torch::kBFloat16)
                                        .enabled(modes[m].name != "fp32"));
        loss = forwards[m]().to(torch::kFloat).square().mean();
      }
      sync(device);
      if (round == 0) held[m] = live_bytes(device) - before;
      loss.backward();
      sync(device);
      const auto stop = Clock::now();
      if (round >= 0) {
        times[m].push_back(std::chrono::duration<double, std::milli>(stop - start).count());
      }
    }
  }
  size_t bf16 = 0;
  for (size_t m = 0; m < modes.size(); ++m) {
    if (modes[m].name == "bf16") bf16 = m;
  }
  std::printf("\n%s\n%-22s %26s %10s %18s\n", title.c_str(), "mode", "median ms [95% CI]",
              "bf16/mode", "graph MiB after fwd");
  for (size_t m = 0; m < modes.size(); ++m) {
    const auto ci = amp_bench::median_ci(times[m]);
    const auto ratio = amp_bench::median(amp_bench::ratios(times[bf16], times[m]));
    std::printf("%-22s %8.2f [%7.2f,%7.2f] %9.2fx %18.2f\n", modes[m].name.c_str(),
                amp_bench::median(times[m]), ci.first, ci.second, ratio,
                static_cast<double>(held[m]) / (1 << 20));
  }
}

// The median time of `fn` over `rounds` calls (after one warm-up).
double time_ms(const std::function<void()>& fn, const torch::Device& device, int rounds) {
  fn();
  sync(device);
  std::vector<double> t;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    fn();
    sync(device);
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return amp_bench::median(t);
}

std::string shape_text(const std::vector<int64_t>& widths) {
  std::string s;
  for (size_t i = 0; i < widths.size(); ++i) s += (i ? "-" : "") + std::to_string(widths[i]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const bool cuda = argc > 2 && std::string(argv[2]) == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::fprintf(stderr, "amp_fp8_bench: no CUDA device\n");
    return 2;
  }
  counting = &amp_test::CountingAllocator::install();
  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU);
  std::printf(
      "amp_fp8_bench on %s, %d threads, %d rounds%s\n", cuda ? "CUDA" : "the CPU",
      torch::get_num_threads(), rounds,
      cuda ? ""
           : ("; CPU: " + amp_bench::cpu_model() + ", load " + amp_bench::load_average()).c_str());

  // ---- 1a. the MLP ----
  // CPU: the 256 x 1024 @ 1024 x 1024 GEMMs of the build notes; CUDA: sizes where float8 pays.
  const std::vector<int64_t> widths = cuda ? std::vector<int64_t>{4096, 8192, 8192, 4096}
                                           : std::vector<int64_t>{1024, 1024, 1024, 1024};
  const int64_t rows = cuda ? 8192 : 256;
  std::vector<Mode> modes = {{"fp32"}, {"bf16"}};
  for (const auto& name : kFp8Modes) modes.push_back({name});
  {
    std::vector<std::shared_ptr<torch::nn::Module>> modules;
    std::vector<std::function<torch::Tensor()>> forwards;
    torch::manual_seed(1);
    const auto x = torch::randn({rows, widths.front()}, device);
    for (const auto& mode : modes) {
      torch::manual_seed(0);
      Mlp mlp(widths, mode);
      mlp->to(device);
      modules.push_back(mlp.ptr());
      forwards.push_back([mlp, x]() mutable { return mlp->forward(x); });
    }
    run_models("forward + backward of an MLP " + shape_text(widths) + " (GELU between), " +
                   std::to_string(rows) + " rows",
               modes, modules, forwards, device, rounds);
  }

  // ---- 1b. a Llama-like block, bf16 weights ----
  {
    const int64_t dim = cuda ? 4096 : 512, hidden = cuda ? 14336 : 1408, heads = cuda ? 32 : 8;
    const int64_t batch = cuda ? 2 : 1, seq = cuda ? 4096 : 256;
    std::vector<Mode> block_modes = {{"bf16"}};
    for (const auto& name : kFp8Modes) block_modes.push_back({name});
    std::vector<std::shared_ptr<torch::nn::Module>> modules;
    std::vector<std::function<torch::Tensor()>> forwards;
    torch::manual_seed(1);
    const auto x = torch::randn({batch, seq, dim}, device).to(torch::kBFloat16);
    for (const auto& mode : block_modes) {
      torch::manual_seed(0);
      Block block(dim, hidden, heads, mode);
      block->to(device, torch::kBFloat16);  // bf16 weights (the delayed buffers stay float32)
      modules.push_back(block.ptr());
      forwards.push_back([block, x]() mutable { return block->forward(x); });
    }
    run_models("forward + backward of a Llama-like block (dim " + std::to_string(dim) +
                   ", SwiGLU hidden " + std::to_string(hidden) + ", " + std::to_string(heads) +
                   " heads, " + std::to_string(batch) + " x " + std::to_string(seq) +
                   " tokens, bf16 weights)",
               block_modes, modules, forwards, device, rounds);
  }

  // ---- 2. the MLP's GEMMs alone ----
  {
    double fp8_ms = 0.0, bf16_ms = 0.0;
    torch::manual_seed(2);
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      const int64_t k = widths[i], n = widths[i + 1];
      const auto a = torch::randn({rows, k}, device).to(torch::kBFloat16);
      const auto w = torch::randn({n, k}, device).to(torch::kBFloat16);
      const auto g = torch::randn({rows, n}, device).to(torch::kBFloat16);
      amp::fp8::CastConfig e4m3, e5m2;
      e5m2.dtype = torch::kFloat8_e5m2;
      namespace d = amp::fp8::detail;
      const auto a8 = d::cast_dynamic(a, e4m3, -1, false);
      const auto w8 = d::cast_dynamic(w.t(), e4m3, -1, false);
      const auto g8 = d::cast_dynamic(g, e5m2, -1, false);
      // The layouts each GEMM wants, prepared outside the timing.
      auto w8_for_input = w8.t();
      w8_for_input.data = w8_for_input.data.t().contiguous().t();
      auto g8_t = g8.t();
      g8_t.data = g8_t.data.contiguous();
      auto a8_col = a8;
      a8_col.data = a8.data.t().contiguous().t();
      fp8_ms += time_ms(
          [&] {
            d::scaled_mm(a8, w8, torch::kBFloat16, true);
            d::scaled_mm(g8, w8_for_input, torch::kBFloat16, false);
            d::scaled_mm(g8_t, a8_col, torch::kBFloat16, false);
          },
          device, rounds);
      bf16_ms += time_ms(
          [&] {
            torch::mm(a, w.t());
            torch::mm(g, w);
            torch::mm(g.t(), a);
          },
          device, rounds);
    }
    std::printf(
        "\nthe MLP's 9 GEMMs alone (3 per layer): float8 tensorwise %.2f ms, bf16 %.2f ms "
        "(compare with the modes' times above: the rest is casts, GELU, loss, autograd)\n",
        fp8_ms, bf16_ms);
  }

  // ---- 3. the casts alone ----
  {
    const int64_t cast_rows = cuda ? 8192 : 2048, cast_cols = cuda ? 8192 : 1024;
    torch::manual_seed(3);
    const auto x = torch::randn({cast_rows, cast_cols}, device).to(torch::kBFloat16);
    const double elems = static_cast<double>(x.numel());
    namespace d = amp::fp8::detail;
    amp::fp8::CastConfig tensorwise, rowwise;
    rowwise.granularity = amp::fp8::Granularity::rowwise;
    amp::fp8::detail::DelayedState state{
        torch::zeros({16}, device.is_cuda() ? torch::TensorOptions().device(device)
                                            : torch::TensorOptions()),
        torch::ones({}, torch::TensorOptions().device(device))};
    const auto options = amp::fp8::DelayedScalingOptions().amax_history_len(16);
    struct Cast {
      const char* name;
      double bytes;  // per element, by construction
      std::function<void()> run;
    };
    // Bytes per element (bf16 in), eager: a dynamic cast reads x for abs (2), writes and reads
    // |x| (2 + 2) for the max, then to float (2 + 4), multiply (4 + 4), clamp (4 + 4), to float8
    // (4 + 1): 33, and the backward's transposed copy (1 + 1): 35; rowwise casts along rows and
    // along columns: 33 + 33 + 2 = 68; delayed: the quantise chain (27), the amax chain abs, to
    // float, nan_to_num, max (2 + 2 + 2 + 4 + 4 + 4 + 4 = 22) and the copy: 51. Fused: amax 2,
    // cast 2 + 1 + 1: 6; rowwise two amax passes and two casts of one layout each: 10; delayed
    // one pass: 4.
    const std::vector<Cast> casts = {
        {"tensorwise eager", 35,
         [&] { d::cast_dynamic(x, tensorwise, -1, false).data.t().contiguous(); }},
        {"tensorwise fused", 6,
         [&] { d::fused_cast_dynamic(x, tensorwise, -1, false, d::Layouts::kBoth); }},
        {"rowwise eager", 68,
         [&] {
           d::cast_dynamic(x, rowwise, -1, true);
           d::cast_dynamic(x, rowwise, 0, true).data.t().contiguous();
         }},
        {"rowwise fused", 10,
         [&] {
           d::fused_cast_dynamic(x, rowwise, -1, true, d::Layouts::kSame);
           d::fused_cast_dynamic(x, rowwise, 0, true, d::Layouts::kOther);
         }},
        {"delayed eager", 51,
         [&] { d::cast_delayed(x, torch::kFloat8_e4m3fn, state, options).data.t().contiguous(); }},
        {"delayed fused", 4,
         [&] {
           d::fused_cast_delayed(x, torch::kFloat8_e4m3fn, state, options, d::Layouts::kBoth);
         }},
    };
    std::printf(
        "\ncasts of a %lld x %lld bf16 tensor to both float8 layouts (what forward and "
        "backward need)\n%-18s %10s %14s %12s %10s\n",
        static_cast<long long>(cast_rows), static_cast<long long>(cast_cols), "cast", "median ms",
        "bytes/elem", "GB/s", "vs eager");
    double eager_ms = 0.0;
    for (size_t i = 0; i < casts.size(); ++i) {
      const double ms = time_ms(casts[i].run, device, rounds);
      if (i % 2 == 0) eager_ms = ms;
      std::printf("%-18s %10.3f %14.0f %12.1f %9.2fx\n", casts[i].name, ms, casts[i].bytes,
                  casts[i].bytes * elems / (ms * 1e-3) / 1e9, eager_ms / ms);
    }
    std::printf(
        "(bytes/elem: the reads and writes each implementation makes by construction; the "
        "minimum for a cast to both layouts is 6, 4 with a delayed scale)\n");
  }

  // ---- 4. gradient accumulation: weight casts per micro-batch or once per step ----
  {
    constexpr int kMicroBatches = 4;
    const std::vector<std::string> names = {"fp8 tensorwise", "fp8 tensorwise fused",
                                            "fp8 delayed"};
    std::vector<Mlp> mlps;
    for (size_t i = 0; i < 2 * names.size(); ++i) {
      torch::manual_seed(0);
      mlps.emplace_back(widths, Mode{names[i / 2]});
      mlps.back()->to(device);
    }
    torch::manual_seed(4);
    const auto x = torch::randn({rows, widths.front()}, device);
    std::vector<std::vector<double>> times(mlps.size());
    for (int round = -1; round < rounds; ++round) {  // one warm-up round
      for (size_t i = 0; i < mlps.size(); ++i) {     // even: fresh, odd: keep then reuse
        mlps[i]->zero_grad(/*set_to_none=*/true);
        sync(device);
        const auto start = Clock::now();
        for (int micro = 0; micro < kMicroBatches; ++micro) {
          const auto casts = i % 2 == 0   ? amp::fp8::WeightCasts::fresh
                             : micro == 0 ? amp::fp8::WeightCasts::keep
                                          : amp::fp8::WeightCasts::reuse;
          torch::Tensor loss;
          {
            amp::fp8::Float8AutocastGuard float8(true, casts);
            amp::AutocastGuard autocast(
                amp::AutocastOptions(device.type()).dtype(torch::kBFloat16));
            loss = mlps[i]->forward(x).to(torch::kFloat).square().mean();
          }
          loss.backward();
        }
        sync(device);
        if (round >= 0) {
          times[i].push_back(
              std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        }
      }
    }
    std::printf(
        "\ngradient accumulation: %d micro-batches of %lld rows through the MLP, weights cast "
        "every forward and backward (fresh) or once per step (WeightCasts::keep, then reuse)\n"
        "%-22s %14s %20s %12s\n",
        kMicroBatches, static_cast<long long>(rows), "recipe", "fresh ms", "keep+reuse ms",
        "fresh/kept");
    for (size_t n = 0; n < names.size(); ++n) {
      std::printf("%-22s %14.2f %20.2f %11.2fx\n", names[n].c_str(),
                  amp_bench::median(times[2 * n]), amp_bench::median(times[2 * n + 1]),
                  amp_bench::median(amp_bench::ratios(times[2 * n], times[2 * n + 1])));
    }
  }
  return 0;
}
