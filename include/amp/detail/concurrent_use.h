// amp::detail::ConcurrentUseDetector: how GradScaler refuses a call that overlaps another
// thread's call on the same scaler (a member of GradScaler; not an API of its own).
#pragma once

#include <atomic>
#include <thread>

#include <amp/export.h>

namespace amp::detail {

/// Notices a GradScaler entered by two threads at once and refuses the second one with an error,
/// where the unsynchronised accesses would otherwise corrupt its state. A thread may re-enter
/// (a method calling another). Copying or moving gives a fresh, unused detector.
class AMP_EXPORT ConcurrentUseDetector {
 public:
  ConcurrentUseDetector() = default;
  ConcurrentUseDetector(const ConcurrentUseDetector&) noexcept {}
  ConcurrentUseDetector& operator=(const ConcurrentUseDetector&) noexcept { return *this; }

  /// Marks the calling thread as inside `method` until destroyed. Throws c10::Error naming both
  /// methods when another thread is inside.
  class AMP_EXPORT Scope {
   public:
    Scope(ConcurrentUseDetector& detector, const char* method);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ConcurrentUseDetector& detector_;
    bool owner_ = false;
  };

 private:
  std::atomic<std::thread::id> owner_{};
  std::atomic<const char*> method_{nullptr};
};

}  // namespace amp::detail
