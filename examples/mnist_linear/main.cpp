// The seed's training program in C++: Linear(784, 10) on MNIST-format images, SGD, cross-entropy,
// with the forward pass under amp::AutocastGuard, fp16 loss scaling by amp::GradScaler, and
// checkpoints that resume exactly.
#include <amp/autocast.h>
#include <amp/grad_scaler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/idx.h"

namespace {

constexpr std::int64_t kImageSide = 28;
constexpr std::int64_t kImagePixels = kImageSide * kImageSide;
constexpr std::int64_t kNumClasses = 10;
// Test images per forward pass when measuring accuracy; only bounds memory.
constexpr std::int64_t kEvalChunk = 1000;
// Written into every checkpoint; a reader refuses other versions instead of misreading them.
constexpr std::int64_t kCheckpointFormat = 1;

/// A value of --precision: how the forward pass runs.
struct Precision {
  std::string_view name;
  std::string_view description;
  /// The autocast dtype, or nullopt to run without autocast (all float32).
  std::optional<c10::ScalarType> autocast_dtype;
  /// Whether backward runs through an enabled GradScaler: float16's small exponent range lets
  /// small gradients underflow to zero unless the loss is scaled up first. bfloat16 has float32's
  /// range and needs no scaling.
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

/// The program's settings; the defaults are the seed's.
struct Settings {
  std::filesystem::path data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 5;
  std::int64_t batch_size = 64;
  double lr = 0.01;
  std::int64_t seed = 0;
  Precision precision = kPrecisions[1];  // bf16
  DeviceChoice device = kDevices[0];     // cpu
  /// The GradScaler's settings, torch.amp's defaults unless --init-scale / --growth-interval say
  /// otherwise; `enabled` is set from the precision. The counters report skipped steps per epoch.
  amp::GradScalerOptions scaler = amp::GradScalerOptions().track_counters(true);
  /// Where to save a checkpoint after every epoch; empty for none.
  std::filesystem::path checkpoint;
  /// Continue from `checkpoint` instead of starting from the seed's initialisation.
  bool resume = false;
  /// Where to write the metrics CSV; empty for none.
  std::filesystem::path metrics;
  /// Steps per metrics row (each epoch also ends with a row).
  std::int64_t metrics_every = 50;
  /// Train fp32 first, then `precision`, from the same seed, and print them side by side.
  bool compare = false;
};

/// A problem with the run's set-up that is not a data file: an unavailable device, a missing or
/// unusable checkpoint. The message says what is wrong and what to do.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The seed's MyModel: flattens each image and applies one linear layer.
struct MyModelImpl : torch::nn::Module {
  MyModelImpl() : fc(register_module("fc", torch::nn::Linear(kImagePixels, kNumClasses))) {}

  torch::Tensor forward(const torch::Tensor& x) { return fc(x.view({-1, kImagePixels})); }

  torch::nn::Linear fc;
};
TORCH_MODULE(MyModel);

/// One half of the dataset as tensors: images [N, 1, 28, 28] float32 in [0, 1], labels [N] int64.
struct Dataset {
  torch::Tensor images;
  torch::Tensor labels;

