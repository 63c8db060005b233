// mlp_fashion: a 784-512-256-10 MLP on MNIST-format data with what real training loops need,
// under amp: AdamW, gradient accumulation, clipping through GradScaler::unscale_and_clip_, a
// warmup + cosine learning-rate schedule, and a checkpoint every epoch that resumes exactly.
#include <amp/autocast.h>
#include <amp/grad_scaler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <mutex>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.h"
#include "common/idx.h"

namespace {

constexpr std::int64_t kImagePixels = 28 * 28;
constexpr std::int64_t kNumClasses = 10;
// Test images per forward pass when measuring accuracy; only bounds memory.
constexpr std::int64_t kEvalChunk = 2000;
// Written into every checkpoint; a reader refuses other versions instead of misreading them.
constexpr std::int64_t kCheckpointFormat = 1;
constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();

/// A value of --precision.
struct Precision {
  std::string_view name;
  std::string_view description;
  /// The autocast dtype, or nullopt for float32 throughout (autocast off).
  std::optional<c10::ScalarType> autocast_dtype;
  /// float16's narrow exponent range lets small gradients underflow unless the loss is scaled;
  /// bfloat16 shares float32's range and needs no scaler.
  bool loss_scaling;
};

constexpr std::array kPrecisions = {
    Precision{"fp32", "float32 throughout, autocast off", std::nullopt, false},
    Precision{"bf16", "bfloat16 autocast", c10::ScalarType::BFloat16, false},
    Precision{"fp16", "float16 autocast, GradScaler loss scaling", c10::ScalarType::Half, true},
};

/// A value of --device.
struct DeviceChoice {
  std::string_view name;
  c10::DeviceType type;
};

constexpr std::array kDevices = {
    DeviceChoice{"cpu", c10::DeviceType::CPU},
    DeviceChoice{"cuda", c10::DeviceType::CUDA},
};

/// The program's settings and their defaults.
struct Settings {
  std::filesystem::path data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 5;
  /// Images per forward/backward pass (a micro-batch).
  std::int64_t batch_size = 64;
  /// Micro-batches whose gradients are summed before each optimizer step.
  std::int64_t accumulate = 2;
  double lr = 1e-3;
  double weight_decay = 0.01;
  std::int64_t warmup_steps = 100;
  /// Largest L2 norm of all gradients together; larger gradients are scaled down to it.
  double clip = 1.0;
  std::int64_t seed = 0;
  Precision precision = kPrecisions[1];  // bf16
  DeviceChoice device = kDevices[0];     // cpu
  amp::GradScalerOptions scaler = amp::GradScalerOptions().track_counters(true);
  /// Where to save a checkpoint after every epoch; empty for none.
  std::filesystem::path checkpoint;
  bool resume = false;
  /// Stop after this epoch as if the job had been interrupted (the schedule still spans
  /// `epochs`); nullopt runs to the end.
  std::optional<std::int64_t> stop_after;
};

/// A problem with the run's set-up other than a data file (device, checkpoint); the message says
/// what is wrong and what to do.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Flatten, then Linear(784, 512), ReLU, Linear(512, 256), ReLU, Linear(256, 10).
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : hidden1(register_module("hidden1", torch::nn::Linear(kImagePixels, 512))),
        hidden2(register_module("hidden2", torch::nn::Linear(512, 256))),
        output(register_module("output", torch::nn::Linear(256, kNumClasses))) {}

  torch::Tensor forward(const torch::Tensor& images) {
    torch::Tensor x = torch::relu(hidden1(images.flatten(1)));
    x = torch::relu(hidden2(x));
    return output(x);
  }

  torch::nn::Linear hidden1, hidden2, output;
};
TORCH_MODULE(Mlp);

/// Images [N, 784] float32, standardised; labels [N] int64.
struct Split {
  torch::Tensor images;
  torch::Tensor labels;
  std::int64_t size() const { return labels.size(0); }
};

/// Pixel statistics of the training images, applied to both halves so the test set is
/// standardised the way the model saw its training data.
struct PixelStats {
  double mean;
  double std;
};

