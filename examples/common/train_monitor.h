// What the training examples report while and after they train: the loss-scale part of the epoch
// lines, the closing lines, and mnist_linear's metrics CSV, progress line and summary, all read
// from the device without a host sync per step.
#pragma once

#include <amp/grad_scaler.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"

namespace amp_examples {

using Clock = std::chrono::steady_clock;

/// Seconds from `start` until now.
double seconds_since(Clock::time_point start);

/// The loss scale and the steps skipped so far (cumulative, a resumed run's included), each one
/// read of a scaler tensor: 1 and 0 without loss scaling.
struct ScalerReading {
  double scale = 1.0;
  std::int64_t skipped = 0;
  std::int64_t steps = 0;  ///< taken + skipped; 0 without loss scaling
};

/// Reads `scaler` (which tracks counters) once.
ScalerReading read_scaler(const amp::GradScaler& scaler);

/// The end of an epoch line under loss scaling: ", loss scale S, skipped steps K of N", K
/// counting the steps skipped since the previous line (one read of the counters per epoch, never
/// per step). Empty without loss scaling.
class LossScaleNote {
 public:
  /// Starts counting from the steps `scaler` has skipped so far (a resumed run's included).
  explicit LossScaleNote(const amp::GradScaler& scaler);

  /// The note for the epoch that just ended, of `steps` optimizer steps.
  std::string next(const amp::GradScaler& scaler, std::int64_t steps);

 private:
  std::int64_t skipped_before_ = 0;
};

/// Prints the lines every training example ends with: "parameters: fingerprint F" (see
/// parameter_fingerprint) and "done: precision P, test accuracy A%, training T s, total U s".
void print_done(const std::vector<at::Tensor>& parameters, std::string_view precision,
                double accuracy, Clock::time_point training_start, Clock::time_point start);

/// What one training run did, for its summary line and for --compare's table.
struct RunReport {
  std::string_view precision;
  c10::DeviceType device = c10::DeviceType::CPU;
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
  bool loss_scaling = false;
  ScalerReading scaler;
};

/// Prints "summary: precision P, test accuracy A%, final train loss L, N samples/s, peak memory
/// M, skipped steps K of S". The peak memory is, on CUDA, the caching allocator's peak of
/// allocated bytes (reset by TrainMonitor::start_run), else the process's maximum resident set
/// (over the whole process, so under --compare it covers both runs so far).
void print_summary(const RunReport& report);

/// Prints --compare's table: a fp32 run and a mixed-precision run of `epochs` epochs from the same
/// `seed`, epoch by epoch, their training times and the difference of their final accuracies.
void print_comparison(const RunReport& reference, const RunReport& mixed, std::int64_t seed,
                      std::int64_t epochs);

/// --metrics FILE and --metrics-every N: the CSV TrainMonitor writes, and how often.
struct MetricsOptions {
  /// Empty for none.
  std::filesystem::path path;
  /// Steps per row (each epoch also ends with a row).
  std::int64_t every = 50;

  /// Registers --metrics FILE and --metrics-every N.
  void add_to(CommandLine& cli);
};

/// Watches a training loop: writes the --metrics CSV (a row every `every` steps and one per
/// epoch), redraws the in-place progress line, and keeps the RunReport. The loss is summed on the
/// device and read only when a row or a progress update is due.
class TrainMonitor {
 public:
  /// The header of the metrics CSV.
  static constexpr std::string_view kHeader =
      "precision,epoch,step,train_loss,loss_scale,skipped_steps,samples_per_s,epoch_train_loss,"
      "test_accuracy_percent\n";

  /// Opens the metrics CSV, if any, and writes its header.
  /// Args: metrics: what to write; progress: whether to draw the progress line (stdout is a
  ///   terminal).
  /// Errors: SetupError when the CSV cannot be written, naming it.
  TrainMonitor(const MetricsOptions& metrics, bool progress);

  /// Prints "metrics: a row every N steps and one per epoch to FILE" when writing a CSV.
  void announce() const;

  /// Starts a run of one precision on `device`, before its model is built (the CUDA memory peak
  /// starts afresh here).
  void start_run(std::string_view precision, c10::DeviceType device, bool loss_scaling);

  /// Starts epoch `epoch` of `epochs`, each of `steps` optimizer steps (the step count of a
  /// resumed run continues from the epochs before); the loss is summed on `device`. The run's
  /// first epoch is the first one started.
  void start_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t steps, c10::Device device);

  /// Records one optimizer step. Args: weighted_loss: the batch's mean loss times its size (a
  ///   device tensor, not read); images: the batch size; epoch_loss_sum: the epoch's running sum
  ///   of weighted_loss (read only for a progress update); scaler: read only for a metrics row.
  void after_step(const at::Tensor& weighted_loss, std::int64_t images,
                  const at::Tensor& epoch_loss_sum, const amp::GradScaler& scaler);

  /// Ends the epoch's training pass (before evaluation, which the throughput leaves out).
  void end_training();

  /// Records the epoch's mean loss and test accuracy (a fraction) and writes the epoch row.
  void end_epoch(double loss, double accuracy, const amp::GradScaler& scaler);

  /// Erases the progress line so that a plain line can be printed in its place.
  void clear_progress() const;

  /// Ends the run with its final test accuracy (a fraction) and returns its report.
  RunReport end_run(double accuracy, const amp::GradScaler& scaler);

 private:
  struct Window {
    double loss = 0;
    double samples_per_s = 0;
  };
  struct EpochResult {
    double loss;
    double accuracy;
  };

  Window close_window();
  void write_row(const Window& window, const ScalerReading& scaler,
                 const std::optional<EpochResult>& epoch);

  bool writes_metrics() const { return csv_.is_open(); }

  MetricsOptions metrics_;
  std::ofstream csv_;
  bool progress_;
  RunReport report_;
  std::int64_t epochs_started_ = 0;
  std::int64_t global_step_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t epochs_ = 0;
  std::int64_t step_in_epoch_ = 0;
  std::int64_t epoch_images_ = 0;
  Clock::time_point epoch_start_;
  Clock::time_point last_progress_;
  at::Tensor window_sum_;
  std::int64_t window_images_ = 0;
  Clock::time_point window_start_;
  Window pending_;
};

}  // namespace amp_examples
