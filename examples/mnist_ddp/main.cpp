// The seed's program trained data-parallel: Linear(784, 10) on MNIST-format images, each of the
// processes torchrun starts training on its shard of every epoch (as DistributedSampler shards),
// gradients averaged by amp::distributed::DistributedDataParallel while backward runs, fp16
// autocast with a GradScaler whose skip decisions every rank shares. Gloo on the CPU, NCCL on CUDA.
#include <amp/autocast.h>
#include <amp/distributed.h>
#include <amp/grad_scaler.h>

#include <ATen/ops/randperm.h>
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.h"
#include "common/evaluate.h"
#include "common/fingerprint.h"
#include "common/mnist_tensors.h"
#include "common/precision.h"
#include "common/program.h"
#include "common/train_monitor.h"

namespace {

namespace dist = amp::distributed;
using amp_examples::Clock;
using amp_examples::ImageSet;
using amp_examples::kImagePixels;
using amp_examples::kNumClasses;
using amp_examples::seconds_since;

constexpr std::int64_t kEvalChunk = 1000;

/// A value of --comm-dtype: the dtype gradients travel in (DDP's comm hook).
struct CommChoice {
  std::string_view name;
  dist::CommHook hook;
};

constexpr std::array kCommDtypes = {
    CommChoice{"fp32", dist::CommHook::kAllReduce},
    CommChoice{"bf16", dist::CommHook::kBf16Compress},
    CommChoice{"fp16", dist::CommHook::kFp16Compress},
};

struct Settings {
  std::filesystem::path data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 5;
  /// The global batch: every step averages the gradients of batch_size images over all ranks.
  std::int64_t batch_size = 64;
  double lr = 0.01;
  std::int64_t seed = 0;
  amp_examples::Precision precision = amp_examples::kPrecisions[2];  // fp16
  amp_examples::DeviceChoice device = amp_examples::kDevices[0];     // cpu
  CommChoice comm = kCommDtypes[0];
  double bucket_mb = 25;
  std::int64_t timeout_s = 300;
  std::int64_t hidden = 0;
  std::int64_t layers = 1;
};

/// The seed's MyModel, Linear(784, 10); with --hidden N an MLP, Linear(784, N), ReLU,
/// Linear(N, 10), which has more arithmetic per byte of gradient to communicate; --layers L
/// stacks L hidden layers of N (Linear(N, N) and ReLU after the first), a model whose gradients
/// fill several DDP buckets.
struct MyModelImpl : torch::nn::Module {
  MyModelImpl(std::int64_t hidden, std::int64_t layers) {
    if (hidden == 0) {
      fc = register_module("fc", torch::nn::Linear(kImagePixels, kNumClasses));
      return;
    }
    fc = register_module("fc", torch::nn::Linear(kImagePixels, hidden));
    for (std::int64_t k = 2; k <= layers; ++k) {
      deeper.push_back(
          register_module("fc" + std::to_string(k), torch::nn::Linear(hidden, hidden)));
    }
    out = register_module("out", torch::nn::Linear(hidden, kNumClasses));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = fc(x.view({-1, kImagePixels}));
    if (!out) return y;
    for (auto& layer : deeper) y = layer(torch::relu(y));
    return out(torch::relu(y));
  }
  torch::nn::Linear fc{nullptr};
  std::vector<torch::nn::Linear> deeper;
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(MyModel);

/// "Linear(784, 10)" or "MLP 784-256-256-10".
std::string model_name(const Settings& settings) {
  if (settings.hidden == 0) return "Linear(784, 10)";
  std::string name = "MLP 784-";
  for (std::int64_t k = 0; k < settings.layers; ++k) name += fmt::format("{}-", settings.hidden);
  return name + "10";
}

/// This rank's indices for `epoch`, as torch.utils.data.DistributedSampler(shuffle=True,
/// drop_last=False) makes them: a permutation drawn from a generator seeded with seed + epoch,
/// padded from its start to a multiple of the world size, then every world_size-th index from
/// `rank`. Every rank gets the same count; the union of the ranks' k-th batches is the k-th batch
/// of the one-process order.
torch::Tensor shard(std::int64_t size, std::int64_t seed, std::int64_t epoch, int rank, int world) {
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(seed + epoch));
  torch::Tensor order = at::randperm(size, generator, torch::kInt64);
  const std::int64_t total = (size + world - 1) / world * world;
  if (total > size) order = torch::cat({order, order.slice(0, 0, total - size)});
  return order.slice(0, rank, total, world);
}

/// The process group and what rides on it; empty for a single process.
struct Parallel {
  dist::TorchrunEnv env;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

Parallel join(const Settings& settings) {
  Parallel parallel;
  if (!dist::launched_by_torchrun()) return parallel;  // one process: rank 0 of 1
  parallel.env = dist::torchrun_env();
  const auto options = dist::GroupOptions().timeout(std::chrono::seconds(settings.timeout_s));
  // NCCL on CUDA (one GPU per rank: cuda:LOCAL_RANK), Gloo on the CPU.
  parallel.group = settings.device.type == c10::DeviceType::CUDA
                       ? dist::init_nccl_from_torchrun(options)
                       : dist::init_gloo_from_torchrun(options);
  return parallel;
}

void run(const Settings& settings) {
  amp_examples::require_device(settings.device);
  const auto start = Clock::now();
  const Parallel parallel = join(settings);
  const int rank = parallel.env.rank;
  const int world = parallel.env.world_size;
  const bool lead = rank == 0;
  if (settings.batch_size % world != 0) {
    throw amp_examples::UsageError(fmt::format(
        "--batch-size {} is the global batch and must divide evenly among the {} ranks; use a "
        "multiple of {}",
        settings.batch_size, world, world));
  }
  const std::int64_t local_batch = settings.batch_size / world;
  const c10::DeviceType device = settings.device.type;
  const c10::Device on =
      device == c10::DeviceType::CUDA
          ? c10::Device(device, static_cast<c10::DeviceIndex>(parallel.env.local_rank))
          : c10::Device(device);
  const auto [train, test] =
      amp_examples::load_image_data(settings.data_dir, amp_examples::Pixels::kUnitRange, device);

  torch::manual_seed(static_cast<std::uint64_t>(settings.seed));
  if (settings.layers > 1 && settings.hidden == 0) {
    throw amp_examples::UsageError(fmt::format(
        "--layers {} needs hidden layers: add --hidden N (the seed's linear model has none)",
        settings.layers));
  }
  MyModel model(settings.hidden, settings.layers);
  model->to(on);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(settings.lr));
  amp::GradScalerOptions scaler_options =
      amp::GradScalerOptions().enabled(settings.precision.loss_scaling).track_counters(true);
  // Rank 0's weights are broadcast to the others at construction; every backward then averages
  // the gradients over the ranks, bucket by bucket, while it runs.
  std::optional<dist::DistributedDataParallel> ddp;
  if (parallel.group) {
    scaler_options.found_inf_sync(dist::found_inf_sync(parallel.group));
    ddp.emplace(model, parallel.group,
                dist::DistributedDataParallelOptions()
                    .bucket_cap_mb(settings.bucket_mb)
                    .comm_hook(settings.comm.hook));
  }
  amp::GradScaler scaler(device, scaler_options);
  if (lead) {
    fmt::print(
        "mnist_ddp: {} rank{} ({}), global batch {} ({} per rank), precision {}, gradients in "
        "{}, epochs {}, lr {}, seed {}, model {}\n",
        world, world > 1 ? "s" : "", parallel.group ? parallel.group->getBackendName() : "no group",
        settings.batch_size, local_batch, settings.precision.name, settings.comm.name,
        settings.epochs, settings.lr, settings.seed, model_name(settings));
    fmt::print("data: {} training and {} test images from {} ({:.2f} s)\n", train.size(),
               test.size(), settings.data_dir.string(), seconds_since(start));
    std::fflush(stdout);
  }