  std::int64_t size() const { return labels.size(0); }
};

/// Loads one half of the dataset onto `device` (all of it: the largest, Fashion-MNIST's training
/// set, is 188 MB as float32, and batches are then gathered where they are used).

Dataset load_dataset(const std::filesystem::path& dir, amp_examples::MnistSplit split,
                     c10::DeviceType device) {
  amp_examples::MnistData data = amp_examples::load_mnist(dir, split, kNumClasses);
  if (data.rows != kImageSide || data.cols != kImageSide) {
    throw amp_examples::DataError(
        fmt::format("{}: the images are {}x{} pixels; this model takes {}x{} images",
                    data.images_file.string(), data.rows, data.cols, kImageSide, kImageSide));
  }
  // from_blob only views the bytes; the conversions copy them into tensors that own their memory.
  const torch::Tensor pixels =
      torch::from_blob(data.images.data(), {data.count, 1, kImageSide, kImageSide}, torch::kUInt8);
  const torch::Tensor labels = torch::from_blob(data.labels.data(), {data.count}, torch::kUInt8);
  // Scaled to [0, 1] like torchvision's ToTensor, the seed's only transform.
  return {pixels.to(torch::kFloat32).div_(255).to(device), labels.to(torch::kInt64).to(device)};
}

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
  const Precision& precision = settings.precision;
  amp::AutocastGuard autocast(settings.device.type, precision.autocast_dtype,
                              precision.autocast_dtype.has_value());
  torch::Tensor logits = model->forward(images);
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  return {std::move(logits), std::move(loss)};
}

/// The number of optimizer steps in one epoch (the last batch may be smaller, as with
/// DataLoader's default drop_last=False).
std::int64_t steps_per_epoch(const Dataset& train, const Settings& settings) {
  return (train.size() + settings.batch_size - 1) / settings.batch_size;
}

/// The fraction of test images classified correctly, with the same precision as training.
double evaluate(MyModel& model, const Dataset& test, const Settings& settings) {
  model->eval();
  torch::NoGradGuard no_grad;
  const Precision& precision = settings.precision;
  amp::AutocastGuard autocast(settings.device.type, precision.autocast_dtype,
                              precision.autocast_dtype.has_value());
  torch::Tensor correct = torch::zeros({}, test.labels.options());
  for (std::int64_t start = 0; start < test.size(); start += kEvalChunk) {
    const std::int64_t end = std::min(start + kEvalChunk, test.size());
    const torch::Tensor predicted = model->forward(test.images.slice(0, start, end)).argmax(1);
    correct += predicted.eq(test.labels.slice(0, start, end)).sum();
  }
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(test.size());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The loss scale and the skipped steps so far (cumulative, a resumed run's included): 1 and 0
/// without loss scaling. Each is one read of a scaler tensor, so callers use it once per report.
struct ScalerReading {
  double scale = 1.0;
  std::int64_t skipped = 0;
  std::int64_t steps = 0;  // taken + skipped; 0 without loss scaling
};

ScalerReading read_scaler(const amp::GradScaler& scaler) {
  if (!scaler.is_enabled()) return {};
  const amp::GradScalerCounters counters = scaler.counters();
  return {scaler.get_scale(), counters.steps_skipped,
          counters.steps_taken + counters.steps_skipped};
}

/// Watches the training loop for --metrics and the progress line without a host sync per step:
/// the loss is summed on the device and read only when a row or a progress update is due.
class Monitor {
 public:
  /// Args: csv: the open --metrics file, or null for none; every: steps per metrics row;
  ///   progress: whether to draw the in-place progress line (stdout is a terminal).
  Monitor(std::ofstream* csv, std::int64_t every, bool progress)
      : csv_(csv), every_(every), progress_(progress) {}

  /// Starts a run (of one precision): steps count from `global_step`, the steps before it.
  void start_run(std::string_view precision, std::int64_t global_step) {
    precision_ = precision;
    global_step_ = global_step;
  }

  /// Starts an epoch of `steps` steps on `device`.
  void start_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t steps,
                   c10::Device device) {
    epoch_ = epoch;
    epochs_ = epochs;
    steps_ = steps;
    step_in_epoch_ = 0;
    epoch_images_ = 0;
    epoch_start_ = std::chrono::steady_clock::now();
    last_progress_ = epoch_start_;
    window_sum_ = torch::zeros({}, torch::TensorOptions(device).dtype(torch::kFloat64));
    window_images_ = 0;
    window_start_ = epoch_start_;
  }

  /// Records one optimizer step. Args: weighted_loss: the batch's mean loss times its size (a
  ///   device tensor, not read); images: the batch size; epoch_loss_sum: the epoch's running sum
  ///   of weighted_loss (read only for a progress update); scaler: read only for a metrics row.
  void after_step(const torch::Tensor& weighted_loss, std::int64_t images,
                  const torch::Tensor& epoch_loss_sum, const amp::GradScaler& scaler) {
    ++global_step_;
    ++step_in_epoch_;
    epoch_images_ += images;
    window_images_ += images;
    if (csv_ != nullptr) window_sum_ += weighted_loss;
    // The epoch's last step is reported by the epoch row instead.
    if (csv_ != nullptr && global_step_ % every_ == 0 && step_in_epoch_ < steps_) {
      write_row(close_window(), read_scaler(scaler), std::nullopt);
    }
    if (progress_) {
      const auto now = std::chrono::steady_clock::now();
      // A few updates a second are enough to watch; each costs one read of the loss sum.
      if (now - last_progress_ >= std::chrono::milliseconds(100)) {
        last_progress_ = now;
        const double loss = epoch_loss_sum.item<double>() / static_cast<double>(epoch_images_);
        fmt::print("\repoch {}/{} step {}/{}: loss {:.4f}, {:.0f} samples/s\033[K", epoch_, epochs_,
                   step_in_epoch_, steps_, loss,
                   static_cast<double>(epoch_images_) / seconds_since(epoch_start_));
        std::fflush(stdout);
      }
    }
  }

  /// Ends the epoch's training (before evaluation, which the throughput leaves out).
  void end_training() {
    if (csv_ != nullptr) pending_ = close_window();
  }

  /// Writes the epoch row: the window since the last row, the epoch's mean loss, the accuracy.
  void end_epoch(double epoch_loss, double accuracy, const amp::GradScaler& scaler) {
    if (csv_ != nullptr) {
      write_row(pending_, read_scaler(scaler), EpochResult{epoch_loss, accuracy});
    }
  }

  /// Erases the progress line so that a plain line can be printed in its place.
  void clear_progress() const {
    if (progress_) fmt::print("\r\033[K");
  }

  /// The header of the --metrics CSV.
  static constexpr std::string_view kHeader =
      "precision,epoch,step,train_loss,loss_scale,skipped_steps,samples_per_s,epoch_train_loss,"
      "test_accuracy_percent\n";

 private:
  struct Window {
    double loss = 0;
    double samples_per_s = 0;
  };
  struct EpochResult {
    double loss;
    double accuracy;
  };

  // The mean loss and throughput since the previous row (one read of the loss sum), then resets.
  Window close_window() {
    const double seconds = seconds_since(window_start_);
    const double images = static_cast<double>(window_images_);
    Window window{window_sum_.item<double>() / images, seconds > 0 ? images / seconds : 0.0};
    window_sum_.zero_();
    window_images_ = 0;
    window_start_ = std::chrono::steady_clock::now();
    return window;
  }

  void write_row(const Window& window, const ScalerReading& scaler,
                 const std::optional<EpochResult>& epoch) {
    *csv_ << fmt::format("{},{},{},{:.6f},{},{},{:.1f},", precision_, epoch_, global_step_,
                         window.loss, scaler.scale, scaler.skipped, window.samples_per_s);
    // Step rows leave the two epoch columns empty.
    *csv_ << (epoch ? fmt::format("{:.6f},{:.2f}\n", epoch->loss, 100 * epoch->accuracy) : ",\n");
    csv_->flush();
  }

  std::ofstream* csv_;
  std::int64_t every_;
  bool progress_;
  std::string_view precision_;
  std::int64_t global_step_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t epochs_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t step_in_epoch_ = 0;
  std::int64_t epoch_images_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
  std::chrono::steady_clock::time_point last_progress_;
  torch::Tensor window_sum_;
  std::int64_t window_images_ = 0;
  std::chrono::steady_clock::time_point window_start_;
  Window pending_;
};

/// One pass over the shuffled training set in batches. Backward and the optimizer step go through
/// `scaler`, which is a pass-through unless the precision needs loss scaling (Python's
/// `GradScaler(enabled=...)` idiom), so every precision runs the same loop. The shuffle draws
/// from `shuffle`, a CPU generator, so the order is the same on every device. Each step is
/// reported to `monitor`.
/// Returns: the mean (unscaled) loss per training image.
double train_epoch(MyModel& model, torch::optim::SGD& optimizer, amp::GradScaler& scaler,
                   const Dataset& train, const Settings& settings, at::Generator& shuffle,
                   Monitor& monitor) {
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
    // The loop's only host sync when scaling is on: step() must know on the host whether any
    // gradient overflowed before it calls (or skips) optimizer.step().
    scaler.step(optimizer);
    scaler.update();
    const torch::Tensor weighted_loss = loss.detach() * batch.size(0);
    loss_sum += weighted_loss;
    monitor.after_step(weighted_loss, batch.size(0), loss_sum, scaler);
  }
  monitor.end_training();
  return loss_sum.item<double>() / static_cast<double>(train.size());
}

// ---- checkpoints ----

/// The state of a CPU generator as a uint8 tensor (its Mersenne Twister state and cached normal).
torch::Tensor generator_state(at::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

/// The settings a checkpoint must share with the run that resumes it, since each changes what
/// the remaining epochs compute. --epochs, --data's folder name and --device may differ.
struct CheckpointKey {
  std::string_view option;
  c10::IValue value;
};

std::vector<CheckpointKey> checkpoint_keys(const Settings& settings, std::int64_t train_size) {
  return {{"precision", c10::IValue(std::string(settings.precision.name))},
          {"batch-size", c10::IValue(settings.batch_size)},
          {"lr", c10::IValue(settings.lr)},
          {"seed", c10::IValue(settings.seed)},
          {"training images", c10::IValue(train_size)}};
}

/// Writes model, optimizer, scaler, the number of finished epochs and the shuffle generator's
/// state to settings.checkpoint. It goes to a temporary file first and is renamed over the old
/// checkpoint, so an interruption while saving leaves the previous epoch's checkpoint intact.
void save_checkpoint(const Settings& settings, std::int64_t epochs_done, std::int64_t train_size,
                     MyModel& model, torch::optim::SGD& optimizer, const amp::GradScaler& scaler,
                     at::Generator& shuffle) {
  torch::serialize::OutputArchive model_archive;
  model->save(model_archive);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  torch::serialize::OutputArchive scaler_archive;
  scaler_archive << scaler;

  torch::serialize::OutputArchive archive;
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("scaler", scaler_archive);
  archive.write("format", c10::IValue(kCheckpointFormat));
  archive.write("epoch", c10::IValue(epochs_done));
  archive.write("shuffle_rng_state", generator_state(shuffle), /*is_buffer=*/true);
  for (const CheckpointKey& key : checkpoint_keys(settings, train_size)) {
    archive.write(std::string(key.option), key.value);
  }
  std::filesystem::path temporary = settings.checkpoint;
  temporary += ".tmp";
  archive.save_to(temporary.string());
  std::filesystem::rename(temporary, settings.checkpoint);
}

/// Reads an IValue entry of a checkpoint, refusing a file that lacks it.
c10::IValue read_entry(torch::serialize::InputArchive& archive, const std::string& key,
                       const std::filesystem::path& path) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    throw SetupError(
        fmt::format("the checkpoint '{}' has no entry '{}'; it was not written by "
                    "mnist_linear --checkpoint",
                    path.string(), key));
  }
  return value;
}

