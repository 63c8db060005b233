// Runs CPU list jobs: one parallel loop over the elements of the whole list
// (kernels::for_each_list_range), each range run by the widest build of the element loops.
#include "ops/cpu/list_kernels.h"

#include <algorithm>
#include <vector>

#include <ATen/Parallel.h>

#include "kernels/cpu_capability.h"
#include "kernels/cpu_ranges.h"

namespace amp::detail::cpu {

void run_list_job(const ListJob& job) {
  static const auto range_fn =
      kernels::CpuKernels<decltype(&process_range_default)>{
          process_range_default, process_range_avx2, process_range_avx512}
          .for_this_cpu();
  if (job.count == 0) return;

  const bool norm = job.mode == ListMode::kCheckNorm;
  const int threads = at::get_num_threads();
  // Per-thread partial sums (thread-major), summed in a fixed order afterwards.
  std::vector<double> thread_tensor_sumsq(norm && job.per_tensor_sumsq ? threads * job.count : 0);
  std::vector<double> thread_sumsq(norm ? threads : 0, 0.0);
  std::vector<char> thread_found(threads, 0);
  std::vector<int64_t> numels(job.count);
  for (int64_t k = 0; k < job.count; ++k) numels[k] = job.tensors[k].numel;

  kernels::for_each_list_range(numels, [&](int thread, size_t k, int64_t begin, int64_t end) {
    const FlatTensor& t = job.tensors[k];
    const RangeResult r = range_fn(t, begin, end, job.mode, job.factor);
    if (r.non_finite) {
      thread_found[thread] = 1;
      // A plain store from any thread that saw a non-finite value: all store the same 1.0.
      if (job.per_tensor_found) job.per_tensor_found[t.index] = 1.0f;
    }
    if (norm) {
      thread_sumsq[thread] += r.sumsq;
      if (job.per_tensor_sumsq) thread_tensor_sumsq[thread * job.count + k] += r.sumsq;
    }
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