Split to_tensors(amp_examples::MnistData& data, const PixelStats& stats, c10::DeviceType device) {
  if (data.rows * data.cols != kImagePixels) {
    throw amp_examples::DataError(
        fmt::format("{}: the images are {}x{} pixels; this model takes 28x28 images",
                    data.images_file.string(), data.rows, data.cols));
  }
  // from_blob only views the vectors' bytes; to() copies into tensors that own their memory.
  torch::Tensor images =
      torch::from_blob(data.images.data(), {data.count, kImagePixels}, torch::kUInt8)
          .to(torch::kFloat32)
          .div_(255)
          .sub_(stats.mean)
          .div_(stats.std);
  torch::Tensor labels =
      torch::from_blob(data.labels.data(), {data.count}, torch::kUInt8).to(torch::kInt64);
  return {images.to(device), labels.to(device)};
}

/// Loads both halves of the dataset onto `device`.
std::pair<Split, Split> load_data(const Settings& settings) {
  using amp_examples::MnistSplit;
  amp_examples::MnistData train = amp_examples::load_mnist(settings.data_dir, MnistSplit::kTrain);
  amp_examples::MnistData test = amp_examples::load_mnist(settings.data_dir, MnistSplit::kTest);
  const torch::Tensor pixels =
      torch::from_blob(train.images.data(), {static_cast<std::int64_t>(train.images.size())},
                       torch::kUInt8)
          .to(torch::kFloat64)
          .div_(255);
  const PixelStats stats{pixels.mean().item<double>(), pixels.std().item<double>()};
  return {to_tensors(train, stats, settings.device.type),
          to_tensors(test, stats, settings.device.type)};
}

/// Linear warmup from 0 to the peak rate over `warmup` optimizer steps, then a cosine decay to 0
/// at `total` steps. Its state is the number of steps taken, saved in checkpoints so a resumed
/// run continues the curve where it stopped.
class WarmupCosine {
 public:
  WarmupCosine(double peak, std::int64_t warmup, std::int64_t total)
      : peak_(peak), warmup_(std::min(warmup, total)), total_(total) {}

  /// The rate for the step about to be taken.
  double current() const {
    if (step_ < warmup_) return peak_ * static_cast<double>(step_ + 1) / warmup_;
    const double progress = static_cast<double>(step_ - warmup_) /
                            static_cast<double>(std::max<std::int64_t>(1, total_ - warmup_));
    return 0.5 * peak_ * (1 + std::cos(std::numbers::pi * std::min(progress, 1.0)));
  }

  /// Sets every parameter group's rate to current().
  void apply(torch::optim::Optimizer& optimizer) const {
    for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
      group.options().set_lr(current());
    }
  }

  /// Moves to the next optimizer step.
  void advance() { ++step_; }

  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("step", c10::IValue(step_));
    archive.write("total", c10::IValue(total_));
  }

  /// Restores the step; a schedule of another length would bend the curve elsewhere, so it is
  /// refused.
  void load(torch::serialize::InputArchive& archive, const std::filesystem::path& path) {
    c10::IValue step, total;
    if (!archive.try_read("step", step) || !archive.try_read("total", total)) {
      throw SetupError(
          fmt::format("the checkpoint '{}' has no learning-rate schedule state", path.string()));
    }
    if (total.toInt() != total_) {
      throw SetupError(fmt::format(
          "the checkpoint '{}' follows a learning-rate schedule of {} steps but this run's "
          "has {}; resume with the --epochs the checkpoint was started with",
          path.string(), total.toInt(), total_));
    }
    step_ = step.toInt();
  }

 private:
  double peak_;
  std::int64_t warmup_;
  std::int64_t total_;
  std::int64_t step_ = 0;
};

/// Everything a run changes as it trains: what a checkpoint holds.
struct TrainingState {
  Mlp model;
  torch::optim::AdamW optimizer;
  amp::GradScaler scaler;
  WarmupCosine schedule;
  /// Draws the shuffling; a generator of its own, so nothing else consumes its numbers.
  at::Generator shuffle;
  std::int64_t epochs_done = 0;
};

