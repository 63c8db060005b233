// The CPU side of amp's list kernels: one parallel loop over the elements of a whole list of
// tensors, split into balanced ranges across threads (not tensor by tensor), each range walking
// the tensors it spans. Included by baseline translation units only (it instantiates ATen's
// parallel_for); the per-instruction-set loops it calls are plain functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/Parallel.h>

namespace amp::kernels {

/// Below this many elements a range is not worth a thread of its own.
constexpr int64_t kCpuGrainElems = 1 << 15;
/// A list with fewer elements in all runs on the calling thread. Starting a parallel region costs
/// little on an idle machine, but 5-8 ms when every core is busy with other work (the region waits
/// for its second thread to be scheduled): more than one thread needs for 8M elements. ATen's
/// foreach ops stay on one thread for lists of small tensors
/// (bench/results/unscale-cpu-under-load.txt).
constexpr int64_t kCpuSerialBelowElems = 1 << 23;

/// Calls range(thread, k, begin, end) for element ranges [begin, end) of tensor k, covering every
/// element of the `numels.size()` tensors once; `thread` is at::get_thread_num() of the caller of
/// that range (for per-thread partial results). Empty tensors get no call.
template <typename Range>
void for_each_list_range(const std::vector<int64_t>& numels, const Range& range) {
  std::vector<int64_t> offsets(numels.size() + 1, 0);
  for (size_t k = 0; k < numels.size(); ++k) offsets[k + 1] = offsets[k] + numels[k];
  const int64_t total = offsets.back();
  if (total == 0) return;
  const int64_t grain = total < kCpuSerialBelowElems ? total : kCpuGrainElems;
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    const int thread = at::get_thread_num();
    size_t k = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    for (int64_t pos = begin; pos < end; ++k) {
      const int64_t stop = std::min(end, offsets[k + 1]);
      if (stop > pos) range(thread, k, pos - offsets[k], stop - offsets[k]);
      pos = std::max(pos, stop);
    }
  });
}

}  // namespace amp::kernels
