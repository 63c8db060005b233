// Command-line parsing for amp's examples: option lookup, value checks, usage text.
#include "cli.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

namespace amp_examples {
namespace {

// How an option is written in the usage text: "--name VALUE", or "--name" for a flag.
std::string spelling(const auto& option) {
  return option.value_name.empty() ? fmt::format("--{}", option.name)
                                   : fmt::format("--{} {}", option.name, option.value_name);
}

}  // namespace

CommandLine::CommandLine(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void CommandLine::add_option(std::string name, std::string value_name, std::string help,
                             Setter set) {
  options_.push_back({std::move(name), std::move(value_name), std::move(help), std::move(set)});
}

void CommandLine::add_flag(std::string name, std::string help, std::function<void()> set) {
  options_.push_back(
      {std::move(name), std::string(), std::move(help), [set](std::string_view) { set(); }});
}

void CommandLine::add_integer_option(std::string name, std::string value_name,
                                     std::string_view help, std::int64_t& target,
                                     std::int64_t min) {
  std::string option = "--" + name;
  add_option(std::move(name), std::move(value_name), fmt::format("{} (default {})", help, target),
             [&target, min, option = std::move(option)](std::string_view value) {
               target = parse_integer(option, value, min, std::numeric_limits<std::int64_t>::max());
             });
}

void CommandLine::add_positive_option(std::string name, std::string value_name,
                                      std::string_view help, double& target) {
  std::string option = "--" + name;
  add_option(std::move(name), std::move(value_name), fmt::format("{} (default {})", help, target),
             [&target, option = std::move(option)](std::string_view value) {
               target = parse_positive_number(option, value);
             });
}

void CommandLine::add_choice(std::string name, std::string_view help,
                             std::vector<std::string_view> names, std::string_view default_name,
                             std::function<void(std::size_t)> choose) {
  std::string option = "--" + name;
  std::string value_name = fmt::format("{{{}}}", fmt::join(names, ","));
  add_option(std::move(name), std::move(value_name),
             fmt::format("{} (default {})", help, default_name),
             [option = std::move(option), names = std::move(names), choose = std::move(choose)](
                 std::string_view value) { choose(parse_choice(option, value, names)); });
}

const CommandLine::Option* CommandLine::find(std::string_view name) const {
  const auto it = std::find_if(options_.begin(), options_.end(),
                               [&](const Option& option) { return option.name == name; });
  return it == options_.end() ? nullptr : &*it;
}

bool CommandLine::parse(int argc, const char* const argv[]) const {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return false;
    if (!arg.starts_with("--") || arg.size() == 2) {
      throw UsageError(
          fmt::format("unexpected argument '{}'; options are written --name VALUE", arg));
    }
    const std::size_t equals = arg.find('=');
    const std::string_view name =
        arg.substr(2, equals == std::string_view::npos ? arg.npos : equals - 2);
    const Option* option = find(name);
    if (option == nullptr) throw UsageError(fmt::format("unknown option '--{}'", name));
    std::string_view value;
    if (option->value_name.empty()) {
      if (equals != std::string_view::npos) {
        throw UsageError(
            fmt::format("option --{} is a flag and takes no value; write --{} alone", name, name));
      }
    } else if (equals != std::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(fmt::format("option --{} needs a value ({})", name, option->value_name));
    }
    option->set(value);
  }
  return true;
}

std::string CommandLine::usage() const {
  std::string text = fmt::format("usage: {} [--help]", program_);
  for (const Option& option : options_) {
    text += fmt::format(" [{}]", spelling(option));
  }
  text += fmt::format("\n\n{}\n\noptions:\n", summary_);
  std::size_t width = std::string_view("-h, --help").size();
  for (const Option& option : options_) {
    width = std::max(width, spelling(option).size());
  }
  text += fmt::format("  {:<{}}  {}\n", "-h, --help", width, "show this help and exit");
  for (const Option& option : options_) {
    text += fmt::format("  {:<{}}  {}\n", spelling(option), width, option.help);
  }
  return text;
}

std::int64_t parse_integer(std::string_view option, std::string_view text, std::int64_t min,
                           std::int64_t max) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    throw UsageError(
        fmt::format("{} must be a whole number from {} to {}, not '{}'", option, min, max, text));
  }
  return value;
}

double parse_positive_number(std::string_view option, std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
      value <= 0) {
    throw UsageError(
        fmt::format("{} must be a finite number greater than 0, not '{}'", option, text));
  }
  return value;
}

std::size_t parse_choice(std::string_view option, std::string_view text,
                         const std::vector<std::string_view>& choices) {
  const auto it = std::find(choices.begin(), choices.end(), text);
  if (it == choices.end()) {
    throw UsageError(
        fmt::format("{} must be one of {}, not '{}'", option, fmt::join(choices, ", "), text));
  }
  return static_cast<std::size_t>(it - choices.begin());
}

}  // namespace amp_examples
