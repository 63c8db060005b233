// The CPU list kernels' element loops, compiled once per instruction set by amp_isa_sources
// (cmake/AmpKernels.cmake), which defines AMP_ISA_FN and at::vec's CPU_CAPABILITY. Exports
// process_range_default, _avx2 and _avx512; everything else has internal linkage.
#include <cmath>
#include <cstdint>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "ops/cpu/list_kernels.h"

namespace amp::detail::cpu {
namespace {

using at::vec::Vectorized;

/// Element-wise state of one range: the sticky non-finite lanes and the sums of squares.
/// Non-finite detection is `bad += value * 0`: finite values add +-0, inf and NaN make the lane
/// NaN for good, so the hot loop has no branch.
template <typename Vec>
struct Lanes {
  Vec bad = Vec(0);
  double sumsq[Vec::size()] = {};

  void check(const Vec& v) { bad = at::vec::fmadd(v, Vec(0), bad); }
  void square(const Vec& u) {
    typename Vec::value_type tmp[Vec::size()];
    u.store(tmp);
    // Squares in double: finite values whose float32 sum of squares overflows stay finite.
    for (int j = 0; j < Vec::size(); ++j) {
      sumsq[j] += static_cast<double>(tmp[j]) * static_cast<double>(tmp[j]);
    }
  }
  void finish(RangeResult& result) const {
    typename Vec::value_type tmp[Vec::size()];
    bad.store(tmp);
    for (int j = 0; j < Vec::size(); ++j) {
      result.non_finite |= tmp[j] != tmp[j];
      result.sumsq += sumsq[j];
    }
  }
};

template <bool kCheck, bool kStore, bool kNorm, typename Compute>
inline Compute scalar_step(Compute v, Compute factor, RangeResult& result) {
  if (kCheck && !std::isfinite(v)) result.non_finite = true;
  const Compute u = v * factor;
  if (kNorm) result.sumsq += static_cast<double>(u) * static_cast<double>(u);
  return u;
}

// float32 and float64: computed in their own type (ATen's opmath for both).
template <typename T, bool kCheck, bool kStore, bool kNorm>
RangeResult full_precision_range(T* data, int64_t n, float factor_in) {
  using Vec = Vectorized<T>;
  const T factor = static_cast<T>(factor_in);
  const Vec vfactor(factor);
  Lanes<Vec> lanes;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec v = Vec::loadu(data + i);
    if (kCheck) lanes.check(v);
    if (kStore || kNorm) {
      const Vec u = v * vfactor;
      if (kStore) u.store(data + i);
      if (kNorm) lanes.square(u);
    }
  }
  RangeResult result;
  lanes.finish(result);
  for (; i < n; ++i) {
    const T u = scalar_step<kCheck, kStore, kNorm>(data[i], factor, result);
    if (kStore) data[i] = u;
  }
  return result;
}

// float16 and bfloat16: widened to float32, multiplied, rounded back to nearest even.
template <typename T, bool kCheck, bool kStore, bool kNorm>
RangeResult reduced_precision_range(T* data, int64_t n, float factor) {
  using Vec = Vectorized<T>;
  using FVec = Vectorized<float>;
  const FVec vfactor(factor);
  Lanes<FVec> lanes;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    auto [lo, hi] = at::vec::convert_to_float<T>(Vec::loadu(data + i));
    if (kCheck) {
      lanes.check(lo);
      lanes.check(hi);
    }
    if (kStore || kNorm) {
      const FVec ulo = lo * vfactor;
      const FVec uhi = hi * vfactor;
      if (kStore) at::vec::convert_from_float<T>(ulo, uhi).store(data + i);
      if (kNorm) {
        lanes.square(ulo);
        lanes.square(uhi);
      }
    }
  }
  RangeResult result;
  lanes.finish(result);
  for (; i < n; ++i) {
    const float u = scalar_step<kCheck, kStore, kNorm>(static_cast<float>(data[i]), factor, result);
    if (kStore) data[i] = static_cast<T>(u);
  }
  return result;
}

template <typename T, bool kCheck, bool kStore, bool kNorm>
RangeResult typed_range(void* data, int64_t n, float factor) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return full_precision_range<T, kCheck, kStore, kNorm>(static_cast<T*>(data), n, factor);
  } else {
    return reduced_precision_range<T, kCheck, kStore, kNorm>(static_cast<T*>(data), n, factor);
  }
}

template <typename T>
RangeResult moded_range(void* data, int64_t n, ListMode mode, float factor) {
  switch (mode) {
    case ListMode::kCheckScale:
      // As ATen: an inv_scale of 1 leaves the values untouched, so only check them (no store).
      if (factor == 1.0f) return typed_range<T, true, false, false>(data, n, factor);
      return typed_range<T, true, true, false>(data, n, factor);
    case ListMode::kCheckNorm:
      return typed_range<T, true, false, true>(data, n, factor);
    case ListMode::kClip:
      return typed_range<T, false, true, false>(data, n, factor);
  }
  return {};
}

}  // namespace

RangeResult AMP_ISA_FN(process_range)(const FlatTensor& tensor, int64_t begin, int64_t end,
                                      ListMode mode, float factor) {
  const int64_t n = end - begin;
  switch (tensor.type) {
    case kernels::Dtype::kFloat:
      return moded_range<float>(static_cast<float*>(tensor.data) + begin, n, mode, factor);
    case kernels::Dtype::kDouble:
      return moded_range<double>(static_cast<double*>(tensor.data) + begin, n, mode, factor);
    case kernels::Dtype::kHalf:
      return moded_range<c10::Half>(static_cast<c10::Half*>(tensor.data) + begin, n, mode, factor);
    case kernels::Dtype::kBFloat16:
      return moded_range<c10::BFloat16>(static_cast<c10::BFloat16*>(tensor.data) + begin, n, mode,
                                        factor);
  }
  return {};
}

}  // namespace amp::detail::cpu
