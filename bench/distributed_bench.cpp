// amp::distributed on the CPU (Gloo): a training step with DistributedDataParallel (buckets
// all-reduced during backward) against the same step with one all-reduce pass after backward and
// against one process alone, per transfer dtype, plus the found-inf sync's cost. Start it with
// `torchrun --no-python --nproc-per-node N amp_distributed_bench [hidden] [rounds] [steps]`;
// rank 0 prints medians with 95% confidence intervals and paired ratios (rounds alternate the
// variants).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

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
  std::printf("%-62s %9.3f ms  [%.3f, %.3f]\n", row.name.c_str(),
              amp_bench::median(row.per_step_ms), lo, hi);
}

void print_ratio(const char* what, const Row& a, const Row& b) {
  const auto r = amp_bench::ratios(a.per_step_ms, b.per_step_ms);
  const auto [lo, hi] = amp_bench::median_ci(r);
  std::printf("%-62s %9.3f     [%.3f, %.3f]\n", what, amp_bench::median(r), lo, hi);
}

// The baseline: every gradient averaged after backward has returned, in flat buckets of at most
// 25 MiB (reverse parameter order), all buckets in flight at once; no overlap with backward.
void all_reduce_after_backward(const std::vector<at::Tensor>& params, c10d::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  constexpr int64_t kBucketBytes = 25 * 1024 * 1024;
  std::vector<std::vector<at::Tensor>> buckets(1);
  int64_t bytes = 0;
  for (auto p = params.rbegin(); p != params.rend(); ++p) {
    if (bytes > 0 && bytes + p->nbytes() > kBucketBytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(*p);
    bytes += static_cast<int64_t>(p->nbytes());
  }
  std::vector<at::Tensor> flats;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& bucket : buckets) {
    std::vector<at::Tensor> grads;
    for (const auto& p : bucket) grads.push_back(p.grad().reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(grads).div_(group.getSize())};
    works.push_back(group.allreduce(flat));
    flats.push_back(flat[0]);
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    works[b]->wait();
    int64_t offset = 0;
    for (const auto& p : buckets[b]) {
      p.grad().view({-1}).copy_(flats[b].narrow(0, offset, p.numel()));
      offset += p.numel();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t hidden = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 5;  // per round and variant
  constexpr int64_t kLocalBatch = 64;
  // A cap below the last layer's size: one bucket per Linear layer (4 buckets for 3 hidden).
  constexpr double kBucketCapMb = 0.05;
  auto group = dist::init_gloo_from_torchrun(dist::GroupOptions().gloo_hostname("127.0.0.1"));
  const bool lead = group->getRank() == 0;
  const int world = group->getSize();

  // One model per variant (a module is wrapped by one DistributedDataParallel at a time), all
  // from the same seed.
  const auto make = [&] {
    torch::manual_seed(0);
    return amp_bench::make_mlp({784, hidden, hidden, hidden, 10});
  };
  struct Variant {
    torch::nn::Sequential model;
    std::unique_ptr<torch::optim::SGD> optimizer;
    std::unique_ptr<dist::DistributedDataParallel> ddp;
  };
  const auto variant = [&](std::optional<dist::CommHook> hook) {
    Variant v{make(), nullptr, nullptr};
    v.optimizer = std::make_unique<torch::optim::SGD>(v.model->parameters(), 0.01);
    if (hook) {
      v.ddp = std::make_unique<dist::DistributedDataParallel>(
          v.model, group,
          dist::DistributedDataParallelOptions().bucket_cap_mb(kBucketCapMb).comm_hook(*hook));
    }
    return v;
  };
  Variant plain = variant(std::nullopt);
  Variant ddp32 = variant(dist::CommHook::kAllReduce);
  Variant ddp_bf16 = variant(dist::CommHook::kBf16Compress);
  Variant ddp_fp16 = variant(dist::CommHook::kFp16Compress);
  torch::manual_seed(1 + group->getRank());
  const torch::Tensor images = torch::rand({kLocalBatch, 784});
  const torch::Tensor labels = torch::randint(10, {kLocalBatch});

  enum class Sync { kNone, kAfterBackward, kDuringBackward };
  const auto train_step = [&](Variant& v, Sync sync) {
    v.optimizer->zero_grad();
    const auto forward = [&] { return v.model->forward(images); };
    const torch::Tensor out = sync == Sync::kDuringBackward ? v.ddp->forward(forward) : forward();
    torch::nn::functional::cross_entropy(out, labels).backward();
    if (sync == Sync::kAfterBackward) all_reduce_after_backward(v.model->parameters(), *group);
    v.optimizer->step();
  };
  const auto timed = [&](Row& row, auto&& body) {
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) body();
    row.per_step_ms.push_back(ms_since(start) / steps);
  };

  Row alone{"step, one process's work (no communication)", {}};
  Row after{"step, fp32 all-reduce after backward", {}};
  Row during32{"step, DistributedDataParallel fp32 (during backward)", {}};
  Row during_bf16{"step, DistributedDataParallel bf16 hook", {}};
  Row during_fp16{"step, DistributedDataParallel fp16 hook", {}};
  Row flag{"found-inf all-reduce alone (1 float, MAX)", {}};
  const auto sync = dist::found_inf_sync(group);
  torch::Tensor found = torch::zeros({});
  for (int warm = 0; warm < 3; ++warm) {
    train_step(plain, Sync::kAfterBackward);
    for (Variant* v : {&ddp32, &ddp_bf16, &ddp_fp16}) train_step(*v, Sync::kDuringBackward);
  }
  for (int round = 0; round < rounds; ++round) {
    timed(alone, [&] { train_step(plain, Sync::kNone); });
    timed(after, [&] { train_step(plain, Sync::kAfterBackward); });
    timed(during32, [&] { train_step(ddp32, Sync::kDuringBackward); });
    timed(during_bf16, [&] { train_step(ddp_bf16, Sync::kDuringBackward); });
    timed(during_fp16, [&] { train_step(ddp_fp16, Sync::kDuringBackward); });
    timed(flag, [&] { sync->all_reduce_max_(found); });
  }
  if (lead) {
    int64_t elements = 0;
    for (const auto& p : plain.model->parameters()) elements += p.numel();
    std::printf(
        "amp_distributed_bench: %d ranks (gloo, 127.0.0.1), MLP 784-%lld-%lld-%lld-10 "
        "(%lld parameters), %lld images per rank per step, fp32, SGD, OMP threads %d\n",
        world, static_cast<long long>(hidden), static_cast<long long>(hidden),
        static_cast<long long>(hidden), static_cast<long long>(elements),
        static_cast<long long>(kLocalBatch), at::get_num_threads());
    std::printf(
        "DDP buckets: %zu (bucket_cap_mb %g); gradient bytes each rank hands to the "
        "all-reduce per step: fp32 %lld, bf16/fp16 %lld\n",
        ddp32.ddp->buckets().size(), kBucketCapMb, static_cast<long long>(elements * 4),
        static_cast<long long>(elements * 2));
    std::printf("cpu: %s; load before: %s\n", amp_bench::cpu_model().c_str(),
                amp_bench::load_average().c_str());
    std::printf("%d rounds x %d steps per row, rows interleaved; median per step [95%% CI]\n",
                rounds, steps);
    for (const Row* row : {&alone, &after, &during32, &during_bf16, &during_fp16, &flag}) {
      print_row(*row);
    }
    print_ratio("ratio: DDP fp32 / all-reduce after backward", during32, after);
    print_ratio("ratio: DDP bf16 hook / DDP fp32", during_bf16, during32);
    print_ratio("ratio: DDP fp16 hook / DDP fp32", during_fp16, during32);
    print_ratio("ratio: all-reduce after backward / no communication", after, alone);
    print_ratio("ratio: DDP fp32 / no communication", during32, alone);
  }
  return 0;
}