/// The optimizer steps in one epoch: micro-batches grouped by `accumulate`, the last group
/// possibly shorter (nothing is dropped).
std::int64_t steps_per_epoch(std::int64_t train_size, const Settings& settings) {
  const std::int64_t micro_batches = (train_size + settings.batch_size - 1) / settings.batch_size;
  return (micro_batches + settings.accumulate - 1) / settings.accumulate;
}

/// The model's output and loss on one batch, under autocast when the precision asks for it (a
/// disabled guard for fp32, so every precision runs the same code).
std::pair<torch::Tensor, torch::Tensor> forward_loss(Mlp& model, const torch::Tensor& images,
                                                     const torch::Tensor& labels,
                                                     const Settings& settings) {
  const auto& dtype = settings.precision.autocast_dtype;
  amp::AutocastGuard autocast(settings.device.type, dtype, dtype.has_value());
  torch::Tensor logits = model->forward(images);
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  return {logits, loss};
}

/// What one epoch measured, read from device tensors once at its end.
struct EpochReport {
  double mean_loss;
  double mean_grad_norm;  ///< over the steps taken, before clipping
  std::int64_t clipped;   ///< steps whose gradient norm exceeded --clip
  std::int64_t taken;     ///< steps the scaler did not skip
};

/// One pass over the shuffled training set. Each optimizer step sums the gradients of
/// `accumulate` micro-batches, each micro-batch's loss weighted by its share of the step's
/// images, so a step sees the mean gradient of all of them, as one large batch would. The
/// scaler unscales and clips in one fused pass, then skips the step if a gradient overflowed.
EpochReport train_epoch(TrainingState& state, const Split& train, const Settings& settings) {
  state.model->train();
  const std::int64_t n = train.size();
  const torch::Tensor order =
      torch::randperm(n, state.shuffle, torch::kInt64).to(train.labels.device());
  const auto float64 = train.images.options().dtype(torch::kFloat64);
  // Device-side sums: the loop syncs only where step() must decide whether to skip.
  torch::Tensor loss_sum = torch::zeros({}, float64);
  torch::Tensor norm_sum = torch::zeros({}, float64);
  torch::Tensor clipped = torch::zeros({}, float64);
  std::int64_t taken = 0;

  const std::int64_t group_images = settings.batch_size * settings.accumulate;
  for (std::int64_t group = 0; group < n; group += group_images) {
    const std::int64_t group_end = std::min(group + group_images, n);
    for (std::int64_t start = group; start < group_end; start += settings.batch_size) {
      const std::int64_t end = std::min(start + settings.batch_size, group_end);
      const torch::Tensor index = order.slice(0, start, end);
      const torch::Tensor loss = forward_loss(state.model, train.images.index_select(0, index),
                                              train.labels.index_select(0, index), settings)
                                     .second;
      const double share = static_cast<double>(end - start) / (group_end - group);
      state.scaler.scale(loss * share).backward();
      loss_sum += loss.detach() * (end - start);
    }
    const torch::Tensor norm = state.scaler.unscale_and_clip_(state.optimizer, settings.clip);
    state.schedule.apply(state.optimizer);
    if (state.scaler.step(state.optimizer).taken) {
      ++taken;
      norm_sum += norm;
      clipped += norm.gt(settings.clip);
    }
    state.scaler.update();
    state.optimizer.zero_grad();
    // The schedule counts iterations, skipped ones included (as a Python loop calling
    // scheduler.step() every iteration does), so an fp16 run follows the same curve as fp32.
    state.schedule.advance();
  }
  return {loss_sum.item<double>() / n, taken ? norm_sum.item<double>() / taken : 0.0,
          static_cast<std::int64_t>(clipped.item<double>()), taken};
}

