// The CPU list kernels' element loops for AVX2+FMA+F16C; compiled with those flags on x86-64 and
// called only when the CPU has them (list_kernels.cpp checks).
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#ifndef CPU_CAPABILITY_AVX2
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif
#define AMP_CPU_RANGE_FN process_range_avx2
#include "ops/cpu/list_kernels_impl.h"
#else
#include "ops/cpu/list_kernels.h"

namespace amp::detail::cpu {

// Without AVX2 flags (another architecture) the baseline loops serve both names.
RangeResult process_range_avx2(const FlatTensor& tensor, int64_t begin, int64_t end, ListMode mode,
                               float factor) {
  return process_range_default(tensor, begin, end, mode, factor);
}

}  // namespace amp::detail::cpu
#endif
