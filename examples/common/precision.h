// The training examples' --precision and --device: what each precision does under autocast and
// whether it scales the loss, the devices, and the options that choose them.
#pragma once

#include <amp/grad_scaler.h>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "cli.h"

namespace amp_examples {

/// A value of --precision: how the forward pass runs.
struct Precision {
  std::string_view name;
  std::string_view description;
  /// The autocast dtype, or nullopt to run without autocast (float32 throughout).
  std::optional<c10::ScalarType> autocast_dtype;
  /// Whether backward runs through an enabled GradScaler: float16's small exponent range lets
  /// small gradients underflow to zero unless the loss is scaled up first. bfloat16 has float32's
  /// range and needs no scaling.
  bool loss_scaling;
  /// Whether the linear layers compute in float8 (amp::fp8::Float8AutocastGuard, inside bf16
  /// autocast): only for examples whose layers are amp::fp8::Float8Linear.
  bool float8 = false;
};

inline constexpr std::array kPrecisions = {
    Precision{"fp32", "float32 throughout, autocast off", std::nullopt, false},
    Precision{"bf16", "bfloat16 autocast", c10::ScalarType::BFloat16, false},
    Precision{"fp16", "float16 autocast, GradScaler loss scaling", c10::ScalarType::Half, true},
};

/// --precision fp8, for the examples built on amp::fp8::Float8Linear (add_precision_option with
/// float8 true): float8 GEMMs (the recipe --fp8-recipe names), bf16 autocast around them.
inline constexpr Precision kFloat8Precision{"fp8", "float8 GEMMs in bfloat16 autocast",
                                            c10::ScalarType::BFloat16, false, true};

/// A value of --device.
struct DeviceChoice {
  std::string_view name;
  c10::DeviceType type;
};

inline constexpr std::array kDevices = {
    DeviceChoice{"cpu", c10::DeviceType::CPU},
    DeviceChoice{"cuda", c10::DeviceType::CUDA},
};

/// Finds the precision named `text` (with `float8`, "fp8" too).
/// Errors: UsageError naming --precision, the text and the accepted names.
const Precision& parse_precision(std::string_view text, bool float8 = false);

/// Finds the device named `text`.
/// Errors: UsageError naming --device, the text and the accepted names.
const DeviceChoice& parse_device(std::string_view text);

/// Registers --precision {fp32,bf16,fp16} (and fp8 with `float8`); `target` holds the default and
/// receives the choice.
void add_precision_option(CommandLine& cli, Precision& target, bool float8 = false);

/// Registers --fp8-recipe {tensorwise,rowwise,rowwise_with_gw_hp,delayed}, the amp::fp8::Recipe
/// name of --precision fp8; `target` holds the default and receives the choice.
void add_fp8_recipe_option(CommandLine& cli, std::string& target);

/// Errors: UsageError when `recipe` is not the default and `precision` is not fp8.
void check_fp8_recipe(const std::string& recipe, const Precision& precision);

/// Registers --device {cpu,cuda}; `target` holds the default and receives the choice.
void add_device_option(CommandLine& cli, DeviceChoice& target);

/// Registers --init-scale S, GradScaler's initial loss scale (fp16 only), into `options`.
void add_init_scale_option(CommandLine& cli, amp::GradScalerOptions& options);

/// Registers --growth-interval N, the clean steps before the loss scale doubles (fp16 only).
void add_growth_interval_option(CommandLine& cli, amp::GradScalerOptions& options);

/// Checks that a run can use `device` before anything is loaded onto it.
/// Errors: SetupError when it is CUDA and no GPU is usable, saying to use --device cpu.
void require_device(const DeviceChoice& device);

}  // namespace amp_examples