/// Restores what save_checkpoint wrote into a freshly built model, optimizer and scaler and the
/// shuffle generator, after checking that the checkpoint was written with the same settings.
/// Returns: the number of epochs the checkpoint had finished.
std::int64_t load_checkpoint(const Settings& settings, std::int64_t train_size, MyModel& model,
                             torch::optim::SGD& optimizer, amp::GradScaler& scaler,
                             at::Generator& shuffle) {
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
  const c10::IValue format = read_entry(archive, "format", path);
  if (!format.isInt() || format.toInt() != kCheckpointFormat) {
    throw SetupError(
        fmt::format("the checkpoint '{}' has format {}; this mnist_linear reads "
                    "format {} only",
                    path.string(), c10::str(format), kCheckpointFormat));
  }
  for (const CheckpointKey& key : checkpoint_keys(settings, train_size)) {
    const c10::IValue saved = read_entry(archive, std::string(key.option), path);
    if (saved != key.value) {
      throw SetupError(fmt::format(
          "the checkpoint '{}' was written with {} {} but this run has {} {}; resume with the "
          "checkpoint's settings, or start afresh without --resume",
          path.string(), key.option, c10::str(saved), key.option, c10::str(key.value)));
    }
  }

  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  model->load(model_archive);
  torch::serialize::InputArchive optimizer_archive;
  archive.read("optimizer", optimizer_archive);
  optimizer.load(optimizer_archive);
  torch::serialize::InputArchive scaler_archive;
  archive.read("scaler", scaler_archive);
  scaler_archive >> scaler;
  torch::Tensor rng_state;
  archive.read("shuffle_rng_state", rng_state, /*is_buffer=*/true);
  {
    std::lock_guard<std::mutex> lock(shuffle.mutex());
    // load_from moved every tensor to the run's device; a generator state lives on the CPU.
    shuffle.set_state(rng_state.to(torch::kCPU));
  }
  return read_entry(archive, "epoch", path).toInt();
}

