// The examples' reports: epoch-line notes, closing lines, metrics CSV, progress line, summary.
#include "train_monitor.h"

#include <ATen/ops/zeros.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <sys/resource.h>

#include "fingerprint.h"
#include "program.h"

namespace amp_examples {
namespace {

// The summary's peak memory: see print_summary.
std::string peak_memory(c10::DeviceType device) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string_view note = "max RSS";
  if (device == c10::DeviceType::CUDA) {
    try {
      // Device 0: "cuda" without an index is the current device, which the examples never
      // change.
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

// Starts the CUDA peak of peak_memory afresh, so that each --compare run reports its own.
void reset_cuda_peak(c10::DeviceType device) {
  if (device != c10::DeviceType::CUDA) return;
  try {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(c10::DeviceIndex{0});
  } catch (const c10::Error&) {
    // peak_memory then falls back to the host's maximum resident set and says so.
  }
}

}  // namespace

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

ScalerReading read_scaler(const amp::GradScaler& scaler) {
  if (!scaler.is_enabled()) return {};
  const amp::GradScalerCounters counters = scaler.counters();
  return {scaler.get_scale(), counters.steps_skipped,
          counters.steps_taken + counters.steps_skipped};
}

LossScaleNote::LossScaleNote(const amp::GradScaler& scaler)
    : skipped_before_(scaler.is_enabled() ? scaler.counters().steps_skipped : 0) {}

std::string LossScaleNote::next(const amp::GradScaler& scaler, std::int64_t steps) {
  if (!scaler.is_enabled()) return "";
  const std::int64_t skipped = scaler.counters().steps_skipped;
  std::string note = fmt::format(", loss scale {}, skipped steps {} of {}", scaler.get_scale(),
                                 skipped - skipped_before_, steps);
  skipped_before_ = skipped;
  return note;
}

void print_done(const std::vector<at::Tensor>& parameters, std::string_view precision,
                double accuracy, Clock::time_point training_start, Clock::time_point start) {
  fmt::print("parameters: fingerprint {:016x}\n", parameter_fingerprint(parameters));
  fmt::print("done: precision {}, test accuracy {:.2f}%, training {:.2f} s, total {:.2f} s\n",
             precision, 100 * accuracy, seconds_since(training_start), seconds_since(start));
}

void print_summary(const RunReport& report) {
  const std::string final_loss = report.losses.empty()
                                     ? "n/a (no epoch left to train)"
                                     : fmt::format("{:.6f}", report.losses.back());
  const std::string throughput =
      report.images == 0
          ? "n/a"
          : fmt::format("{:.0f}", static_cast<double>(report.images) / report.train_seconds);
  const std::string skipped =
      report.loss_scaling
          ? fmt::format("skipped steps {} of {}", report.scaler.skipped, report.scaler.steps)
          : std::string("skipped steps 0 (no loss scaling)");
  fmt::print(
      "summary: precision {}, test accuracy {:.2f}%, final train loss {}, {} samples/s, "
      "peak memory {}, {}\n",
      report.precision, 100 * report.accuracy, final_loss, throughput, peak_memory(report.device),
      skipped);
}

void print_comparison(const RunReport& reference, const RunReport& mixed, std::int64_t seed,
                      std::int64_t epochs) {
  fmt::print("\ncompare: {} vs {} (seed {}: same initial weights, same batches)\n",
             reference.precision, mixed.precision, seed);
  const std::string loss_a = fmt::format("{} loss", reference.precision);
  const std::string accuracy_a = fmt::format("{} acc", reference.precision);
  const std::string loss_b = fmt::format("{} loss", mixed.precision);
  const std::string accuracy_b = fmt::format("{} acc", mixed.precision);
  fmt::print("{:<8}{:>11}{:>10}{:>13}{:>10}\n", "epoch", loss_a, accuracy_a, loss_b, accuracy_b);
  for (std::size_t i = 0; i < reference.losses.size(); ++i) {
    fmt::print("{:<8}{:>11.6f}{:>9.2f}%{:>13.6f}{:>9.2f}%\n",
               fmt::format("{}/{}", reference.first_epoch + static_cast<std::int64_t>(i), epochs),
               reference.losses[i], 100 * reference.accuracies[i], mixed.losses[i],
               100 * mixed.accuracies[i]);
  }
  fmt::print("{:<8}{:>19.2f} s{:>21.2f} s\n", "training", reference.train_seconds,
             mixed.train_seconds);
  fmt::print("accuracy difference ({} - {}): {:+.2f} points\n", mixed.precision,
             reference.precision, 100 * (mixed.accuracy - reference.accuracy));
}

void MetricsOptions::add_to(CommandLine& cli) {
  cli.add_option("metrics", "FILE",
                 "write a CSV row of loss, loss scale, skipped steps and samples/s every "
                 "--metrics-every steps, and one with the test accuracy per epoch",
                 [this](std::string_view value) { path = value; });
  cli.add_integer_option("metrics-every", "N", "steps per --metrics row", every, 1);
}

TrainMonitor::TrainMonitor(const MetricsOptions& metrics, bool progress)
    : metrics_(metrics), progress_(progress) {
  if (metrics.path.empty()) return;
  csv_.open(metrics.path);
  if (!csv_) {
    throw SetupError(
        fmt::format("cannot write the metrics file '{}': {}; name a writable path "
                    "with --metrics FILE",
                    metrics.path.string(), std::strerror(errno)));
  }
  csv_ << kHeader;
}

void TrainMonitor::announce() const {
  if (writes_metrics()) {
    fmt::print("metrics: a row every {} steps and one per epoch to {}\n", metrics_.every,
               metrics_.path.string());
  }
}

void TrainMonitor::start_run(std::string_view precision, c10::DeviceType device,
                             bool loss_scaling) {
  reset_cuda_peak(device);
  report_ = RunReport{};
  report_.precision = precision;
  report_.device = device;
  report_.loss_scaling = loss_scaling;
  epochs_started_ = 0;
}

void TrainMonitor::start_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t steps,
                               c10::Device device) {
  if (epochs_started_++ == 0) report_.first_epoch = epoch;
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = steps;
  global_step_ = (epoch - 1) * steps;
  step_in_epoch_ = 0;
  epoch_images_ = 0;
  epoch_start_ = Clock::now();
  last_progress_ = epoch_start_;
  window_sum_ = at::zeros({}, at::TensorOptions(device).dtype(at::kDouble));
  window_images_ = 0;
  window_start_ = epoch_start_;
}

void TrainMonitor::after_step(const at::Tensor& weighted_loss, std::int64_t images,
                              const at::Tensor& epoch_loss_sum, const amp::GradScaler& scaler) {
  ++global_step_;
  ++step_in_epoch_;
  epoch_images_ += images;
  window_images_ += images;
  if (writes_metrics()) window_sum_ += weighted_loss;
  // The epoch's last step is reported by the epoch row instead.
  if (writes_metrics() && global_step_ % metrics_.every == 0 && step_in_epoch_ < steps_) {
    write_row(close_window(), read_scaler(scaler), std::nullopt);
  }
  if (progress_) {
    const auto now = Clock::now();
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

void TrainMonitor::end_training() {
  report_.train_seconds += seconds_since(epoch_start_);
  report_.images += epoch_images_;
  if (writes_metrics()) pending_ = close_window();
}

void TrainMonitor::end_epoch(double loss, double accuracy, const amp::GradScaler& scaler) {
  report_.losses.push_back(loss);
  report_.accuracies.push_back(accuracy);
  if (writes_metrics()) write_row(pending_, read_scaler(scaler), EpochResult{loss, accuracy});
}

void TrainMonitor::clear_progress() const {
  if (progress_) fmt::print("\r\033[K");
}

RunReport TrainMonitor::end_run(double accuracy, const amp::GradScaler& scaler) {
  report_.accuracy = accuracy;
  report_.scaler = read_scaler(scaler);
  return report_;
}

// The mean loss and throughput since the previous row (one read of the loss sum), then resets.
TrainMonitor::Window TrainMonitor::close_window() {
  const double seconds = seconds_since(window_start_);
  const double images = static_cast<double>(window_images_);
  Window window{window_sum_.item<double>() / images, seconds > 0 ? images / seconds : 0.0};
  window_sum_.zero_();
  window_images_ = 0;
  window_start_ = Clock::now();
  return window;
}

void TrainMonitor::write_row(const Window& window, const ScalerReading& scaler,
                             const std::optional<EpochResult>& epoch) {
  csv_ << fmt::format("{},{},{},{:.6f},{},{},{:.1f},", report_.precision, epoch_, global_step_,
                      window.loss, scaler.scale, scaler.skipped, window.samples_per_s);
  // Step rows leave the two epoch columns empty.
  csv_ << (epoch ? fmt::format("{:.6f},{:.2f}\n", epoch->loss, 100 * epoch->accuracy) : ",\n");
  csv_.flush();
}

}  // namespace amp_examples
