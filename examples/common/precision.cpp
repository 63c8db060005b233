// The examples' --precision and --device options and the check that the device is usable.
#include "precision.h"

#include <amp/fp8.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "program.h"

namespace amp_examples {
namespace {

template <class Choice, std::size_t N>
std::vector<std::string_view> names_of(const std::array<Choice, N>& choices) {
  std::vector<std::string_view> names;
  for (const Choice& choice : choices) names.push_back(choice.name);
  return names;
}

// How the usage text writes a choice's value: {a,b,c}.
template <class Choice, std::size_t N>
std::string value_name(const std::array<Choice, N>& choices) {
  return fmt::format("{{{}}}", fmt::join(names_of(choices), ","));
}

}  // namespace

const Precision& parse_precision(std::string_view text, bool float8) {
  auto names = names_of(kPrecisions);
  if (float8) names.push_back(kFloat8Precision.name);
  const std::size_t index = parse_choice("--precision", text, names);
  return index < kPrecisions.size() ? kPrecisions[index] : kFloat8Precision;
}

const DeviceChoice& parse_device(std::string_view text) {
  return kDevices[parse_choice("--device", text, names_of(kDevices))];
}

void add_precision_option(CommandLine& cli, Precision& target, bool float8) {
  std::string values = value_name(kPrecisions);
  if (float8) values.insert(values.size() - 1, ",fp8");
  cli.add_option(
      "precision", values, fmt::format("forward-pass precision (default {})", target.name),
      [&target, float8](std::string_view value) { target = parse_precision(value, float8); });
}

void add_fp8_recipe_option(CommandLine& cli, std::string& target) {
  const auto& names = amp::fp8::Recipe::names();
  cli.add_option("fp8-recipe", fmt::format("{{{}}}", fmt::join(names, ",")),
                 fmt::format("with --precision fp8: torchao's dynamic recipes or Transformer "
                             "Engine's delayed scaling (default {})",
                             target),
                 [&target, &names](std::string_view value) {
                   if (std::find(names.begin(), names.end(), value) == names.end()) {
                     throw UsageError(fmt::format(
                         "--fp8-recipe {} is not a recipe; use {} or {}", value,
                         fmt::join(names.begin(), names.end() - 1, ", "), names.back()));
                   }
                   target = std::string(value);
                 });
}

void check_fp8_recipe(const std::string& recipe, const Precision& precision) {
  if (recipe != "tensorwise" && !precision.float8) {
    throw UsageError(fmt::format("--fp8-recipe {} applies to --precision fp8 (got --precision {})",
                                 recipe, precision.name));
  }
}

void add_device_option(CommandLine& cli, DeviceChoice& target) {
  cli.add_option("device", value_name(kDevices),
                 fmt::format("where to train (default {})", target.name),
                 [&target](std::string_view value) { target = parse_device(value); });
}

void add_init_scale_option(CommandLine& cli, amp::GradScalerOptions& options) {
  cli.add_option(
      "init-scale", "S",
      fmt::format("fp16: GradScaler's initial loss scale (default {})", options.init_scale()),
      [&options](std::string_view value) {
        options.init_scale(parse_positive_number("--init-scale", value));
      });
}

void add_growth_interval_option(CommandLine& cli, amp::GradScalerOptions& options) {
  cli.add_option("growth-interval", "N",
                 fmt::format("fp16: clean steps before the loss scale doubles (default {})",
                             options.growth_interval()),
                 [&options](std::string_view value) {
                   options.growth_interval(parse_integer("--growth-interval", value, 1,
                                                         std::numeric_limits<std::int64_t>::max()));
                 });
}

void require_device(const DeviceChoice& device) {
  if (device.type == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
    throw SetupError(
        "--device cuda needs a CUDA GPU, but none is available (no GPU or driver on this "
        "machine, or a LibTorch built without CUDA); run on the CPU with --device cpu");
  }
}

}  // namespace amp_examples
