// What the training examples' main functions share: the set-up error, and a runner that turns
// each kind of error into its message and exit code.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "cli.h"

namespace amp_examples {

/// A problem with a run's set-up that is not a data file: an unavailable device, a missing or
/// unusable checkpoint, an unwritable output file. The message says what is wrong and what to do.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The message of `error` for a user: without LibTorch's C++ backtrace, and saying "out of
/// memory" for std::bad_alloc (whose what() is only its type's name).
std::string message_of(const std::exception& error);

/// Parses the command line, checks the options, and runs the program.
/// Args: cli: the program's options (its name prefixes every error message); argc, argv: as
///   passed to main; check: refuses combinations of options with UsageError, before anything
///   runs; run: the program itself.
/// Returns: the exit code for main: 0 after a run or --help (the usage text is printed); 1 after a
///   DataError (with a note on the files --data needs), a SetupError, a LibTorch error or any
///   other exception (running out of memory included); 2 after
///   a UsageError (the message, then the usage text). Messages go to stderr as
///   "<program>: error: <message>".
int run_program(const CommandLine& cli, int argc, const char* const argv[],
                const std::function<void()>& check, const std::function<void()>& run);

}  // namespace amp_examples