/// An FNV-1a hash of the parameters' bytes in registration order: equal fingerprints mean
/// bit-identical parameters (how the tests compare a resumed run with an uninterrupted one).
std::uint64_t parameter_fingerprint(MyModel& model) {
  std::uint64_t hash = 0xcbf29ce484222325u;
  for (const torch::Tensor& parameter : model->parameters()) {
    const torch::Tensor host = parameter.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const std::uint8_t*>(host.data_ptr());
    for (std::size_t i = 0; i < host.nbytes(); ++i) {
      hash = (hash ^ bytes[i]) * 0x100000001b3u;
    }
  }
  return hash;
}

// ---- the program ----

/// What one training run reports at the end; --compare sets two of them side by side.
struct RunReport {
  std::string_view precision;
  /// The first epoch this run trained: 1, or k + 1 after resuming from epoch k.
  std::int64_t first_epoch = 1;
  /// The mean training loss and the test accuracy (a fraction) of each epoch trained.
  std::vector<double> losses;
  std::vector<double> accuracies;
  /// The final test accuracy (a fraction), also when no epoch was left to train.
  double accuracy = 0;
  /// Seconds spent in the training passes only (no evaluation, no checkpoints).
  double train_seconds = 0;
  /// Training images processed.
  std::int64_t images = 0;
  ScalerReading scaler;
};