  const auto training_start = Clock::now();
  double accuracy = 0;
  int64_t skipped_before = 0;
  for (std::int64_t epoch = 1; epoch <= settings.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    model->train();
    const torch::Tensor mine = shard(train.size(), settings.seed, epoch, rank, world).to(on);
    // Summed on the device, read once per epoch.
    torch::Tensor loss_sum =
        torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(on));
    std::int64_t steps = 0;
    for (std::int64_t begin = 0; begin < mine.size(0); begin += local_batch, ++steps) {
      const torch::Tensor batch = mine.slice(0, begin, std::min(begin + local_batch, mine.size(0)));
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        amp::AutocastGuard autocast(device, settings.precision.autocast_dtype,
                                    settings.precision.autocast_dtype.has_value());
        const torch::Tensor images = train.images.index_select(0, batch);
        const auto forward = [&] { return model->forward(images); };
        loss = torch::nn::functional::cross_entropy(ddp ? ddp->forward(forward) : forward(),
                                                    train.labels.index_select(0, batch));
      }
      // With DDP, backward returns with every gradient averaged over the ranks: the global
      // batch's gradient.
      scaler.scale(loss).backward();
      scaler.step(optimizer);
      scaler.update();
      loss_sum += loss.detach().to(torch::kFloat64) * batch.size(0);
    }
    if (parallel.group) {
      // The epoch's loss over all ranks' images, once per epoch, for the report.
      std::vector<at::Tensor> tensors{loss_sum};
      parallel.group->allreduce(tensors)->wait();
    }
    // Every rank trained on as many images (the shards are padded to equal sizes).
    const double loss = loss_sum.item<double>() / static_cast<double>(world * mine.size(0));
    const double epoch_seconds = seconds_since(epoch_start);  // training only
    accuracy = amp_examples::test_accuracy(model, test, settings.precision, device, kEvalChunk);
    const int64_t skipped = scaler.is_enabled() ? scaler.counters().steps_skipped : 0;
    if (lead) {
      fmt::print(
          "epoch {}/{}: mean train loss {:.6f}, test accuracy {:.2f}%{}, {:.2f} s, {:.0f} "
          "samples/s\n",
          epoch, settings.epochs, loss, 100 * accuracy,
          scaler.is_enabled() ? fmt::format(", loss scale {:g}, skipped steps {} of {}",
                                            scaler.get_scale(), skipped - skipped_before, steps)
                              : std::string(),
          epoch_seconds, static_cast<double>(train.size()) / epoch_seconds);
      std::fflush(stdout);
    }
    skipped_before = skipped;
  }
  // Every rank prints its own: equal fingerprints mean bit-identical parameters on every rank.
  fmt::print("rank {} parameters: fingerprint {:016x}\n", rank,
             amp_examples::parameter_fingerprint(model->parameters()));
  std::fflush(stdout);
  if (parallel.group) {
    // Rank 0's closing line comes after every rank's fingerprint.
    std::vector<at::Tensor> done{torch::zeros({1}, torch::TensorOptions().device(on))};
    parallel.group->allreduce(done)->wait();
  }
  if (lead) {
    fmt::print(
        "done: precision {}, {} rank{}, test accuracy {:.2f}%, training {:.2f} s, total "
        "{:.2f} s{}\n",
        settings.precision.name, world, world > 1 ? "s" : "", 100 * accuracy,
        seconds_since(training_start), seconds_since(start),
        ddp ? fmt::format(", DDP buckets {}", ddp->buckets().size()) : std::string());
  }
}

