// Minimal command-line parsing for amp's examples: --name VALUE options, --help, checked values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace amp_examples {

/// Exit code of an example whose command line was wrong (the convention of getopt-based tools).
inline constexpr int kUsageExitCode = 2;

/// A command line that cannot be accepted: unknown option, missing or bad value. The message says
/// which option and why; programs print it followed by their usage text.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The options a program accepts, each written `--name VALUE` or `--name=VALUE`, flags written
/// `--name` alone, plus `--help` (or `-h`). Later occurrences of an option override earlier ones.
class CommandLine {
 public:
  /// Receives an option's value text; parses and stores it, throwing UsageError when it is bad.
  using Setter = std::function<void(std::string_view value)>;

  /// Args: program: the name shown in the usage line; summary: one sentence on what it does.
  CommandLine(std::string program, std::string summary);

  /// Registers an option that takes a value.
  /// Args: name: without the leading dashes, e.g. "epochs"; value_name: shown in the usage text,
  ///   e.g. "N"; help: one line, including the default; set: called with each value given.
  void add_option(std::string name, std::string value_name, std::string help, Setter set);

  /// Registers a flag: an option written `--name` alone, without a value.
  /// Args: name: without the leading dashes, e.g. "resume"; help: one line; set: called each
  ///   time the flag is given.
  void add_flag(std::string name, std::string help, std::function<void()> set);

  /// Registers an option whose value is a whole number from `min` up, stored in `target`.
  /// Args: name, value_name: as for add_option; help: one line without the default, which is
  ///   appended from `target` as " (default N)"; target: holds the default and receives the
  ///   value; min: the smallest value accepted.
  void add_integer_option(std::string name, std::string value_name, std::string_view help,
                          std::int64_t& target, std::int64_t min);

  /// Registers an option whose value is a finite number greater than zero, stored in `target`;
  /// the help gets " (default X)" from `target`, as for add_integer_option.
  void add_positive_option(std::string name, std::string value_name, std::string_view help,
                           double& target);

  /// Registers an option whose value is one of the names in `choices`, e.g. --optimizer with
  /// {"adamw", "fused-adamw"}; the usage text writes the value as {a,b} and the help gets
  /// " (default NAME)" from `target`.
  /// Args: name: without the leading dashes; help: one line without the default; choices: the
  ///   accepted values, each with a `name` (a constant table: the setter keeps a reference);
  ///   target: holds the default and receives a copy of the chosen entry.
  /// Errors (when parsing): UsageError naming the option, the text and the accepted names.
  template <class Choice, std::size_t N>
  void add_choice_option(std::string name, std::string_view help,
                         const std::array<Choice, N>& choices, Choice& target) {
    std::vector<std::string_view> names;
    for (const Choice& choice : choices) names.push_back(choice.name);
    add_choice(std::move(name), help, std::move(names), target.name,
               [&choices, &target](std::size_t index) { target = choices[index]; });
  }

  /// Parses the arguments after the program name, calling each option's setter in order.
  /// Args: argc, argv: as passed to main.
  /// Returns: false when help was requested (the caller prints usage() and exits 0), else true.
  /// Errors: UsageError for an unknown option, a positional argument, a missing value, a value
  ///   given to a flag, or a value its setter rejects.
  bool parse(int argc, const char* const argv[]) const;

  /// Returns: the usage text: the usage line, the summary and one line per option.
  std::string usage() const;

  /// Returns: the program's name, as given to the constructor.
  const std::string& program() const { return program_; }

 private:
  struct Option {
    std::string name;
    std::string value_name;  // empty for a flag
    std::string help;
    Setter set;  // a flag's setter ignores its (empty) argument
  };
  const Option* find(std::string_view name) const;
  // add_choice_option's untemplated part: registers the option, calling `choose` with the index
  // of the name given.
  void add_choice(std::string name, std::string_view help, std::vector<std::string_view> names,
                  std::string_view default_name, std::function<void(std::size_t)> choose);

  std::string program_;
  std::string summary_;
  std::vector<Option> options_;
};

/// Parses a whole decimal integer in [min, max].
/// Args: option: the option's name for the message, e.g. "--epochs"; text: the value given.
/// Returns: the integer.
/// Errors: UsageError naming the option, the text and the accepted range.
std::int64_t parse_integer(std::string_view option, std::string_view text, std::int64_t min,
                           std::int64_t max);

/// Parses a finite number greater than zero, e.g. a learning rate.
/// Args: option: the option's name for the message; text: the value given.
/// Returns: the number.
/// Errors: UsageError naming the option and the text.
double parse_positive_number(std::string_view option, std::string_view text);

/// Finds `text` in a list of accepted words.
/// Args: option: the option's name for the message; text: the value given; choices: the words.
/// Returns: the index of the word in choices.
/// Errors: UsageError naming the option, the text and the accepted words.
std::size_t parse_choice(std::string_view option, std::string_view text,
                         const std::vector<std::string_view>& choices);

}  // namespace amp_examples
