// The seed's training program in C++: Linear(784, 10) on MNIST-format images, SGD (LibTorch's or
// amp's fused one), cross-entropy, with the forward pass under amp::AutocastGuard, fp16 loss
// scaling by amp::GradScaler, and checkpoints that resume exactly.
#include <amp/autocast.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "common/cli.h"
#include "common/evaluate.h"
#include "common/mnist_tensors.h"
#include "common/precision.h"
#include "common/program.h"
#include "common/train_monitor.h"
#include "common/training_state.h"

namespace {

using amp_examples::Clock;
using amp_examples::ImageSet;
using amp_examples::kImagePixels;
using amp_examples::kNumClasses;
using amp_examples::seconds_since;

// Test images per forward pass when measuring accuracy; only bounds memory.
constexpr std::int64_t kEvalChunk = 1000;
// Written into every checkpoint; a reader refuses other versions instead of misreading them.
constexpr std::int64_t kCheckpointFormat = 1;

/// A value of --optimizer: the same SGD update from LibTorch, or from amp over ATen's fused kernel,
/// which with fp16 also unscales the gradients and skips an overflowing step on the device.
struct OptimizerChoice {
  std::string_view name;
  bool fused;
};

constexpr std::array kOptimizers = {
    OptimizerChoice{"sgd", false},
    OptimizerChoice{"fused-sgd", true},
};

/// The program's settings; the defaults are the seed's.
struct Settings {
  std::filesystem::path data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 5;
  std::int64_t batch_size = 64;
  double lr = 0.01;
  OptimizerChoice optimizer = kOptimizers[0];  // sgd
  std::int64_t seed = 0;
  amp_examples::Precision precision = amp_examples::kPrecisions[1];  // bf16
  /// --fp8-recipe: the float8 recipe of --precision fp8.
  std::string fp8_recipe = "tensorwise";
  amp_examples::DeviceChoice device = amp_examples::kDevices[0];  // cpu
  /// The GradScaler's settings, torch.amp's defaults unless --init-scale / --growth-interval say
  /// otherwise; `enabled` is set from the precision. The counters report skipped steps per epoch.
  amp::GradScalerOptions scaler = amp::GradScalerOptions().track_counters(true);
  /// --checkpoint and --resume: continue from the checkpoint instead of starting from the seed.
  amp_examples::CheckpointOptions checkpoint;
  /// --metrics and --metrics-every.
  amp_examples::MetricsOptions metrics;
  /// Train fp32 first, then `precision`, from the same seed, and print them side by side.
  bool compare = false;
};

/// The seed's MyModel: flattens each image and applies one linear layer, an
/// amp::fp8::Float8Linear: torch::nn::Linear (same parameter, same initialisation) except inside
/// a float8 region (--precision fp8), where it multiplies in float8 with `recipe`.
struct MyModelImpl : torch::nn::Module {
  explicit MyModelImpl(const amp::fp8::Recipe& recipe)
      : fc(register_module(
            "fc", amp::fp8::Float8Linear(
                      amp::fp8::Float8LinearOptions(kImagePixels, kNumClasses).recipe(recipe)))) {}

  torch::Tensor forward(const torch::Tensor& x) { return fc(x.view({-1, kImagePixels})); }