amp_examples::CommandLine make_command_line(Settings& s) {
  amp_examples::CommandLine cli(
      "mnist_ddp",
      "Trains the seed's linear classifier data-parallel: start it with\n"
      "`torchrun --no-python --nproc-per-node N mnist_ddp [options]` (alone it runs as one\n"
      "process). Each rank trains on its shard of every epoch, gradients are averaged over the\n"
      "ranks during backward (amp::distributed::DistributedDataParallel), and fp16 steps are\n"
      "skipped on all ranks\n"
      "together (amp::GradScaler with amp::distributed::found_inf_sync). Gloo on the CPU, NCCL\n"
      "on CUDA.");
  amp_examples::add_data_option(cli, s.data_dir);
  cli.add_integer_option("epochs", "N", "passes over the training set", s.epochs, 1);
  cli.add_integer_option("batch-size", "N", "images per step over all ranks (global batch)",
                         s.batch_size, 1);
  cli.add_positive_option("lr", "RATE", "SGD learning rate", s.lr);
  cli.add_integer_option("seed", "N", "seed of the weights and of the epochs' shuffles", s.seed, 0);
  amp_examples::add_precision_option(cli, s.precision);
  amp_examples::add_device_option(cli, s.device);
  cli.add_choice_option("comm-dtype", "dtype the gradients travel in between ranks", kCommDtypes,
                        s.comm);
  cli.add_positive_option("bucket-mb", "MB", "largest gradient bucket per all-reduce", s.bucket_mb);
  cli.add_integer_option("hidden", "N",
                         "hidden units of an MLP instead of the seed's linear model (0: linear)",
                         s.hidden, 0);
  cli.add_integer_option("layers", "L", "hidden layers of --hidden units (with --hidden)", s.layers,
                         1);
  cli.add_integer_option("timeout-s", "SECONDS",
                         "how long to wait for a rank that is late, hung or gone", s.timeout_s, 1);
  return cli;
}

}  // namespace

int main(int argc, char* argv[]) {
  Settings settings;
  const amp_examples::CommandLine cli = make_command_line(settings);
  return amp_examples::run_program(
      cli, argc, argv, [] {}, [&] { run(settings); });
}
