// The examples' runner: --help, usage errors, and each error kind's message and exit code.
#include "program.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdio>
#include <new>

#include "idx.h"

namespace amp_examples {

std::string message_of(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) {
    return torch_error->what_without_backtrace();
  }
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) {
    return "out of memory (std::bad_alloc)";
  }
  return error.what();
}

int run_program(const CommandLine& cli, int argc, const char* const argv[],
                const std::function<void()>& check, const std::function<void()>& run) {
  const std::string& program = cli.program();
  try {
    if (!cli.parse(argc, argv)) {
      fmt::print("{}", cli.usage());
      return 0;
    }
    check();
  } catch (const UsageError& error) {
    fmt::print(stderr, "{}: error: {}\n\n{}", program, error.what(), cli.usage());
    return kUsageExitCode;
  }
  try {
    run();
  } catch (const DataError& error) {
    fmt::print(stderr,
               "{}: error: {}\n(--data DIR names a folder holding train-images-idx3-ubyte, "
               "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each "
               "raw or gzipped with a .gz suffix)\n",
               program, error.what());
    return 1;
  } catch (const SetupError& error) {
    fmt::print(stderr, "{}: error: {}\n", program, error.what());
    return 1;
  } catch (const std::exception& error) {
    // LibTorch's errors, and anything else (std::bad_alloc from a damaged input included): a
    // message and exit code 1 rather than std::terminate.
    fmt::print(stderr, "{}: error: {}\n", program, message_of(error));
    return 1;
  }
  return 0;
}

}  // namespace amp_examples
