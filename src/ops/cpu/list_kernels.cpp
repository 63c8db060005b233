// Runs CPU list jobs: one parallel loop over the elements of the whole list, split into balanced
// ranges across threads (not tensor by tensor), each range walking the tensors it spans.
#include "ops/cpu/list_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

namespace amp::detail::cpu {
namespace {

// Below this many elements a range is not worth a thread of its own.
constexpr int64_t kGrainElems = 1 << 15;
// A list with fewer elements in all runs on the calling thread. Starting a parallel region costs
// little on an idle machine, but 5-8 ms when every core is busy with other work (the region waits
// for its second thread to be scheduled): more than one thread needs for 8M elements. ATen's
// foreach ops stay on one thread for lists of small tensors, which is why a split list lost to
// them under load (bench/results/unscale-cpu-under-load.txt).
constexpr int64_t kSerialBelowElems = 1 << 23;

using RangeFn = RangeResult (*)(const FlatTensor&, int64_t, int64_t, ListMode, float);

// The widest build of the element loops this CPU runs. AMP_CPU_CAPABILITY=default|avx2|avx512
// caps the choice (as ATEN_CPU_CAPABILITY does for ATen), so every build can be tested on one
// machine; a value the CPU cannot run, or an unknown one, is ignored.
RangeFn pick_range_fn() {
  const char* cap = std::getenv("AMP_CPU_CAPABILITY");
  const std::string limit = cap != nullptr ? cap : "";
  if (limit == "default") return process_range_default;
#if defined(__x86_64__) && defined(__GNUC__)
  if (limit != "avx2" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return process_range_avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return process_range_avx2;
  }
#endif
  return process_range_default;
}

}  // namespace

void run_list_job(const ListJob& job) {
  static const RangeFn range_fn = pick_range_fn();
  if (job.count == 0) return;

  // offsets[k] is where tensor k starts in the concatenation of all tensors.
  std::vector<int64_t> offsets(job.count + 1, 0);
  for (int64_t k = 0; k < job.count; ++k) offsets[k + 1] = offsets[k] + job.tensors[k].numel;
  const int64_t total = offsets.back();

  const bool norm = job.mode == ListMode::kCheckNorm;
  const int threads = at::get_num_threads();
  // Per-thread partial sums (thread-major), summed in a fixed order afterwards.
  std::vector<double> thread_tensor_sumsq(norm && job.per_tensor_sumsq ? threads * job.count : 0);
  std::vector<double> thread_sumsq(norm ? threads : 0, 0.0);
  std::vector<char> thread_found(threads, 0);

  const int64_t grain = total < kSerialBelowElems ? kSerialBelowElems : kGrainElems;
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    const int tid = at::get_thread_num();
    bool found = false;
    double sumsq = 0.0;
    int64_t k = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    for (int64_t pos = begin; pos < end; ++k) {
      const int64_t stop = std::min(end, offsets[k + 1]);
      if (stop == pos) continue;  // an empty tensor sits at this offset
      const FlatTensor& t = job.tensors[k];
      const RangeResult r = range_fn(t, pos - offsets[k], stop - offsets[k], job.mode, job.factor);
      if (r.non_finite) {
        found = true;
        // A plain store from any thread that saw a non-finite value: all store the same 1.0.
        if (job.per_tensor_found) job.per_tensor_found[t.index] = 1.0f;
      }
      if (norm) {
        sumsq += r.sumsq;
        if (job.per_tensor_sumsq) thread_tensor_sumsq[tid * job.count + k] += r.sumsq;
      }
      pos = stop;
    }
    thread_found[tid] |= found ? 1 : 0;
    if (norm) thread_sumsq[tid] += sumsq;
  });

  if (job.found_inf &&
      std::any_of(thread_found.begin(), thread_found.end(), [](char f) { return f != 0; })) {
    *job.found_inf = 1.0f;
  }
  if (norm) {
    double sum = 0.0;
    for (double s : thread_sumsq) sum += s;
    *job.total_sumsq = sum;
    if (job.per_tensor_sumsq) {
      for (int tid = 0; tid < threads; ++tid) {
        for (int64_t k = 0; k < job.count; ++k) {
          job.per_tensor_sumsq[job.tensors[k].index] += thread_tensor_sumsq[tid * job.count + k];
        }
      }
    }
  }
}

}  // namespace amp::detail::cpu
