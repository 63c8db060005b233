// mlp_fashion: a 784-512-256-10 MLP on MNIST-format data with what real training loops need,
// under amp: AdamW (amp's fused one, or Python's unfused arithmetic), gradient accumulation,
// clipping through GradScaler::unscale_and_clip_, a warmup + cosine learning-rate schedule, and a
// checkpoint every epoch that resumes exactly (also as, and from, train.py's Python checkpoint).
#include <amp/autocast.h>
#include <amp/checkpoint.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/low_precision.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/cli.h"
#include "common/evaluate.h"
#include "common/mnist_tensors.h"
#include "common/precision.h"
#include "common/program.h"
#include "common/train_monitor.h"
#include "common/training_state.h"
#include "warmup_cosine.h"

namespace {

using amp_examples::Clock;
using amp_examples::ImageSet;
using amp_examples::kImagePixels;
using amp_examples::kNumClasses;
using amp_examples::seconds_since;

// Test images per forward pass when measuring accuracy; only bounds memory.
constexpr std::int64_t kEvalChunk = 2000;
// Written into every checkpoint; a reader refuses other versions instead of misreading them.
constexpr std::int64_t kCheckpointFormat = 1;

/// A value of --optimizer: the same AdamW update as Python's unfused AdamW computes it
/// (amp::optim::AdamW, LibTorch's class with Python's op sequence, so a run moves to train.py
/// and back bit for bit), or over ATen's fused kernel (one kernel per step instead of a chain of
/// small ops per parameter; with fp16 it also unscales the gradients and skips an overflowing
/// step on the device).
struct OptimizerChoice {
  std::string_view name;
  /// How the settings line names it.
  std::string_view label;
  bool fused;
};

constexpr std::array kOptimizers = {
    OptimizerChoice{"adamw", "AdamW", false},
    OptimizerChoice{"fused-adamw", "FusedAdamW", true},
};

/// A value of --weights: the dtype the model's parameters are held in.
struct WeightsChoice {
  std::string_view name;
  bool bf16;
};

constexpr std::array kWeights = {WeightsChoice{"fp32", false}, WeightsChoice{"bf16", true}};

/// A value of --low-precision: how FusedAdamW keeps the updates bf16 weights would lose
/// (amp::optim's master_weights, kahan_summation, stochastic_rounding; none: plain bf16).
struct LowPrecisionChoice {
  std::string_view name;
  std::string_view label;
};

constexpr std::array kLowPrecision = {
    LowPrecisionChoice{"none", "plain bf16"},
    LowPrecisionChoice{"master", "fp32 master weights"},
    LowPrecisionChoice{"kahan", "Kahan summation"},
    LowPrecisionChoice{"sr", "stochastic rounding"},
};

/// A value of --state-dtype: the dtype of FusedAdamW's moments under --low-precision.
struct StateDtypeChoice {
  std::string_view name;
  c10::ScalarType dtype;
};

constexpr std::array kStateDtypes = {StateDtypeChoice{"fp32", c10::kFloat},
                                     StateDtypeChoice{"bf16", c10::kBFloat16}};

/// A value of --checkpoint-format: LibTorch's archive (amp's own sections), or the dict a Python
/// AMP loop writes with torch.save (train.py, this loop in Python, reads and writes it).
struct CheckpointFormatChoice {
  std::string_view name;
  bool python;
};

constexpr std::array kCheckpointFormats = {CheckpointFormatChoice{"libtorch", false},
                                           CheckpointFormatChoice{"python", true}};

/// The program's settings and their defaults.
struct Settings {
  std::filesystem::path data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 5;
  /// Images per forward/backward pass (a micro-batch).
  std::int64_t batch_size = 64;
  /// Micro-batches whose gradients are summed before each optimizer step.
  std::int64_t accumulate = 2;
  // The fused one: as accurate as AdamW in every precision (examples/mlp_fashion/README.md) and
  // with the scaler it never synchronises in a step.
  OptimizerChoice optimizer = kOptimizers[1];           // fused-adamw
  WeightsChoice weights = kWeights[0];                  // fp32
  LowPrecisionChoice low_precision = kLowPrecision[0];  // none (only with --weights bf16)
  StateDtypeChoice state_dtype = kStateDtypes[0];       // fp32, the library's default
  double lr = 1e-3;
  double weight_decay = 0.01;
  std::int64_t warmup_steps = 100;
  /// Largest L2 norm of all gradients together; larger gradients are scaled down to it.
  double clip = 1.0;
  std::int64_t seed = 0;
  amp_examples::Precision precision = amp_examples::kPrecisions[1];  // bf16
  /// --fp8-recipe: the float8 recipe of --precision fp8.
  std::string fp8_recipe = "tensorwise";
  amp_examples::DeviceChoice device = amp_examples::kDevices[0];  // cpu
  amp::GradScalerOptions scaler = amp::GradScalerOptions().track_counters(true);
  /// --checkpoint and --resume.
  amp_examples::CheckpointOptions checkpoint;
  CheckpointFormatChoice checkpoint_format = kCheckpointFormats[0];  // libtorch
  /// Stop after this epoch as if the job had been interrupted (the schedule still spans
  /// `epochs`); nullopt runs to the end.
  std::optional<std::int64_t> stop_after;
  /// --recompute-activations: the hidden layers under amp::checkpoint.
  bool recompute_activations = false;
};

/// Flatten, then Linear(784, 512), ReLU, Linear(512, 256), ReLU, Linear(256, 10).
/// The layers are amp::fp8::Float8Linear: torch::nn::Linear (same parameters, same initialisation)
/// outside a float8 region, float8 GEMMs with `recipe` inside one (--precision fp8). With
/// `recompute_activations` each hidden layer + ReLU runs under amp::checkpoint: its activations
/// are rebuilt in backward instead of kept, and training computes exactly the same numbers.
struct MlpImpl : torch::nn::Module {
  MlpImpl(const amp::fp8::Recipe& recipe, bool recompute_activations)
      : hidden1(register_module("hidden1", layer(kImagePixels, 512, recipe))),
        hidden2(register_module("hidden2", layer(512, 256, recipe))),
        output(register_module("output", layer(256, kNumClasses, recipe))),
        recompute(recompute_activations) {}

