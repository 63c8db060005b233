// CPU multi-tensor kernels: the job they run and the prototypes of the per-instruction-set builds.
#pragma once

#include <cstdint>

#include "ops/kernel_common.h"

namespace amp::detail::cpu {

/// A job over a list of flat tensors, split into balanced element ranges across threads.
struct ListJob {
  const FlatTensor* tensors;
  int64_t count;
  ListMode mode;
  /// What every element is multiplied by: inv_scale, or clip_factor(...) for kClip.
  float factor;
  /// Set to 1.0 when a non-finite value is seen (plain store); used by the check modes.
  float* found_inf;
  /// Optional (may be null): per caller index, set to 1.0 for tensors with non-finite values.
  float* per_tensor_found;
  /// kCheckNorm: per caller index, sums of squares (zeroed by the caller), may be null.
  double* per_tensor_sumsq;
  /// kCheckNorm: the total sum of squares (written).
  double* total_sumsq;
};

/// Runs a job over all threads with the widest instruction set this CPU supports.
void run_list_job(const ListJob& job);

/// What one element range of one tensor contained.
struct RangeResult {
  bool non_finite = false;
  double sumsq = 0.0;
};

/// Processes elements [begin, end) of one tensor in `mode`; list_kernels_impl.h built for
/// baseline x86-64, AVX2+FMA+F16C and AVX-512 (amp_isa_sources), the widest the CPU runs chosen
/// at run time (kernels::cpu_capability()).
RangeResult process_range_default(const FlatTensor& tensor, int64_t begin, int64_t end,
                                  ListMode mode, float factor);
RangeResult process_range_avx2(const FlatTensor& tensor, int64_t begin, int64_t end, ListMode mode,
                               float factor);
RangeResult process_range_avx512(const FlatTensor& tensor, int64_t begin, int64_t end,
                                 ListMode mode, float factor);

}  // namespace amp::detail::cpu
