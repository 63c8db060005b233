// A CPU allocator for amp's tests and benchmarks that counts the bytes tensors hold, live now and
// the peak since the last reset: what a graph keeps and what a backward needs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace amp_test {

// The default CPU allocator with a count of the bytes it has handed out and not yet taken back.
// The context stays the data pointer (raw_allocate asserts it), so sizes live in a map.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) { instance_ = this; }

  /// Wraps the current default CPU allocator and installs the counter in its place (once per
  /// process; later calls return the same counter).
  static CountingAllocator& install() {
    static CountingAllocator allocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    return allocator;
  }

  c10::DataPtr allocate(size_t bytes) override {
    auto inner = base_->allocate(bytes);
    void* data = inner.get();
    const auto device = inner.device();
    TORCH_CHECK(inner.get_context() == data && base_->raw_deleter() != nullptr,
                "amp_test::CountingAllocator: the default CPU allocator is not the plain one this "
                "counter wraps");
    inner.release_context();
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[data] = bytes;
    live_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_, live_);
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  /// Bytes held by live CPU tensors now.
  int64_t live() {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }
  /// The most bytes held at once since the last reset_peak().
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  /// Starts a new peak from what is live now.
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_;
  }

 private:
  static void release(void* data) {
    auto* self = instance_;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      const auto found = self->sizes_.find(data);
      if (found != self->sizes_.end()) {
        self->live_ -= static_cast<int64_t>(found->second);
        self->sizes_.erase(found);
      }
    }
    self->base_->raw_deleter()(data);
  }
  static inline CountingAllocator* instance_ = nullptr;
  c10::Allocator* base_;
  std::mutex mutex_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
  std::unordered_map<void*, size_t> sizes_;
};

}  // namespace amp_test