  static amp::fp8::Float8Linear layer(std::int64_t in, std::int64_t out,
                                      const amp::fp8::Recipe& recipe) {
    return amp::fp8::Float8Linear(amp::fp8::Float8LinearOptions(in, out).recipe(recipe));
  }

  torch::Tensor forward(const torch::Tensor& images) {
    // The lambdas capture the module, which outlives every backward of its outputs.
    const auto block1 = [this](const torch::Tensor& x) { return torch::relu(hidden1(x)); };
    const auto block2 = [this](const torch::Tensor& x) { return torch::relu(hidden2(x)); };
    torch::Tensor x = images.flatten(1);
    x = recompute ? amp::checkpoint(block1, x) : block1(x);
    x = recompute ? amp::checkpoint(block2, x) : block2(x);
    return output(x);
  }

  amp::fp8::Float8Linear hidden1, hidden2, output;
  bool recompute;
};
TORCH_MODULE(Mlp);

/// Everything a run changes as it trains: what a checkpoint holds.
struct TrainingState {
  Mlp model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
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
/// disabled guard for fp32, so every precision runs the same code). With fp8, `weight_casts`
/// says whether the layers cast their weights afresh, keep the casts or reuse kept ones.
std::pair<torch::Tensor, torch::Tensor> forward_loss(
    Mlp& model, const torch::Tensor& images, const torch::Tensor& labels, const Settings& settings,
    amp::fp8::WeightCasts weight_casts = amp::fp8::WeightCasts::fresh) {
  const auto& dtype = settings.precision.autocast_dtype;
  amp::AutocastGuard autocast(settings.device.type, dtype, dtype.has_value());
  amp::fp8::Float8AutocastGuard float8(settings.precision.float8, weight_casts);
  torch::Tensor logits = model->forward(images);
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  return {logits, loss};
}

/// The optimizer --optimizer names, over `parameters`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> parameters,
                                                        const Settings& settings) {
  if (settings.optimizer.fused) {
    const std::string_view mode = settings.low_precision.name;
    return std::make_unique<amp::optim::FusedAdamW>(
        std::move(parameters),
        amp::optim::FusedAdamWOptions(settings.lr)
            .weight_decay(settings.weight_decay)
            .master_weights(mode == "master")
            .kahan_summation(mode == "kahan")
            .stochastic_rounding(mode == "sr")
            .state_dtype(mode == "none" ? std::nullopt : std::optional(settings.state_dtype.dtype))
            .rounding_seed(settings.seed));
  }
  return std::make_unique<amp::optim::AdamW>(
      std::move(parameters),
      torch::optim::AdamWOptions(settings.lr).weight_decay(settings.weight_decay));
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
/// Which steps were skipped is summed from the scaler's flag on the device, never read per step:
/// with FusedAdamW the decision stays on the device, and a read would stall every step.
EpochReport train_epoch(TrainingState& state, const ImageSet& train, const Settings& settings) {
  state.model->train();
  const std::int64_t n = train.size();
  const torch::Tensor order =
      torch::randperm(n, state.shuffle, torch::kInt64).to(train.labels.device());
  const auto float64 = train.images.options().dtype(torch::kFloat64);
  // Device-side sums, read once at the end of the epoch. With amp::optim::AdamW, step() itself
  // still reads the overflow flag to decide whether to call the optimizer; with FusedAdamW the
  // loop has no host sync at all.
  torch::Tensor loss_sum = torch::zeros({}, float64);
  torch::Tensor norm_sum = torch::zeros({}, float64);
  torch::Tensor clipped = torch::zeros({}, float64);
  torch::Tensor skipped = torch::zeros({}, float64);
  std::int64_t steps = 0;

  const std::int64_t group_images = settings.batch_size * settings.accumulate;
  for (std::int64_t group = 0; group < n; group += group_images) {
    const std::int64_t group_end = std::min(group + group_images, n);
    for (std::int64_t start = group; start < group_end; start += settings.batch_size) {
      const std::int64_t end = std::min(start + settings.batch_size, group_end);
      const torch::Tensor index = order.slice(0, start, end);
      // The weights change only at the step: with fp8 the group's first micro-batch casts them
      // and keeps the casts, the others reuse them (the same bits, once per step).
      const auto weight_casts = settings.accumulate == 1 ? amp::fp8::WeightCasts::fresh
                                : start == group         ? amp::fp8::WeightCasts::keep
                                                         : amp::fp8::WeightCasts::reuse;
      const torch::Tensor loss =
          forward_loss(state.model, train.images.index_select(0, index),
                       train.labels.index_select(0, index), settings, weight_casts)
              .second;
      const double share = static_cast<double>(end - start) / (group_end - group);
      state.scaler.scale(loss * share).backward();
      loss_sum += loss.detach() * (end - start);
    }
    torch::optim::Optimizer& optimizer = *state.optimizer;
    const torch::Tensor norm = state.scaler.unscale_and_clip_(optimizer, settings.clip);
    state.schedule.apply(optimizer);
    const amp::StepResult result = state.scaler.step(optimizer);
    ++steps;
    // found_inf: 1 for a skipped step; undefined when the scaler is disabled (no step skipped).
    if (result.found_inf.defined()) {
      const torch::Tensor taken = result.found_inf.eq(0);
      skipped += result.found_inf;
      // A skipped step's norm is inf or NaN: where() keeps it out of the sum.
      norm_sum += torch::where(taken, norm, 0.0);
      clipped += norm.gt(settings.clip).logical_and(taken);
    } else {
      norm_sum += norm;
      clipped += norm.gt(settings.clip);
    }
    state.scaler.update();
    optimizer.zero_grad();
    // The schedule counts iterations, skipped ones included (as a Python loop calling
    // scheduler.step() every iteration does), so an fp16 run follows the same curve as fp32.
    state.schedule.advance();
  }
  const std::int64_t taken = steps - static_cast<std::int64_t>(skipped.item<double>());
  return {loss_sum.item<double>() / n, taken ? norm_sum.item<double>() / taken : 0.0,
          static_cast<std::int64_t>(clipped.item<double>()), taken};
}

// ---- checkpoints ----

/// The settings a checkpoint must share with the run resuming it: each changes what the
/// remaining steps compute. (--epochs is checked through the schedule's length.) The two
/// optimizers read each other's state, but their results differ in rounding, so a run continues
/// with the one it started with; checkpoints from before --optimizer are AdamW's.
std::vector<amp_examples::CheckpointSetting> resume_keys(const Settings& settings,
                                                         std::int64_t train_size) {
  return {{"precision", std::string(settings.precision.name)},
          {"--optimizer", std::string(settings.optimizer.name), std::string("adamw")},
          {"--weights", std::string(settings.weights.name), std::string("fp32")},
          {"--low-precision", std::string(settings.low_precision.name), std::string("none")},
          {"--state-dtype", std::string(settings.state_dtype.name), std::string("fp32")},
          {"--fp8-recipe", settings.fp8_recipe, std::string("tensorwise")},
          {"batch-size", settings.batch_size},
          {"accumulate", settings.accumulate},
          {"lr", settings.lr},
          {"weight-decay", settings.weight_decay},
          {"warmup-steps", settings.warmup_steps},
          {"clip", settings.clip},
          {"seed", settings.seed},
          {"training images", train_size}};
}

void save_checkpoint(TrainingState& state, const Settings& settings, std::int64_t train_size) {
  torch::serialize::OutputArchive archive;
  amp_examples::write_section(archive, "model", [&](auto& out) { state.model->save(out); });
  amp_examples::write_section(archive, "optimizer", [&](auto& out) { state.optimizer->save(out); });
  amp_examples::write_section(archive, "scaler", [&](auto& out) { out << state.scaler; });
  amp_examples::write_section(archive, "schedule", [&](auto& out) { state.schedule.save(out); });
  amp_examples::write_generator(archive, "shuffle", state.shuffle);
  archive.write("format", c10::IValue(kCheckpointFormat));
  archive.write("epoch", c10::IValue(state.epochs_done));
  amp_examples::write_settings(archive, resume_keys(settings, train_size));
  amp_examples::save_checkpoint(archive, settings.checkpoint.path);
}

/// Restores a TrainingState built from the same settings from settings.checkpoint.
void load_checkpoint(TrainingState& state, const Settings& settings, std::int64_t train_size) {
  const std::filesystem::path& path = settings.checkpoint.path;
  amp_examples::CheckpointReader checkpoint(path, settings.device.type, "mlp_fashion");
  checkpoint.check(kCheckpointFormat, resume_keys(settings, train_size));
  checkpoint.read_section("schedule", [&](auto& in) { state.schedule.load(in, path); });
  checkpoint.read_section("model", [&](auto& in) { state.model->load(in); });
  checkpoint.read_section("optimizer", [&](auto& in) { state.optimizer->load(in); });
  checkpoint.read_section("scaler", [&](auto& in) { in >> state.scaler; });
  checkpoint.read_generator("shuffle", state.shuffle);
  state.epochs_done = checkpoint.entry("epoch").toInt();
}

/// The checkpoint as Python's torch.save dict: {"model", "optimizer", "scaler"} as Python's
/// state_dict()s (amp/state_dict.h), the schedule's position, the shuffling generator's state,
/// the epochs done, the format and the settings. train.py writes and reads the same dict.
void save_python_checkpoint(TrainingState& state, const Settings& settings,
                            std::int64_t train_size) {
  const auto dict = [] {
    return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  };
  auto checkpoint = dict(), schedule = dict(), written = dict();
  checkpoint.insert("model", amp::state_dict(*state.model));
  checkpoint.insert("optimizer", amp::optimizer_state_dict(*state.optimizer));
  checkpoint.insert("scaler", state.scaler.state_dict());
  schedule.insert("step", state.schedule.step());
  schedule.insert("total", state.schedule.total());
  checkpoint.insert("schedule", schedule);
  {
    std::lock_guard<std::mutex> lock(state.shuffle.mutex());
    checkpoint.insert("shuffle", state.shuffle.get_state());
  }
  checkpoint.insert("epoch", state.epochs_done);
  checkpoint.insert("format", kCheckpointFormat);
  for (const auto& setting : resume_keys(settings, train_size)) {
    written.insert(setting.name, setting.value);
  }
  checkpoint.insert("settings", written);
  amp_examples::write_file_atomically(settings.checkpoint.path, [&](const auto& path) {
    amp::save_pickled(checkpoint, path.string());
  });
}

/// Restores a TrainingState from the dict save_python_checkpoint (or train.py) wrote, after the
/// same checks as the LibTorch format's.
void load_python_checkpoint(TrainingState& state, const Settings& settings,
                            std::int64_t train_size) {
  const std::filesystem::path& path = settings.checkpoint.path;
  const auto fail = [&](const std::string& what) {
    throw amp_examples::SetupError(
        fmt::format("the checkpoint '{}' cannot be resumed as --checkpoint-format python: {}",
                    path.string(), what));
  };
  c10::IValue file;
  try {
    file = amp::load_pickled(path.string());
  } catch (const c10::Error& error) {
    fail(error.msg());
  }
  if (!file.isGenericDict()) fail("it holds no dict");
  const auto checkpoint = file.toGenericDict();
  const auto lookup = [](const c10::impl::GenericDict& dict,
                         const std::string& key) -> std::optional<c10::IValue> {
    if (!dict.contains(key)) return std::nullopt;
    return dict.at(key);
  };
  const auto entry = [&](const std::string& key) {
    const auto value = lookup(checkpoint, key);
    if (!value) fail("it has no entry '" + key + "'");
    return *value;
  };
  const c10::IValue written = entry("settings");
  if (!written.isGenericDict()) fail("its 'settings' is not a dict");
  amp_examples::check_checkpoint_settings(
      path, "mlp_fashion", kCheckpointFormat, resume_keys(settings, train_size),
      [&](const std::string& key) {
        return key == "format" ? lookup(checkpoint, key) : lookup(written.toGenericDict(), key);
      });
  try {
    const auto schedule = entry("schedule").toGenericDict();
    state.schedule.restore(schedule.at("step").toInt(), schedule.at("total").toInt(), path);
    amp::load_state_dict(*state.model, entry("model"));
    amp::load_optimizer_state_dict(*state.optimizer, entry("optimizer"));
    state.scaler.load_state_dict(entry("scaler").toGenericDict());
    std::lock_guard<std::mutex> lock(state.shuffle.mutex());
    state.shuffle.set_state(entry("shuffle").toTensor());
  } catch (const c10::Error& error) {
    fail(error.msg());
  }
  state.epochs_done = entry("epoch").toInt();
}

// ---- the program ----

void run(const Settings& settings) {
  amp_examples::require_device(settings.device);
  settings.checkpoint.require_file();
  const auto start = Clock::now();
  const auto [train, test] = amp_examples::load_image_data(
      settings.data_dir, amp_examples::Pixels::kStandardised, settings.device.type);
  fmt::print("data: {} training and {} test images from {} ({:.2f} s)\n", train.size(), test.size(),
             settings.data_dir.string(), seconds_since(start));
  const std::int64_t steps = steps_per_epoch(train.size(), settings);
  fmt::print(
      "precision {} ({}), device {}, epochs {}, batch size {} x {} accumulated, {} steps per "
      "epoch\n{} lr {} (warmup {} steps, cosine to 0), weight decay {}, clip norm {}, seed {}\n",
      settings.precision.name, settings.precision.description, settings.device.name,
      settings.epochs, settings.batch_size, settings.accumulate, steps, settings.optimizer.label,
      settings.lr, settings.warmup_steps, settings.weight_decay, settings.clip, settings.seed);
  if (settings.weights.bf16) {
    fmt::print("weights: bf16, updates kept by {}{}\n", settings.low_precision.label,
               settings.low_precision.name == "none"
                   ? ""
                   : fmt::format(", {} moments", settings.state_dtype.name));
  }

  // The weights come from the seeded default generator on the CPU, then move, so every device
  // starts from the same model.
  torch::manual_seed(static_cast<std::uint64_t>(settings.seed));
  Mlp model(amp::fp8::Recipe::from_name(settings.fp8_recipe), settings.recompute_activations);
  model->to(settings.device.type);
  // bf16 weights (before the optimizer sees them); autocast then runs the forward pass in bf16.
  if (settings.weights.bf16) amp::to_low_precision(*model, torch::kBFloat16);
  TrainingState state{
      model,
      make_optimizer(model->parameters(), settings),
      amp::GradScaler(
          settings.device.type,
          amp::GradScalerOptions(settings.scaler).enabled(settings.precision.loss_scaling)),
      WarmupCosine(settings.lr, settings.warmup_steps, settings.epochs * steps),
      at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(settings.seed)),
  };
  std::int64_t parameter_count = 0;
  for (const torch::Tensor& parameter : model->parameters()) parameter_count += parameter.numel();
  fmt::print("model: MLP 784-512-256-10 with ReLU, {} parameters{}\n", parameter_count,
             settings.recompute_activations
                 ? ", hidden activations recomputed in backward (amp::checkpoint)"
                 : "");
  {
    torch::NoGradGuard no_grad;
    const auto [logits, loss] =
        forward_loss(model, train.images.slice(0, 0, 2), train.labels.slice(0, 0, 2), settings);
    fmt::print("forward pass: logits {}, loss {}\n", c10::toString(logits.scalar_type()),
               c10::toString(loss.scalar_type()));
  }
  if (settings.checkpoint.resume) {
    if (settings.checkpoint_format.python) {
      load_python_checkpoint(state, settings, train.size());
    } else {
      load_checkpoint(state, settings, train.size());
    }
  }
  settings.checkpoint.announce(state.epochs_done);
  std::fflush(stdout);

  const auto training_start = Clock::now();
  const std::int64_t last =
      std::min(settings.epochs, settings.stop_after.value_or(settings.epochs));
  amp_examples::LossScaleNote scaling(state.scaler);
  // The test accuracy under the training precision.
  const auto evaluate = [&] {
    return amp_examples::test_accuracy(state.model, test, settings.precision, settings.device.type,
                                       kEvalChunk);
  };
  std::optional<double> accuracy;
  while (state.epochs_done < last) {
    const auto epoch_start = Clock::now();
    const EpochReport report = train_epoch(state, train, settings);
    ++state.epochs_done;
    accuracy = evaluate();
    const std::string scale_note = scaling.next(state.scaler, steps);
    if (!settings.checkpoint.path.empty()) {
      if (settings.checkpoint_format.python) {
        save_python_checkpoint(state, settings, train.size());
      } else {
        save_checkpoint(state, settings, train.size());
      }
    }
    fmt::print(
        "epoch {}/{}: mean train loss {:.6f}, test accuracy {:.2f}%, grad norm {:.4f} (clipped "
        "{} of {} steps), next lr {:.6g}{}, {:.2f} s\n",
        state.epochs_done, settings.epochs, report.mean_loss, 100 * *accuracy,
        report.mean_grad_norm, report.clipped, report.taken, state.schedule.current(), scale_note,
        seconds_since(epoch_start));
    std::fflush(stdout);
  }
  if (!accuracy) accuracy = evaluate();
  if (state.epochs_done < settings.epochs) {
    fmt::print("stopped after epoch {} of {} (--stop-after); continue with --resume\n",
               state.epochs_done, settings.epochs);
  }
  amp_examples::print_done(state.model->parameters(), settings.precision.name, *accuracy,
                           training_start, start);
}

amp_examples::CommandLine make_command_line(Settings& s) {
  amp_examples::CommandLine cli(
      "mlp_fashion",
      "Trains an MLP (784-512-256-10, ReLU) on an MNIST-format dataset with AdamW (Python's\n"
      "unfused arithmetic or amp's fused one), gradient accumulation, gradient clipping through\n"
      "amp::GradScaler::unscale_and_clip_, a warmup + cosine learning-rate schedule and a\n"
      "checkpoint every epoch (--resume continues exactly), with the forward pass under\n"
      "amp::AutocastGuard (fp16 with GradScaler loss scaling).");
  amp_examples::add_data_option(cli, s.data_dir);
  cli.add_integer_option("epochs", "N", "passes over the training set", s.epochs, 1);
  cli.add_integer_option("batch-size", "N", "images per forward/backward pass", s.batch_size, 1);
  cli.add_integer_option("accumulate", "N", "micro-batches per optimizer step", s.accumulate, 1);
  cli.add_choice_option("optimizer",
                        "amp::optim::AdamW (Python's unfused AdamW), or amp::optim::FusedAdamW "
                        "(ATen's fused kernel)",
                        kOptimizers, s.optimizer);
  cli.add_positive_option("lr", "RATE", "AdamW's peak learning rate", s.lr);
  cli.add_positive_option("weight-decay", "W", "AdamW's decoupled weight decay", s.weight_decay);
  cli.add_integer_option("warmup-steps", "N", "steps of linear learning-rate warmup",
                         s.warmup_steps, 0);
  cli.add_positive_option("clip", "NORM", "largest gradient L2 norm per step", s.clip);
  cli.add_integer_option("seed", "N", "seed of the initialisation and the shuffling", s.seed, 0);
  cli.add_choice_option("weights",
                        "the parameters' dtype: fp32, or bf16 (needs --precision bf16 and, "
                        "with --low-precision, --optimizer fused-adamw)",
                        kWeights, s.weights);
  cli.add_choice_option("low-precision",
                        "with --weights bf16: how FusedAdamW keeps small updates (fp32 master "
                        "weights, Kahan summation, stochastic rounding, or none)",
                        kLowPrecision, s.low_precision);
  cli.add_choice_option("state-dtype",
                        "with --low-precision: FusedAdamW's moments in fp32 (keeps every update "
                        "of the state) or bf16 (4 bytes a parameter less)",
                        kStateDtypes, s.state_dtype);
  amp_examples::add_precision_option(cli, s.precision, /*float8=*/true);
  amp_examples::add_fp8_recipe_option(cli, s.fp8_recipe);
  amp_examples::add_device_option(cli, s.device);
  amp_examples::add_init_scale_option(cli, s.scaler);
  s.checkpoint.add_to(cli,
                      "save model, optimizer, scaler, schedule and shuffle state after every epoch",
                      "continue the run saved in --checkpoint PATH");
  cli.add_choice_option("checkpoint-format",
                        "libtorch (amp's archive), or python: the torch.save dict of Python's "
                        "state_dict()s that train.py, this loop in Python, reads and writes",
                        kCheckpointFormats, s.checkpoint_format);
  cli.add_flag("recompute-activations",
               "keep no hidden-layer activations for backward but recompute them there "
               "(amp::checkpoint: less memory, the same numbers)",
               [&] { s.recompute_activations = true; });
  cli.add_option("stop-after", "N",
                 "stop after epoch N as if interrupted (the schedule still spans --epochs)",
                 [&](std::string_view v) {
                   s.stop_after = amp_examples::parse_integer(
                       "--stop-after", v, 1, std::numeric_limits<std::int64_t>::max());
                 });
  return cli;
}

/// --weights and --low-precision against the other settings.
void check_weights(const Settings& s) {
  const bool low = s.low_precision.name != "none";
  if (low && !s.weights.bf16) {
    throw amp_examples::UsageError("--low-precision " + std::string(s.low_precision.name) +
                                   " applies to bf16 weights; add --weights bf16.");
  }
  if (low && !s.optimizer.fused) {
    throw amp_examples::UsageError("--low-precision " + std::string(s.low_precision.name) +
                                   " is an option of amp's FusedAdamW; use --optimizer "
                                   "fused-adamw.");
  }
  if (s.state_dtype.name != "fp32" && !low) {
    throw amp_examples::UsageError("--state-dtype " + std::string(s.state_dtype.name) +
                                   " sets the moments' dtype of --low-precision master, kahan "
                                   "or sr; add one of them.");
  }
  amp_examples::check_fp8_recipe(s.fp8_recipe, s.precision);
  if (s.weights.bf16 && s.precision.name != "bf16") {
    throw amp_examples::UsageError(
        "--weights bf16 computes under bf16 autocast; use --precision "
        "bf16 (got --precision " +
        std::string(s.precision.name) + ").");
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  Settings settings;
  const amp_examples::CommandLine cli = make_command_line(settings);
  return amp_examples::run_program(
      cli, argc, argv,
      [&] {
        settings.checkpoint.check();
        check_weights(settings);
      },
      [&] { run(settings); });
}