/// The fraction of test images classified correctly, under the training precision.
double evaluate(Mlp& model, const Split& test, const Settings& settings) {
  model->eval();
  torch::NoGradGuard no_grad;
  const auto& dtype = settings.precision.autocast_dtype;
  amp::AutocastGuard autocast(settings.device.type, dtype, dtype.has_value());
  torch::Tensor correct = torch::zeros({}, test.labels.options());
  for (std::int64_t start = 0; start < test.size(); start += kEvalChunk) {
    const std::int64_t end = std::min(start + kEvalChunk, test.size());
    correct += model->forward(test.images.slice(0, start, end))
                   .argmax(1)
                   .eq(test.labels.slice(0, start, end))
                   .sum();
  }
  return static_cast<double>(correct.item<std::int64_t>()) / test.size();
}

// ---- checkpoints ----

/// The settings a checkpoint must share with the run resuming it: each changes what the
/// remaining steps compute. (--epochs is checked through the schedule's length.)
std::vector<std::pair<std::string, c10::IValue>> resume_keys(const Settings& settings,
                                                             std::int64_t train_size) {
  return {{"precision", std::string(settings.precision.name)},
          {"batch-size", settings.batch_size},
          {"accumulate", settings.accumulate},
          {"lr", settings.lr},
          {"weight-decay", settings.weight_decay},
          {"warmup-steps", settings.warmup_steps},
          {"clip", settings.clip},
          {"seed", settings.seed},
          {"training images", train_size}};
}

/// Writes a sub-archive filled by `fill` under `key`.
template <class Fill>
void write_section(torch::serialize::OutputArchive& archive, const std::string& key, Fill fill) {
  torch::serialize::OutputArchive section;
  fill(section);
  archive.write(key, section);
}

/// Saves the whole TrainingState to settings.checkpoint through a temporary file renamed over
/// the old one, so an interruption while writing keeps the previous epoch's checkpoint.
void save_checkpoint(TrainingState& state, const Settings& settings, std::int64_t train_size) {
  torch::serialize::OutputArchive archive;
  write_section(archive, "model", [&](auto& out) { state.model->save(out); });
  write_section(archive, "optimizer", [&](auto& out) { state.optimizer.save(out); });
  write_section(archive, "scaler", [&](auto& out) { out << state.scaler; });
  write_section(archive, "schedule", [&](auto& out) { state.schedule.save(out); });
  {
    std::lock_guard<std::mutex> lock(state.shuffle.mutex());
    archive.write("shuffle", state.shuffle.get_state(), /*is_buffer=*/true);
  }
  archive.write("format", c10::IValue(kCheckpointFormat));
  archive.write("epoch", c10::IValue(state.epochs_done));
  for (const auto& [key, value] : resume_keys(settings, train_size)) archive.write(key, value);
  std::filesystem::path partial = settings.checkpoint;
  partial += ".partial";
  archive.save_to(partial.string());
  std::filesystem::rename(partial, settings.checkpoint);
}

/// Restores a TrainingState built from the same settings from settings.checkpoint.
void load_checkpoint(TrainingState& state, const Settings& settings, std::int64_t train_size) {
  const std::filesystem::path& path = settings.checkpoint;
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path.string(), c10::Device(settings.device.type));
  } catch (const c10::Error& error) {
    throw SetupError(
        fmt::format("cannot read the checkpoint '{}' (damaged, truncated or not a "
                    "checkpoint): {}",
                    path.string(), error.what_without_backtrace()));
  }
  const auto entry = [&](const std::string& key) {
    c10::IValue value;
    if (!archive.try_read(key, value)) {
      throw SetupError(
          fmt::format("the checkpoint '{}' has no entry '{}'; it was not written by mlp_fashion",
                      path.string(), key));
    }
    return value;
  };
  if (entry("format") != c10::IValue(kCheckpointFormat)) {
    throw SetupError(
        fmt::format("the checkpoint '{}' has format {}; this mlp_fashion reads format {}",
                    path.string(), c10::str(entry("format")), kCheckpointFormat));
  }
  for (const auto& [key, value] : resume_keys(settings, train_size)) {
    const c10::IValue saved = entry(key);
    if (saved != value) {
      throw SetupError(fmt::format(
          "the checkpoint '{}' was written with {} {} but this run has {} {}; resume with the "
          "checkpoint's settings, or start afresh without --resume",
          path.string(), key, c10::str(saved), key, c10::str(value)));
    }
  }
  torch::serialize::InputArchive schedule, model, optimizer, scaler;
  archive.read("schedule", schedule);
  state.schedule.load(schedule, path);
  archive.read("model", model);
  state.model->load(model);
  archive.read("optimizer", optimizer);
  state.optimizer.load(optimizer);
  archive.read("scaler", scaler);
  scaler >> state.scaler;
  torch::Tensor shuffle_state;
  archive.read("shuffle", shuffle_state, /*is_buffer=*/true);
  {
    std::lock_guard<std::mutex> lock(state.shuffle.mutex());
    // load_from moved every tensor to the run's device; a CPU generator's state lives on the CPU.
    state.shuffle.set_state(shuffle_state.to(torch::kCPU));
  }
  state.epochs_done = entry("epoch").toInt();
}

