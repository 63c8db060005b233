// The examples' --precision and --device options and the check that the device is usable.
#include "precision.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

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

const Precision& parse_precision(std::string_view text) {
  return kPrecisions[parse_choice("--precision", text, names_of(kPrecisions))];
}

const DeviceChoice& parse_device(std::string_view text) {
  return kDevices[parse_choice("--device", text, names_of(kDevices))];
}

void add_precision_option(CommandLine& cli, Precision& target) {
  cli.add_option("precision", value_name(kPrecisions),
                 fmt::format("forward-pass precision (default {})", target.name),
                 [&target](std::string_view value) { target = parse_precision(value); });
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