/// The peak memory for the summary: on CUDA the caching allocator's peak of allocated bytes on
/// the training device (reset at the start of each run), else the process's maximum resident set
/// (getrusage; over the whole process, so under --compare it covers both runs so far).
std::string peak_memory(const Settings& settings) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string_view note = "max RSS";
  if (settings.device.type == c10::DeviceType::CUDA) {
    try {
      // Device 0: "cuda" without an index is the current device, which this program never
      // changes.
      const auto stats =
          c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(c10::DeviceIndex{0});
      const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      return fmt::format("{:.1f} MiB (CUDA peak allocated)",
                         static_cast<double>(stats.allocated_bytes[aggregate].peak) / kMiB);
    } catch (const c10::Error&) {
      // A LibTorch whose CUDA allocator keeps no statistics: the host figure is still worth
      // reporting, and the summary says which one it is.
      note = "max RSS; no CUDA allocator statistics";
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  // Linux reports ru_maxrss in KiB.
  return fmt::format("{:.1f} MiB ({})", static_cast<double>(usage.ru_maxrss) / 1024.0, note);
}

/// Starts the CUDA peak of peak_memory afresh, so that each --compare run reports its own.
void reset_cuda_peak(const Settings& settings) {
  if (settings.device.type != c10::DeviceType::CUDA) return;
  try {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(c10::DeviceIndex{0});
  } catch (const c10::Error&) {
    // peak_memory then falls back to the host's maximum resident set and says so.
  }
}

void check_device(const Settings& settings) {
  if (settings.device.type == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
    throw SetupError(
        "--device cuda needs a CUDA GPU, but none is available (no GPU or driver on this "
        "machine, or a LibTorch built without CUDA); run on the CPU with --device cpu");
  }
}

/// Trains one model from the seed (or from the checkpoint) with settings.precision and prints
/// its lines: set-up, one per epoch, the fingerprint, "done" and the summary.
/// Args: start: when the program started (for the total time).
RunReport train_model(const Settings& settings, const Dataset& train, const Dataset& test,
                      Monitor& monitor, std::chrono::steady_clock::time_point start) {
  const c10::DeviceType device = settings.device.type;
  fmt::print("precision {} ({}), device {}, epochs {}, batch size {}, lr {}, seed {}\n",
             settings.precision.name, settings.precision.description, settings.device.name,
             settings.epochs, settings.batch_size, settings.lr, settings.seed);
  std::fflush(stdout);
  reset_cuda_peak(settings);

  torch::manual_seed(static_cast<std::uint64_t>(settings.seed));
  // Initialised on the CPU from the seed and then moved, so every device starts from the same
  // weights.
  MyModel model;
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(settings.lr));
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
  if (settings.resume) {
    epochs_done = load_checkpoint(settings, train.size(), model, optimizer, scaler, shuffle);
    fmt::print("resumed from {} after epoch {}\n", settings.checkpoint.string(), epochs_done);
  }
  if (!settings.checkpoint.empty()) {
    fmt::print("checkpoint: saved to {} after every epoch\n", settings.checkpoint.string());
  }
  std::fflush(stdout);

  RunReport report;
  report.precision = settings.precision.name;
  report.first_epoch = epochs_done + 1;
  const auto training_start = std::chrono::steady_clock::now();
  const std::int64_t steps = steps_per_epoch(train, settings);
  monitor.start_run(settings.precision.name, epochs_done * steps);
  // Read once per epoch (one sync each), never per step.
  std::int64_t skipped_before = scaler.is_enabled() ? scaler.counters().steps_skipped : 0;
  std::optional<double> accuracy;
  for (std::int64_t epoch = epochs_done + 1; epoch <= settings.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    monitor.start_epoch(epoch, settings.epochs, steps, train.labels.device());
    const double loss = train_epoch(model, optimizer, scaler, train, settings, shuffle, monitor);
    report.train_seconds += seconds_since(epoch_start);
    report.images += train.size();
    accuracy = evaluate(model, test, settings);
    monitor.end_epoch(loss, *accuracy, scaler);
    report.losses.push_back(loss);
    report.accuracies.push_back(*accuracy);
    std::string scaling;
    if (scaler.is_enabled()) {
      const std::int64_t skipped = scaler.counters().steps_skipped;
      scaling = fmt::format(", loss scale {}, skipped steps {} of {}", scaler.get_scale(),
                            skipped - skipped_before, steps);
      skipped_before = skipped;
    }
    if (!settings.checkpoint.empty()) {
      save_checkpoint(settings, epoch, train.size(), model, optimizer, scaler, shuffle);
    }
    monitor.clear_progress();
    fmt::print("epoch {}/{}: mean train loss {:.6f}, test accuracy {:.2f}%{}, {:.2f} s\n", epoch,
               settings.epochs, loss, 100 * *accuracy, scaling, seconds_since(epoch_start));
    std::fflush(stdout);
  }
  // A resumed run with no epochs left still reports the model it holds.
  if (!accuracy) accuracy = evaluate(model, test, settings);
  report.accuracy = *accuracy;
  report.scaler = read_scaler(scaler);
  fmt::print("parameters: fingerprint {:016x}\n", parameter_fingerprint(model));
  fmt::print("done: precision {}, test accuracy {:.2f}%, training {:.2f} s, total {:.2f} s\n",
             settings.precision.name, 100 * *accuracy, seconds_since(training_start),
             seconds_since(start));

  const std::string final_loss = report.losses.empty()
                                     ? "n/a (no epoch left to train)"
                                     : fmt::format("{:.6f}", report.losses.back());
  const std::string throughput =
      report.images == 0
          ? "n/a"
          : fmt::format("{:.0f}", static_cast<double>(report.images) / report.train_seconds);
  const std::string skipped =
      scaler.is_enabled()
          ? fmt::format("skipped steps {} of {}", report.scaler.skipped, report.scaler.steps)
          : std::string("skipped steps 0 (no loss scaling)");
  fmt::print(
      "summary: precision {}, test accuracy {:.2f}%, final train loss {}, {} samples/s, "
      "peak memory {}, {}\n",
      settings.precision.name, 100 * report.accuracy, final_loss, throughput, peak_memory(settings),
      skipped);
  std::fflush(stdout);
  return report;
}

