// Counts the host synchronisations a piece of CUDA code makes, with CUDA's sync-debug mode.
#pragma once

#include <functional>
#include <string>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <catch2/catch.hpp>

namespace amp_test {

/// Counts the warnings CUDA's sync-debug mode raises ("called a synchronizing CUDA operation")
/// while installed; other warnings are kept for the failure message.
class SyncCounter : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("synchronizing CUDA operation") != std::string::npos) {
      ++syncs;
    } else {
      others += warning.msg() + "\n";
    }
  }
  int syncs = 0;
  std::string others;
};

/// Runs `fn` with the sync-debug mode set to warn and returns how many synchronising CUDA calls
/// (blocking copies, item(), stream or device synchronisation) it made.
inline int syncs_in(const std::function<void()>& fn) {
  struct ModeGuard {
    ModeGuard() {
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    }
    ~ModeGuard() {
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    }
  };
  SyncCounter counter;
  {
    const c10::WarningUtils::WarningHandlerGuard handler(&counter);
    const ModeGuard mode;
    fn();
  }
  INFO("other warnings: " << counter.others);
  CHECK(counter.others.empty());
  return counter.syncs;
}

}  // namespace amp_test