  amp::fp8::Float8Linear fc;
};
TORCH_MODULE(MyModel);

/// The outputs of one forward pass.
struct Forward {
  torch::Tensor logits;
  torch::Tensor loss;
};

/// The forward pass of one batch, under autocast when the precision asks for it. A disabled
/// guard (fp32) still opens a region, so all precisions run the same code, as Python's
/// `autocast(enabled=...)` idiom does.
Forward forward_pass(MyModel& model, const torch::Tensor& images, const torch::Tensor& labels,
                     const Settings& settings) {
  const amp_examples::Precision& precision = settings.precision;
  amp::AutocastGuard autocast(settings.device.type, precision.autocast_dtype,
                              precision.autocast_dtype.has_value());
  amp::fp8::Float8AutocastGuard float8(precision.float8);
  torch::Tensor logits = model->forward(images);
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  return {std::move(logits), std::move(loss)};
}

/// One pass over the shuffled training set in batches (the last may be smaller, as with
/// DataLoader's default drop_last=False). Backward and the optimizer step go through `scaler`,
/// which is a pass-through unless the precision needs loss scaling (Python's
/// `GradScaler(enabled=...)` idiom), so every precision runs the same loop. The shuffle draws
/// from `shuffle`, a CPU generator, so the order is the same on every device. Each step is
/// reported to `monitor`.
/// Returns: the mean (unscaled) loss per training image.
double train_epoch(MyModel& model, torch::optim::Optimizer& optimizer, amp::GradScaler& scaler,
                   const ImageSet& train, const Settings& settings, at::Generator& shuffle,
                   amp_examples::TrainMonitor& monitor) {
  model->train();
  const torch::Tensor order =
      torch::randperm(train.size(), shuffle, torch::kInt64).to(train.labels.device());
  // Summed as a tensor so the loop never waits for a value on the host; read once at the end.
  torch::Tensor loss_sum = torch::zeros({}, train.labels.options().dtype(torch::kFloat64));
  for (std::int64_t start = 0; start < train.size(); start += settings.batch_size) {
    const torch::Tensor batch =
        order.slice(0, start, std::min(start + settings.batch_size, train.size()));
    const torch::Tensor images = train.images.index_select(0, batch);
    const torch::Tensor labels = train.labels.index_select(0, batch);

    optimizer.zero_grad();
    const torch::Tensor loss = forward_pass(model, images, labels, settings).loss;
    scaler.scale(loss).backward();
    // With LibTorch's SGD and scaling on, the loop's only host sync: step() must know on the host
    // whether any gradient overflowed before it calls (or skips) optimizer.step(). FusedSGD takes
    // the flag and skips on the device, so the loop then has no host sync per step.
    scaler.step(optimizer);
    scaler.update();
    const torch::Tensor weighted_loss = loss.detach() * batch.size(0);
    loss_sum += weighted_loss;
    monitor.after_step(weighted_loss, batch.size(0), loss_sum, scaler);
  }
  return loss_sum.item<double>() / static_cast<double>(train.size());
}

/// The settings a checkpoint must share with the run that resumes it, since each changes what
/// the remaining epochs compute. --epochs, --data's folder name and --device may differ.
std::vector<amp_examples::CheckpointSetting> checkpoint_keys(const Settings& settings,
                                                             std::int64_t train_size) {
  // The two optimizers read each other's state, but their results may differ in rounding, so a
  // run continues with the one it started with; checkpoints from before --optimizer are SGD's.
  return {{"precision", std::string(settings.precision.name)},
          {"--optimizer", std::string(settings.optimizer.name), std::string("sgd")},
          {"--fp8-recipe", settings.fp8_recipe, std::string("tensorwise")},
          {"batch-size", settings.batch_size},
          {"lr", settings.lr},
          {"seed", settings.seed},
          {"training images", train_size}};
}

/// Trains one model from the seed (or from the checkpoint) with settings.precision and prints
/// its lines: set-up, one per epoch, the fingerprint, "done" and the summary.
amp_examples::RunReport train_model(const Settings& settings, const ImageSet& train,
                                    const ImageSet& test, amp_examples::TrainMonitor& monitor,
                                    Clock::time_point start) {
  const c10::DeviceType device = settings.device.type;
  fmt::print("precision {} ({}), device {}, epochs {}, batch size {}, {}lr {}, seed {}\n",
             settings.precision.name, settings.precision.description, settings.device.name,
             settings.epochs, settings.batch_size, settings.optimizer.fused ? "FusedSGD " : "",
             settings.lr, settings.seed);
  std::fflush(stdout);
  monitor.start_run(settings.precision.name, device, settings.precision.loss_scaling);

  torch::manual_seed(static_cast<std::uint64_t>(settings.seed));
  // Initialised on the CPU from the seed and then moved, so every device starts from the same
  // weights.
  MyModel model(amp::fp8::Recipe::from_name(settings.fp8_recipe));
  model->to(device);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (settings.optimizer.fused) {
    optimizer = std::make_unique<amp::optim::FusedSGD>(model->parameters(),
                                                       amp::optim::FusedSGDOptions(settings.lr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                    torch::optim::SGDOptions(settings.lr));
  }
  amp::GradScaler scaler(
      device, amp::GradScalerOptions(settings.scaler).enabled(settings.precision.loss_scaling));
  // The shuffle draws from the default CPU generator, right after the weights' initialisation,
  // as Python's `torch.manual_seed(seed); model = ...; torch.randperm(n)` does; a checkpoint saves
  // its state so a resumed run draws the same orders.
  at::Generator shuffle = at::detail::getDefaultCPUGenerator();
  {
    // Shows autocast at work: under bf16/fp16 the linear layer computes in the low precision
    // while cross-entropy, on autocast's float32 list, still returns float32.
    torch::NoGradGuard no_grad;
    const Forward probe =
        forward_pass(model, train.images.slice(0, 0, 1), train.labels.slice(0, 0, 1), settings);
    fmt::print("forward pass: logits {}, loss {}\n", c10::toString(probe.logits.scalar_type()),
               c10::toString(probe.loss.scalar_type()));
  }

  std::int64_t epochs_done = 0;
  if (settings.checkpoint.resume) {
    amp_examples::CheckpointReader checkpoint(settings.checkpoint.path, device, "mnist_linear");
    checkpoint.check(kCheckpointFormat, checkpoint_keys(settings, train.size()));
    checkpoint.read_section("model", [&](auto& in) { model->load(in); });
    checkpoint.read_section("optimizer", [&](auto& in) { optimizer->load(in); });
    checkpoint.read_section("scaler", [&](auto& in) { in >> scaler; });
    checkpoint.read_generator("shuffle_rng_state", shuffle);
    epochs_done = checkpoint.entry("epoch").toInt();
  }
  settings.checkpoint.announce(epochs_done);
  std::fflush(stdout);

  const auto training_start = Clock::now();
  // The number of optimizer steps in one epoch.
  const std::int64_t steps = (train.size() + settings.batch_size - 1) / settings.batch_size;
  amp_examples::LossScaleNote scaling(scaler);
  // The test accuracy under the training precision.
  const auto evaluate = [&] {
    return amp_examples::test_accuracy(model, test, settings.precision, settings.device.type,
                                       kEvalChunk);
  };
  std::optional<double> accuracy;
  for (std::int64_t epoch = epochs_done + 1; epoch <= settings.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    monitor.start_epoch(epoch, settings.epochs, steps, train.labels.device());
    const double loss = train_epoch(model, *optimizer, scaler, train, settings, shuffle, monitor);
    monitor.end_training();
    accuracy = evaluate();
    monitor.end_epoch(loss, *accuracy, scaler);
    const std::string scale_note = scaling.next(scaler, steps);
    if (!settings.checkpoint.path.empty()) {
      // Model, optimizer, scaler, finished epochs and the shuffle generator's state.
      torch::serialize::OutputArchive archive;
      amp_examples::write_section(archive, "model", [&](auto& out) { model->save(out); });
      amp_examples::write_section(archive, "optimizer", [&](auto& out) { optimizer->save(out); });
      amp_examples::write_section(archive, "scaler", [&](auto& out) { out << scaler; });
      archive.write("format", c10::IValue(kCheckpointFormat));
      archive.write("epoch", c10::IValue(epoch));
      amp_examples::write_generator(archive, "shuffle_rng_state", shuffle);
      amp_examples::write_settings(archive, checkpoint_keys(settings, train.size()));
      amp_examples::save_checkpoint(archive, settings.checkpoint.path);
    }
    monitor.clear_progress();
    fmt::print("epoch {}/{}: mean train loss {:.6f}, test accuracy {:.2f}%{}, {:.2f} s\n", epoch,
               settings.epochs, loss, 100 * *accuracy, scale_note, seconds_since(epoch_start));
    std::fflush(stdout);
  }
  // A resumed run with no epochs left still reports the model it holds.
  if (!accuracy) accuracy = evaluate();
  const amp_examples::RunReport report = monitor.end_run(*accuracy, scaler);
  amp_examples::print_done(model->parameters(), settings.precision.name, *accuracy, training_start,
                           start);
  amp_examples::print_summary(report);
  std::fflush(stdout);
  return report;
}

void run(const Settings& settings) {
  amp_examples::require_device(settings.device);
  settings.checkpoint.require_file();
  // Opened before the data is loaded, so that a bad path fails at once. The progress line is
  // drawn on a terminal only: in a pipe or a file, "\r" updates would be noise.
  amp_examples::TrainMonitor monitor(settings.metrics, isatty(STDOUT_FILENO) == 1);
  const auto start = Clock::now();
  const auto [train, test] = amp_examples::load_image_data(
      settings.data_dir, amp_examples::Pixels::kUnitRange, settings.device.type);
  fmt::print("data: {} training and {} test images from {} ({:.2f} s)\n", train.size(), test.size(),
             settings.data_dir.string(), seconds_since(start));
  monitor.announce();
  if (!settings.compare) {
    train_model(settings, train, test, monitor, start);
    return;
  }
  // The same program twice from the same seed: only the precision differs.
  Settings reference = settings;
  reference.precision = amp_examples::kPrecisions[0];
  const amp_examples::RunReport reference_report =
      train_model(reference, train, test, monitor, start);
  fmt::print("\n");
  const amp_examples::RunReport mixed_report = train_model(settings, train, test, monitor, start);
  amp_examples::print_comparison(reference_report, mixed_report, settings.seed, settings.epochs);
}

amp_examples::CommandLine make_command_line(Settings& s) {
  amp_examples::CommandLine cli(
      "mnist_linear",
      "Trains the seed's linear classifier (Linear(784, 10), SGD, cross-entropy) on an\n"
      "MNIST-format dataset with the forward pass under amp::AutocastGuard (fp16 with\n"
      "amp::GradScaler loss scaling), and prints the mean training loss and the test\n"
      "accuracy of each epoch; --checkpoint and --resume stop and continue a run exactly.");
  amp_examples::add_data_option(cli, s.data_dir);
  cli.add_integer_option("epochs", "N", "passes over the training set", s.epochs, 1);
  cli.add_integer_option("batch-size", "N", "images per SGD step", s.batch_size, 1);
  cli.add_positive_option("lr", "RATE", "SGD learning rate", s.lr);
  cli.add_choice_option("optimizer",
                        "LibTorch's SGD, or amp::optim::FusedSGD (ATen's fused kernel)",
                        kOptimizers, s.optimizer);
  cli.add_integer_option("seed", "N", "seed of the weights' initialisation and the shuffling",
                         s.seed, 0);
  amp_examples::add_precision_option(cli, s.precision, /*float8=*/true);
  amp_examples::add_fp8_recipe_option(cli, s.fp8_recipe);
  amp_examples::add_device_option(cli, s.device);
  amp_examples::add_init_scale_option(cli, s.scaler);
  amp_examples::add_growth_interval_option(cli, s.scaler);
  s.checkpoint.add_to(cli,
                      "save model, optimizer, scaler and shuffle state to PATH after every epoch",
                      "continue the run saved in --checkpoint PATH from its last epoch");
  s.metrics.add_to(cli);
  cli.add_flag("compare",
               "train fp32 and then --precision (bf16 or fp16) from the same seed and print "
               "them side by side",
               [&] { s.compare = true; });
  return cli;
}

/// Refuses combinations of options that cannot run.
void check_options(const Settings& settings) {
  settings.checkpoint.check();
  amp_examples::check_fp8_recipe(settings.fp8_recipe, settings.precision);
  if (settings.compare && !settings.precision.autocast_dtype) {
    throw amp_examples::UsageError(
        "--compare trains fp32 against a mixed precision, so --precision fp32 leaves nothing "
        "to compare; use --precision bf16 or --precision fp16");
  }
  if (settings.compare && !settings.checkpoint.path.empty()) {
    throw amp_examples::UsageError(
        "--compare trains two models from scratch and saves no checkpoint; drop --checkpoint "
        "(and --resume), or run the precisions one at a time");
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  Settings settings;
  const amp_examples::CommandLine cli = make_command_line(settings);
  return amp_examples::run_program(
      cli, argc, argv, [&] { check_options(settings); }, [&] { run(settings); });
}
