// The low-precision optimizer loops for AVX-512 (F, BW, VL, DQ); compiled with those flags on x86-64 and called only when the CPU has them (low_precision_kernels.cpp checks).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define AMP_LP_ADAM_RANGE adam_range_avx512
#define AMP_LP_SGD_RANGE sgd_range_avx512
#include "optim/cpu/low_precision_ranges_impl.h"
#else
#include "optim/cpu/low_precision_ranges.h"

namespace amp::optim::detail::cpu {

// Without these flags (another architecture) the baseline loops serve this name too.
void adam_range_avx512(const RangeKind& kind, const RangePointers& r, const AdamScalars& c,
                     uint64_t key, bool unscale, int64_t begin, int64_t end) {
  adam_range_default(kind, r, c, key, unscale, begin, end);
}

void sgd_range_avx512(const RangeKind& kind, const RangePointers& r, const SgdScalars& c,
                    uint64_t key, bool unscale, int64_t begin, int64_t end) {
  sgd_range_default(kind, r, c, key, unscale, begin, end);
}

}  // namespace amp::optim::detail::cpu
#endif