/// Prints --compare's table: the fp32 run and the mixed-precision run epoch by epoch, their
/// training times and the difference of their final test accuracies.
void print_comparison(const RunReport& reference, const RunReport& mixed,
                      const Settings& settings) {
  fmt::print("\ncompare: {} vs {} (seed {}: same initial weights, same batches)\n",
             reference.precision, mixed.precision, settings.seed);
  const std::string loss_a = fmt::format("{} loss", reference.precision);
  const std::string accuracy_a = fmt::format("{} acc", reference.precision);
  const std::string loss_b = fmt::format("{} loss", mixed.precision);
  const std::string accuracy_b = fmt::format("{} acc", mixed.precision);
  fmt::print("{:<8}{:>11}{:>10}{:>13}{:>10}\n", "epoch", loss_a, accuracy_a, loss_b, accuracy_b);
  for (std::size_t i = 0; i < reference.losses.size(); ++i) {
    fmt::print(
        "{:<8}{:>11.6f}{:>9.2f}%{:>13.6f}{:>9.2f}%\n",
        fmt::format("{}/{}", reference.first_epoch + static_cast<std::int64_t>(i), settings.epochs),
        reference.losses[i], 100 * reference.accuracies[i], mixed.losses[i],
        100 * mixed.accuracies[i]);
  }
  fmt::print("{:<8}{:>19.2f} s{:>21.2f} s\n", "training", reference.train_seconds,
             mixed.train_seconds);
  fmt::print("accuracy difference ({} - {}): {:+.2f} points\n", mixed.precision,
             reference.precision, 100 * (mixed.accuracy - reference.accuracy));
}

