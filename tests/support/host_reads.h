// Counts the values read back to the host through the dispatcher (item(), _local_scalar_dense,
// is_nonzero, equal) while installed, via a thread-local RecordFunction observer.
#pragma once

#include <string>
#include <vector>

#include <ATen/record_function.h>

namespace amp_test {

/// Records every host read made on this thread while alive. Reads made inside ATen's fused
/// optimizer kernels are not counted: on the CPU those kernels read their step count (a CPU
/// tensor) with item(), which is the kernel using its input, not the caller deciding on the host.
class HostReadRecorder {
 public:
  HostReadRecorder();
  ~HostReadRecorder();
  HostReadRecorder(const HostReadRecorder&) = delete;
  HostReadRecorder& operator=(const HostReadRecorder&) = delete;

  /// The ops that read a value back, each with the chain of ops it was called from.
  const std::vector<std::string>& reads() const;

 private:
  at::CallbackHandle handle_;
};

}  // namespace amp_test
