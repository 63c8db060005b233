// The CPU list kernels' element loops for AVX-512 (F, BW, VL, DQ); compiled with those flags on
// x86-64 and called only when the CPU has them (list_kernels.cpp checks). Twice the lanes of
// AVX2 matter most for float16/bfloat16, whose conversions make the loop compute-bound.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#ifndef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#endif
#define AMP_CPU_RANGE_FN process_range_avx512
#include "ops/cpu/list_kernels_impl.h"
#else
#include "ops/cpu/list_kernels.h"

namespace amp::detail::cpu {

// Without AVX-512 flags (another architecture) the AVX2 loops serve both names.
RangeResult process_range_avx512(const FlatTensor& tensor, int64_t begin, int64_t end,
                                 ListMode mode, float factor) {
  return process_range_avx2(tensor, begin, end, mode, factor);
}

}  // namespace amp::detail::cpu
#endif
