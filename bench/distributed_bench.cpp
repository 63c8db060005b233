// amp::distributed on the CPU (Gloo): what the found-inf sync adds to a training step, and what a
// gradient all-reduce costs in each transfer dtype. Start it with
// `torchrun --no-python --nproc-per-node N amp_distributed_bench [hidden] [rounds]`; rank 0
// prints medians with 95% confidence intervals and paired ratios (rounds alternate the variants).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <amp/autocast.h>
#include <amp/distributed.h>
#include <amp/grad_scaler.h>

#include "bench_stats.h"

namespace {

namespace dist = amp::distributed;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Row {
  std::string name;
  std::vector<double> per_step_ms;  // the mean step of each round
};

void print_row(const Row& row) {
  const auto [lo, hi] = amp_bench::median_ci(row.per_step_ms);
  std::printf("%-58s %9.4f ms  [%.4f, %.4f]\n", row.name.c_str(), amp_bench::median(row.per_step_ms),
              lo, hi);
}

void print_ratio(const char* what, const Row& a, const Row& b) {
  const auto r = amp_bench::ratios(a.per_step_ms, b.per_step_ms);
  const auto [lo, hi] = amp_bench::median_ci(r);
  std::printf("%-58s %9.3f     [%.3f, %.3f]\n", what, amp_bench::median(r), lo, hi);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t hidden = argc > 1 ? std::atoll(argv[1]) : 256;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 30;
  constexpr int kSteps = 40;         // steps per round and variant
  constexpr int64_t kLocalBatch = 32;  // the example's global batch 64 over 2 ranks
  auto group = dist::init_gloo_from_torchrun(dist::GroupOptions().gloo_hostname("127.0.0.1"));
  const bool lead = group->getRank() == 0;
  const int world = group->getSize();

  torch::manual_seed(0);
  auto model = amp_bench::make_mlp({784, hidden, 10});
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  const auto sync = dist::found_inf_sync(group);
  amp::GradScaler synced(c10::DeviceType::CPU, amp::GradScalerOptions().found_inf_sync(sync));
  amp::GradScaler local(c10::DeviceType::CPU);
  dist::GradientAllReduce fp32(model->parameters(), group);
  dist::GradientAllReduce bf16(model->parameters(), group,
                               dist::GradientAllReduceOptions().comm_dtype(at::kBFloat16));
  dist::GradientAllReduce fp16(model->parameters(), group,
                               dist::GradientAllReduceOptions().comm_dtype(at::kHalf));
  const torch::Tensor images = torch::rand({kLocalBatch, 784});
  const torch::Tensor labels = torch::randint(10, {kLocalBatch});

  const auto train_step = [&](amp::GradScaler& scaler, dist::GradientAllReduce* reducer) {
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      amp::AutocastGuard autocast(c10::DeviceType::CPU, at::kHalf);
      loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    }
    scaler.scale(loss).backward();
    if (reducer != nullptr) reducer->all_reduce_();
    scaler.step(optimizer);
    scaler.update();
  };
  const auto timed = [&](Row& row, auto&& body) {
    const auto start = Clock::now();
    for (int i = 0; i < kSteps; ++i) body();
    row.per_step_ms.push_back(ms_since(start) / kSteps);
  };

  Row step_synced{"training step, all-reduce fp32 + found-inf sync", {}};
  Row step_local{"training step, all-reduce fp32, scaler not synced", {}};
  Row step_alone{"training step, no communication (rank-local)", {}};
  Row flag{"found-inf all-reduce alone (1 float, MAX)", {}};
  Row reduce32{"gradient all-reduce alone, fp32", {}};
  Row reduce_bf16{"gradient all-reduce alone, bf16 transfer", {}};
  Row reduce_fp16{"gradient all-reduce alone, fp16 transfer", {}};
  torch::Tensor found = torch::zeros({});
  for (int warm = 0; warm < 20; ++warm) train_step(synced, &fp32);
  for (int round = 0; round < rounds; ++round) {
    timed(step_synced, [&] { train_step(synced, &fp32); });
    timed(step_local, [&] { train_step(local, &fp32); });
    timed(step_alone, [&] { train_step(local, nullptr); });
    timed(flag, [&] { sync->all_reduce_max_(found); });
    timed(reduce32, [&] { fp32.all_reduce_(); });
    timed(reduce_bf16, [&] { bf16.all_reduce_(); });
    timed(reduce_fp16, [&] { fp16.all_reduce_(); });
  }
  if (lead) {
    int64_t elements = 0;
    for (const auto& p : model->parameters()) elements += p.numel();
    std::printf("amp_distributed_bench: %d ranks (gloo, 127.0.0.1), MLP 784-%lld-10 (%lld "
                "parameters), %lld images per rank per step, fp16 autocast, OMP threads %d\n",
                world, static_cast<long long>(hidden), static_cast<long long>(elements),
                static_cast<long long>(kLocalBatch), at::get_num_threads());
    std::printf("cpu: %s; load before: %s\n", amp_bench::cpu_model().c_str(),
                amp_bench::load_average().c_str());
    std::printf("%d rounds x %d steps per row, rows interleaved; median per step [95%% CI]\n",
                rounds, kSteps);
    for (const Row* row : {&step_synced, &step_local, &step_alone, &flag, &reduce32, &reduce_bf16,
                           &reduce_fp16}) {
      print_row(*row);
    }
    print_ratio("ratio: step with sync / step without", step_synced, step_local);
    print_ratio("ratio: bf16 transfer / fp32", reduce_bf16, reduce32);
    print_ratio("ratio: fp16 transfer / fp32", reduce_fp16, reduce32);
  }
  return 0;
}