void run(const Settings& settings) {
  check_device(settings);
  if (settings.resume && !std::filesystem::exists(settings.checkpoint)) {
    throw SetupError(
        fmt::format("--resume: there is no checkpoint at '{}'; run once without "
                    "--resume to create it",
                    settings.checkpoint.string()));
  }
  // Opened before the data is loaded, so that a bad path fails at once.
  std::ofstream csv;
  if (!settings.metrics.empty()) {
    csv.open(settings.metrics);
    if (!csv) {
      throw SetupError(
          fmt::format("cannot write the metrics file '{}': {}; name a writable path "
                      "with --metrics FILE",
                      settings.metrics.string(), std::strerror(errno)));
    }
    csv << Monitor::kHeader;
  }
  const auto start = std::chrono::steady_clock::now();
  const c10::DeviceType device = settings.device.type;
  const Dataset train = load_dataset(settings.data_dir, amp_examples::MnistSplit::kTrain, device);
  const Dataset test = load_dataset(settings.data_dir, amp_examples::MnistSplit::kTest, device);
  fmt::print("data: {} training and {} test images from {} ({:.2f} s)\n", train.size(), test.size(),
             settings.data_dir.string(), seconds_since(start));
  if (csv.is_open()) {
    fmt::print("metrics: a row every {} steps and one per epoch to {}\n", settings.metrics_every,
               settings.metrics.string());
  }
  // In place on a terminal only: in a pipe or a file, "\r" updates would be noise.
  Monitor monitor(csv.is_open() ? &csv : nullptr, settings.metrics_every,
                  isatty(STDOUT_FILENO) == 1);

  if (!settings.compare) {
    train_model(settings, train, test, monitor, start);
    return;
  }
  // The same program twice from the same seed: only the precision differs.
  Settings reference = settings;
  reference.precision = kPrecisions[0];
  const RunReport reference_report = train_model(reference, train, test, monitor, start);
  fmt::print("\n");
  const RunReport mixed_report = train_model(settings, train, test, monitor, start);
  print_comparison(reference_report, mixed_report, settings);
}

