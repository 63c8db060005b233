// The low-precision optimizer steps on the CPU: one pass over the list, split into balanced
// element ranges across threads, each range run by the widest build of the element loops the
// CPU has (low_precision_ranges_*.cpp).
#include "optim/cpu/low_precision_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "optim/cpu/low_precision_ranges.h"

namespace amp::optim::detail {
namespace {

// Below this many elements in the whole list the pass runs on the calling thread (as amp's list
// kernels: a parallel region costs milliseconds on a busy machine).
constexpr int64_t kSerialBelowElems = 1 << 23;
constexpr int64_t kGrainElems = 1 << 15;

struct RangeFns {
  cpu::AdamRangeFn adam;
  cpu::SgdRangeFn sgd;
};

// The widest build this CPU runs; AMP_CPU_CAPABILITY=default|avx2|avx512 caps the choice, as for
// amp's list kernels (so every build can be tested on one machine).
RangeFns pick_range_fns() {
  const char* cap = std::getenv("AMP_CPU_CAPABILITY");
  const std::string limit = cap != nullptr ? cap : "";
  if (limit == "default") return {cpu::adam_range_default, cpu::sgd_range_default};
#if defined(__x86_64__) && defined(__GNUC__)
  if (limit != "avx2" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return {cpu::adam_range_avx512, cpu::sgd_range_avx512};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return {cpu::adam_range_avx2, cpu::sgd_range_avx2};
  }
#endif
  return {cpu::adam_range_default, cpu::sgd_range_default};
}

const RangeFns& range_fns() {
  static const RangeFns fns = pick_range_fns();
  return fns;
}

// Runs range(slot index, begin, end) over all elements of all slots, in balanced ranges.
template <typename Range>
void for_each_range(const std::vector<LowPrecisionSlot>& slots, const Range& range) {
  std::vector<int64_t> offsets(slots.size() + 1, 0);
  for (size_t k = 0; k < slots.size(); ++k) offsets[k + 1] = offsets[k] + slots[k].param.numel();
  const int64_t total = offsets.back();
  if (total == 0) return;
  const int64_t grain = total < kSerialBelowElems ? total : kGrainElems;
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    size_t k = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    for (int64_t pos = begin; pos < end; ++k) {
      const int64_t stop = std::min(end, offsets[k + 1]);
      if (stop > pos) range(k, pos - offsets[k], stop - offsets[k]);
      pos = std::max(pos, stop);
    }
  });
}

bool skipped(const LowPrecisionStep& step) {
  return step.found_inf.defined() && *step.found_inf.data_ptr<float>() != 0.0f;
}

// Counts the step (when the slot keeps a count) and returns the count after the increment.
double count_step(const LowPrecisionSlot& slot) {
  if (!slot.step.defined()) return 0.0;
  float* count = slot.step.data_ptr<float>();
  *count += 1.0f;
  return *count;
}

template <typename S>
S* data(const at::Tensor& t) {
  return t.defined() ? static_cast<S*>(t.data_ptr()) : nullptr;
}

cpu::RangePointers pointers(const LowPrecisionSlot& slot) {
  return {data<void>(slot.param),  data<void>(slot.grad),   data<float>(slot.master),
          data<void>(slot.comp),   data<void>(slot.state0), data<void>(slot.state1),
          data<void>(slot.state2)};
}

// One family's step: skip on the flag, count each slot's step, take its constants
// (`scalars_for(slot, count, scale)`), then run every element range with `range_fn`.
template <typename Scalars, typename RangeFn, typename ScalarsFor>
void run_family(const std::vector<LowPrecisionSlot>& slots, const LowPrecisionStep& step,
                bool flag, RangeFn range_fn, const ScalarsFor& scalars_for) {
  if (slots.empty() || skipped(step)) return;
  const bool unscale = step.grad_scale.defined();
  const float scale = unscale ? *step.grad_scale.data_ptr<float>() : 1.0f;
  std::vector<Scalars> scalars;
  std::vector<uint64_t> keys;
  std::vector<cpu::RangePointers> ptrs;
  for (const LowPrecisionSlot& slot : slots) {
    const double count = count_step(slot);
    scalars.push_back(scalars_for(slot, count, scale));
    keys.push_back(lp::tensor_key(step.seed, slot.stream, static_cast<uint64_t>(count)));
    ptrs.push_back(pointers(slot));
  }
  const cpu::RangeKind kind{slots[0].param.scalar_type(), step.state_dtype, step.write_back, flag};
  for_each_range(slots, [&](size_t k, int64_t begin, int64_t end) {
    range_fn(kind, ptrs[k], scalars[k], keys[k], unscale, begin, end);
  });
}

}  // namespace

namespace cpu {

void unsupported_range_kind(const RangeKind& kind) {
  TORCH_CHECK(kind.param_dtype == c10::kBFloat16 || kind.param_dtype == c10::kHalf,
              "low-precision optimizer kernels take bfloat16 or float16 parameters, not ",
              kind.param_dtype);
  TORCH_CHECK(kind.write_back != WriteBack::kStochastic || kind.param_dtype == c10::kBFloat16,
              "stochastic rounding writes bfloat16 parameters only");
  TORCH_CHECK(false, "low-precision optimizer state of dtype ", kind.state_dtype,
              " is not supported");
}

}  // namespace cpu

void adam_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const AdamHyper& h,
                            const LowPrecisionStep& step) {
  run_family<AdamScalars>(slots, step, h.amsgrad, range_fns().adam,
                          [&](const LowPrecisionSlot&, double count, float scale) {
                            return lp::adam_scalars(h, count, scale);
                          });
}

void sgd_low_precision_cpu(const std::vector<LowPrecisionSlot>& slots, const SgdHyper& h,
                           const LowPrecisionStep& step) {
  run_family<SgdScalars>(slots, step, h.momentum != 0.0, range_fns().sgd,
                         [&](const LowPrecisionSlot& slot, double, float scale) {
                           return lp::sgd_scalars(h, slot.first_momentum, scale);
                         });
}

}  // namespace amp::optim::detail
