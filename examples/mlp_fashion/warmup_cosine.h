// mlp_fashion's learning-rate schedule: linear warmup, then a cosine decay to 0, with its state
// saved in checkpoints.
#pragma once

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numbers>

#include "common/program.h"

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
      throw amp_examples::SetupError(
          fmt::format("the checkpoint '{}' has no learning-rate schedule state", path.string()));
    }
    restore(step.toInt(), total.toInt(), path);
  }

  /// The position load() restores, from values read elsewhere (a Python-format checkpoint).
  void restore(std::int64_t step, std::int64_t total, const std::filesystem::path& path) {
    if (total != total_) {
      throw amp_examples::SetupError(fmt::format(
          "the checkpoint '{}' follows a learning-rate schedule of {} steps but this run's "
          "has {}; resume with the --epochs the checkpoint was started with",
          path.string(), total, total_));
    }
    step_ = step;
  }

  std::int64_t step() const { return step_; }
  std::int64_t total() const { return total_; }

 private:
  double peak_;
  std::int64_t warmup_;
  std::int64_t total_;
  std::int64_t step_ = 0;
};