amp_examples::CommandLine make_command_line(Settings& settings) {
  using amp_examples::parse_integer;
  amp_examples::CommandLine cli(
      "mnist_linear",
      "Trains the seed's linear classifier (Linear(784, 10), SGD, cross-entropy) on an\n"
      "MNIST-format dataset with the forward pass under amp::AutocastGuard (fp16 with\n"
      "amp::GradScaler loss scaling), and prints the mean training loss and the test\n"
      "accuracy of each epoch; --checkpoint and --resume stop and continue a run exactly.");
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  cli.add_option("data", "DIR",
                 fmt::format("folder with {{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
                             "(default {})",
                             settings.data_dir.string()),
                 [&](std::string_view value) { settings.data_dir = value; });
  cli.add_option(
      "epochs", "N", fmt::format("passes over the training set (default {})", settings.epochs),
      [&](std::string_view value) { settings.epochs = parse_integer("--epochs", value, 1, kMax); });
  cli.add_option("batch-size", "N",
                 fmt::format("images per SGD step (default {})", settings.batch_size),
                 [&](std::string_view value) {
                   settings.batch_size = parse_integer("--batch-size", value, 1, kMax);
                 });
  cli.add_option("lr", "RATE", fmt::format("SGD learning rate (default {})", settings.lr),
                 [&](std::string_view value) {
                   settings.lr = amp_examples::parse_positive_number("--lr", value);
                 });
  cli.add_option(
      "seed", "N",
      fmt::format("seed of the weights' initialisation and the shuffling (default {})",
                  settings.seed),
      [&](std::string_view value) { settings.seed = parse_integer("--seed", value, 0, kMax); });
  std::vector<std::string_view> names;
  for (const Precision& precision : kPrecisions) names.push_back(precision.name);
  cli.add_option("precision", fmt::format("{{{}}}", fmt::join(names, ",")),
                 fmt::format("forward-pass precision (default {})", settings.precision.name),
                 [&settings, names](std::string_view value) {
                   settings.precision =
                       kPrecisions[amp_examples::parse_choice("--precision", value, names)];
                 });
  std::vector<std::string_view> devices;
  for (const DeviceChoice& device : kDevices) devices.push_back(device.name);
  cli.add_option("device", fmt::format("{{{}}}", fmt::join(devices, ",")),
                 fmt::format("where to train (default {})", settings.device.name),
                 [&settings, devices](std::string_view value) {
                   settings.device =
                       kDevices[amp_examples::parse_choice("--device", value, devices)];
                 });
  cli.add_option(
      "init-scale", "S",
      fmt::format("fp16: GradScaler's initial loss scale (default {})",
                  settings.scaler.init_scale()),
      [&](std::string_view value) {
        settings.scaler.init_scale(amp_examples::parse_positive_number("--init-scale", value));
      });
  cli.add_option(
      "growth-interval", "N",
      fmt::format("fp16: clean steps before the loss scale doubles (default {})",
                  settings.scaler.growth_interval()),
      [&](std::string_view value) {
        settings.scaler.growth_interval(parse_integer("--growth-interval", value, 1, kMax));
      });
  cli.add_option("checkpoint", "PATH",
                 "save model, optimizer, scaler and shuffle state to PATH after every epoch",
                 [&](std::string_view value) { settings.checkpoint = value; });
  cli.add_flag("resume", "continue the run saved in --checkpoint PATH from its last epoch",
               [&] { settings.resume = true; });
  cli.add_option("metrics", "FILE",
                 "write a CSV row of loss, loss scale, skipped steps and samples/s every "
                 "--metrics-every steps, and one with the test accuracy per epoch",
                 [&](std::string_view value) { settings.metrics = value; });
  cli.add_option("metrics-every", "N",
                 fmt::format("steps per --metrics row (default {})", settings.metrics_every),
                 [&](std::string_view value) {
                   settings.metrics_every = parse_integer("--metrics-every", value, 1, kMax);
                 });
  cli.add_flag("compare",
               "train fp32 and then --precision (bf16 or fp16) from the same seed and print "
               "them side by side",
               [&] { settings.compare = true; });
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
    if (settings.compare && !settings.precision.autocast_dtype) {
      throw amp_examples::UsageError(
          "--compare trains fp32 against a mixed precision, so --precision fp32 leaves nothing "
          "to compare; use --precision bf16 or --precision fp16");
    }
    if (settings.compare && !settings.checkpoint.empty()) {
      throw amp_examples::UsageError(
          "--compare trains two models from scratch and saves no checkpoint; drop --checkpoint "
          "(and --resume), or run the precisions one at a time");
    }
  } catch (const amp_examples::UsageError& error) {
    fmt::print(stderr, "mnist_linear: error: {}\n\n{}", error.what(), cli.usage());
    return amp_examples::kUsageExitCode;
  }

  try {
    run(settings);
  } catch (const amp_examples::DataError& error) {
    fmt::print(stderr,
               "mnist_linear: error: {}\n(--data DIR names a folder holding "
               "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
               "t10k-labels-idx1-ubyte, each raw or gzipped with a .gz suffix)\n",
               error.what());
    return 1;
  } catch (const SetupError& error) {
    fmt::print(stderr, "mnist_linear: error: {}\n", error.what());
    return 1;
  } catch (const c10::Error& error) {
    fmt::print(stderr, "mnist_linear: error: {}\n", error.what_without_backtrace());
    return 1;
  }
  return 0;
}
