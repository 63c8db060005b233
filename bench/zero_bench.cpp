// ZeroRedundancyOptimizer on the CPU (Gloo): optimizer-state bytes per rank and the training step
// (DistributedDataParallel, GradScaler, FusedAdamW) against the same step with FusedAdamW
// unsharded, for float32 weights and for bfloat16 weights with float32 master copies. Start it
// with `torchrun --no-python --nproc-per-node N amp_zero_bench [rounds] [steps] [batch]`; rank 0
// prints medians with 95% confidence intervals and paired ratios (rounds alternate the variants).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <amp/distributed.h>
#include <amp/distributed/zero_redundancy_optimizer.h>
#include <amp/grad_scaler.h>
#include <amp/low_precision.h>
#include <amp/optim.h>

#include "bench_stats.h"

namespace {

namespace dist = amp::distributed;
using Clock = std::chrono::steady_clock;

// About 19M parameters in 8 equal layers of 1536 x 1536: Python's partition never splits a
// parameter, so equal layers let the shares approach 1/N (3 ranks: 3, 3 and 2 layers).
const std::vector<int64_t> kWidths = {1536, 1536, 1536, 1536, 1536, 1536, 1536, 1536, 1536};

struct Variant {
  std::string name;
  std::shared_ptr<torch::nn::SequentialImpl> model;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<amp::GradScaler> scaler;
  int64_t state_bytes = 0;
  std::vector<double> per_step_ms;
};

Variant make_variant(const std::string& name, bool sharded, bool master,
                     const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  Variant v;
  v.name = name;
  at::manual_seed(0);
  v.model = amp_bench::make_mlp(kWidths).ptr();
  if (master) amp::to_low_precision(*v.model, at::kBFloat16);
  v.ddp = std::make_unique<dist::DistributedDataParallel>(v.model, group);
  auto options = amp::optim::FusedAdamWOptions(1e-4).weight_decay(0.01).master_weights(master);
  if (sharded) {
    v.optimizer = std::make_unique<dist::ZeroRedundancyOptimizer>(
        v.model->parameters(), dist::shard_optimizer<amp::optim::FusedAdamW>(options), group);
  } else {
    v.optimizer = std::make_unique<amp::optim::FusedAdamW>(v.model->parameters(), options);
  }
  v.scaler = std::make_unique<amp::GradScaler>(c10::DeviceType::CPU);
  return v;
}

void train_steps(Variant& v, const at::Tensor& x, const at::Tensor& y, int steps) {
  for (int s = 0; s < steps; ++s) {
    v.model->zero_grad();
    at::Tensor out = v.ddp->forward(
        [&] { return v.model->forward(x.to(v.model->parameters()[0].scalar_type())); });
    v.scaler->scale(at::cross_entropy_loss(out.to(at::kFloat), y)).backward();
    v.scaler->step(*v.optimizer);
    v.scaler->update();
  }
}

int64_t state_bytes(const Variant& v) {
  if (const auto* zero = dynamic_cast<const dist::ZeroRedundancyOptimizer*>(v.optimizer.get())) {
    return zero->state_bytes();
  }
  return dist::optimizer_state_bytes(*v.optimizer);
}

void print_row(const Variant& v) {
  const auto [lo, hi] = amp_bench::median_ci(v.per_step_ms);
  std::printf("%-52s %9.1f ms  [%.1f, %.1f]   state %7.1f MB on rank 0\n", v.name.c_str(),
              amp_bench::median(v.per_step_ms), lo, hi, v.state_bytes / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
  const int64_t batch = argc > 3 ? std::atoll(argv[3]) : 16;
  auto group = dist::init_gloo_from_torchrun();
  const int rank = group->getRank(), world = group->getSize();
  at::set_num_threads(1);
  int64_t params = 0;
  std::vector<Variant> variants;
  for (const bool master : {false, true}) {
    const std::string weights = master ? "bf16 weights, master copies" : "fp32 weights";
    variants.push_back(make_variant("DDP + FusedAdamW, " + weights, false, master, group));
    variants.push_back(make_variant("DDP + ZeRO(FusedAdamW), " + weights, true, master, group));
  }
  for (const auto& p : variants.front().model->parameters()) params += p.numel();
  at::manual_seed(100 + rank);
  const at::Tensor x = at::randn({batch, kWidths.front()});
  const at::Tensor y = at::randint(kWidths.back(), {batch});
  for (auto& v : variants) train_steps(v, x, y, 1);  // warm-up; creates the state
  for (auto& v : variants) v.state_bytes = state_bytes(v);
  for (int round = 0; round < rounds; ++round) {
    for (auto& v : variants) {
      group->barrier()->wait();
      const auto start = Clock::now();
      train_steps(v, x, y, steps);
      group->barrier()->wait();
      v.per_step_ms.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps);
    }
  }
  // Every rank's share (the partition's imbalance shows here).
  std::printf(
      "rank %d state: %.1f MB unsharded, %.1f MB ZeRO (fp32 weights); %.1f MB unsharded, "
      "%.1f MB ZeRO (bf16 weights, master copies)\n",
      rank, variants[0].state_bytes / 1e6, variants[1].state_bytes / 1e6,
      variants[2].state_bytes / 1e6, variants[3].state_bytes / 1e6);
  std::fflush(stdout);
  group->barrier()->wait();
  if (rank != 0) return 0;
  std::printf(
      "# %d rank(s) on %s, load %s; MLP %lld parameters, batch %lld per rank, %d rounds "
      "x %d steps\n",
      world, amp_bench::cpu_model().c_str(), amp_bench::load_average().c_str(),
      static_cast<long long>(params), static_cast<long long>(batch), rounds, steps);
  for (const auto& v : variants) print_row(v);
  for (size_t i = 0; i < variants.size(); i += 2) {
    const auto& plain = variants[i];
    const auto& zero = variants[i + 1];
    const auto r = amp_bench::ratios(zero.per_step_ms, plain.per_step_ms);
    const auto [lo, hi] = amp_bench::median_ci(r);
    std::printf("step time ZeRO / unsharded (%s): %.3f [%.3f, %.3f]\n",
                zero.name.substr(zero.name.find(", ") + 2).c_str(), amp_bench::median(r), lo, hi);
    std::printf("state on rank 0, ZeRO / unsharded: %.3f (1/N = %.3f)\n",
                static_cast<double>(zero.state_bytes) / static_cast<double>(plain.state_bytes),
                1.0 / world);
  }
  return 0;
}