/// An FNV-1a hash of the parameters' bytes: equal fingerprints mean bit-identical parameters
/// (how the tests compare a resumed run with an uninterrupted one).
std::uint64_t fingerprint(Mlp& model) {
  std::uint64_t hash = 0xcbf29ce484222325u;
  for (const torch::Tensor& parameter : model->parameters()) {
    const torch::Tensor host = parameter.detach().to(torch::kCPU).contiguous();
    const auto* byte = static_cast<const std::uint8_t*>(host.data_ptr());
    for (const auto* end = byte + host.nbytes(); byte != end; ++byte) {
      hash = (hash ^ *byte) * 0x100000001b3u;
    }
  }
  return hash;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- the program ----

void run(const Settings& settings) {
  if (settings.device.type == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
    throw SetupError(
        "--device cuda needs a CUDA GPU, but none is available (no GPU or driver on this "
        "machine, or a LibTorch built without CUDA); run on the CPU with --device cpu");
  }
  if (settings.resume && !std::filesystem::exists(settings.checkpoint)) {
    throw SetupError(fmt::format(
        "--resume: there is no checkpoint at '{}'; run once without --resume to create it",
        settings.checkpoint.string()));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto [train, test] = load_data(settings);
  fmt::print("data: {} training and {} test images from {} ({:.2f} s)\n", train.size(), test.size(),
             settings.data_dir.string(), seconds_since(start));
  const std::int64_t steps = steps_per_epoch(train.size(), settings);
  fmt::print(
      "precision {} ({}), device {}, epochs {}, batch size {} x {} accumulated, {} steps per "
      "epoch\nAdamW lr {} (warmup {} steps, cosine to 0), weight decay {}, clip norm {}, seed {}\n",
      settings.precision.name, settings.precision.description, settings.device.name,
      settings.epochs, settings.batch_size, settings.accumulate, steps, settings.lr,
      settings.warmup_steps, settings.weight_decay, settings.clip, settings.seed);

  // The weights come from the seeded default generator on the CPU, then move, so every device
  // starts from the same model.
  torch::manual_seed(static_cast<std::uint64_t>(settings.seed));
  Mlp model;
  model->to(settings.device.type);
  TrainingState state{
      model,
      torch::optim::AdamW(
          model->parameters(),
          torch::optim::AdamWOptions(settings.lr).weight_decay(settings.weight_decay)),
      amp::GradScaler(
          settings.device.type,
          amp::GradScalerOptions(settings.scaler).enabled(settings.precision.loss_scaling)),
      WarmupCosine(settings.lr, settings.warmup_steps, settings.epochs * steps),
      at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(settings.seed)),
  };
  std::int64_t parameter_count = 0;
  for (const torch::Tensor& parameter : model->parameters()) parameter_count += parameter.numel();
  fmt::print("model: MLP 784-512-256-10 with ReLU, {} parameters\n", parameter_count);
  {
    torch::NoGradGuard no_grad;
    const auto [logits, loss] =
        forward_loss(model, train.images.slice(0, 0, 2), train.labels.slice(0, 0, 2), settings);
    fmt::print("forward pass: logits {}, loss {}\n", c10::toString(logits.scalar_type()),
               c10::toString(loss.scalar_type()));
  }
  if (settings.resume) {
    load_checkpoint(state, settings, train.size());
    fmt::print("resumed from {} after epoch {}\n", settings.checkpoint.string(), state.epochs_done);
  }
  if (!settings.checkpoint.empty()) {
    fmt::print("checkpoint: saved to {} after every epoch\n", settings.checkpoint.string());
  }
  std::fflush(stdout);

  const auto training_start = std::chrono::steady_clock::now();
  const std::int64_t last = std::min(settings.epochs, settings.stop_after.value_or(kMaxInt));
  std::int64_t skipped_before = state.scaler.counters().steps_skipped;
  std::optional<double> accuracy;
  while (state.epochs_done < last) {
    const auto epoch_start = std::chrono::steady_clock::now();
    const EpochReport report = train_epoch(state, train, settings);
    ++state.epochs_done;
    accuracy = evaluate(state.model, test, settings);
    std::string scaling;
    if (state.scaler.is_enabled()) {
      const std::int64_t skipped = state.scaler.counters().steps_skipped;
      scaling = fmt::format(", loss scale {}, skipped steps {} of {}", state.scaler.get_scale(),
                            skipped - skipped_before, steps);
      skipped_before = skipped;
    }
    if (!settings.checkpoint.empty()) save_checkpoint(state, settings, train.size());
    fmt::print(
        "epoch {}/{}: mean train loss {:.6f}, test accuracy {:.2f}%, grad norm {:.4f} (clipped "
        "{} of {} steps), next lr {:.6g}{}, {:.2f} s\n",
        state.epochs_done, settings.epochs, report.mean_loss, 100 * *accuracy,
        report.mean_grad_norm, report.clipped, report.taken, state.schedule.current(), scaling,
        seconds_since(epoch_start));
    std::fflush(stdout);
  }
  if (!accuracy) accuracy = evaluate(state.model, test, settings);
  if (state.epochs_done < settings.epochs) {
    fmt::print("stopped after epoch {} of {} (--stop-after); continue with --resume\n",
               state.epochs_done, settings.epochs);
  }
  fmt::print("parameters: fingerprint {:016x}\n", fingerprint(state.model));
  fmt::print("done: precision {}, test accuracy {:.2f}%, training {:.2f} s, total {:.2f} s\n",
             settings.precision.name, 100 * *accuracy, seconds_since(training_start),
             seconds_since(start));
}

/// Registers an option whose value is one of `choices` (matched by their `name`).
template <class Choice, std::size_t N>
void add_choice(amp_examples::CommandLine& cli, const std::string& name,
                const std::array<Choice, N>& choices, Choice& target, const std::string& help) {
  std::vector<std::string_view> names;
  for (const Choice& choice : choices) names.push_back(choice.name);
  cli.add_option(name, fmt::format("{{{}}}", fmt::join(names, ",")),
                 fmt::format("{} (default {})", help, target.name),
                 [&choices, &target, names, option = "--" + name](std::string_view value) {
                   target = choices[amp_examples::parse_choice(option, value, names)];
                 });
}

amp_examples::CommandLine make_command_line(Settings& s) {
  using amp_examples::parse_integer;
  using amp_examples::parse_positive_number;
  amp_examples::CommandLine cli(
      "mlp_fashion",
      "Trains an MLP (784-512-256-10, ReLU) on an MNIST-format dataset with AdamW, gradient\n"
      "accumulation, gradient clipping through amp::GradScaler::unscale_and_clip_, a warmup +\n"
      "cosine learning-rate schedule and a checkpoint every epoch (--resume continues exactly),\n"
      "with the forward pass under amp::AutocastGuard (fp16 with GradScaler loss scaling).");
  cli.add_option("data", "DIR",
                 fmt::format("folder with {{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
                             "(default {})",
                             s.data_dir.string()),
                 [&](std::string_view v) { s.data_dir = v; });
  cli.add_option("epochs", "N", fmt::format("passes over the training set (default {})", s.epochs),
                 [&](std::string_view v) { s.epochs = parse_integer("--epochs", v, 1, kMaxInt); });
  cli.add_option(
      "batch-size", "N", fmt::format("images per forward/backward pass (default {})", s.batch_size),
      [&](std::string_view v) { s.batch_size = parse_integer("--batch-size", v, 1, kMaxInt); });
  cli.add_option(
      "accumulate", "N", fmt::format("micro-batches per optimizer step (default {})", s.accumulate),
      [&](std::string_view v) { s.accumulate = parse_integer("--accumulate", v, 1, kMaxInt); });
  cli.add_option("lr", "RATE", fmt::format("AdamW's peak learning rate (default {})", s.lr),
                 [&](std::string_view v) { s.lr = parse_positive_number("--lr", v); });
  cli.add_option(
      "weight-decay", "W",
      fmt::format("AdamW's decoupled weight decay (default {})", s.weight_decay),
      [&](std::string_view v) { s.weight_decay = parse_positive_number("--weight-decay", v); });
  cli.add_option(
      "warmup-steps", "N",
      fmt::format("steps of linear learning-rate warmup (default {})", s.warmup_steps),
      [&](std::string_view v) { s.warmup_steps = parse_integer("--warmup-steps", v, 0, kMaxInt); });
  cli.add_option("clip", "NORM",
                 fmt::format("largest gradient L2 norm per step (default {})", s.clip),
                 [&](std::string_view v) { s.clip = parse_positive_number("--clip", v); });
  cli.add_option("seed", "N",
                 fmt::format("seed of the initialisation and the shuffling (default {})", s.seed),
                 [&](std::string_view v) { s.seed = parse_integer("--seed", v, 0, kMaxInt); });
  add_choice(cli, "precision", kPrecisions, s.precision, "forward-pass precision");
  add_choice(cli, "device", kDevices, s.device, "where to train");
  cli.add_option(
      "init-scale", "S",
      fmt::format("fp16: GradScaler's initial loss scale (default {})", s.scaler.init_scale()),
      [&](std::string_view v) { s.scaler.init_scale(parse_positive_number("--init-scale", v)); });
  cli.add_option("checkpoint", "PATH",
                 "save model, optimizer, scaler, schedule and shuffle state after every epoch",
                 [&](std::string_view v) { s.checkpoint = v; });
  cli.add_flag("resume", "continue the run saved in --checkpoint PATH", [&] { s.resume = true; });
  cli.add_option(
      "stop-after", "N", "stop after epoch N as if interrupted (the schedule still spans --epochs)",
      [&](std::string_view v) { s.stop_after = parse_integer("--stop-after", v, 1, kMaxInt); });
  return cli;
}

}  // namespace

int main(int argc, char* argv[]) {
  Settings settings;
  const amp_examples::CommandLine cli = make_command_line(settings);
  try {
    if (!cli.parse(argc, argv)) {
      fmt::print("{}", cli.usage());
      return 0;
    }
    if (settings.resume && settings.checkpoint.empty()) {
      throw amp_examples::UsageError(
          "--resume continues from a checkpoint; name it with --checkpoint PATH");
    }
  } catch (const amp_examples::UsageError& error) {
    fmt::print(stderr, "mlp_fashion: error: {}\n\n{}", error.what(), cli.usage());
    return amp_examples::kUsageExitCode;
  }
  try {
    run(settings);
  } catch (const amp_examples::DataError& error) {
    fmt::print(
        stderr,
        "mlp_fashion: error: {}\n(--data DIR names a folder holding train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each "
        "raw or gzipped with a .gz suffix)\n",
        error.what());
    return 1;
  } catch (const SetupError& error) {
    fmt::print(stderr, "mlp_fashion: error: {}\n", error.what());
    return 1;
  } catch (const c10::Error& error) {
    fmt::print(stderr, "mlp_fashion: error: {}\n", error.what_without_backtrace());
    return 1;
  }
  return 0;
}
