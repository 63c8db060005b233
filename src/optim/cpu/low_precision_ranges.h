// The element loops of the low-precision optimizer steps on the CPU, built once per instruction
// set (baseline x86-64, AVX2+FMA+F16C, AVX-512; low_precision_ranges_*.cpp) and picked at run
// time by low_precision_kernels.cpp, as amp's list kernels are.
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "optim/low_precision_element.h"

namespace amp::optim::detail::cpu {

/// Which instantiation of the loop a range runs.
struct RangeKind {
  c10::ScalarType param_dtype;  // BFloat16 or Half
  c10::ScalarType state_dtype;  // Float, BFloat16 or Half
  WriteBack write_back;
  bool flag;  // Adam: amsgrad; SGD: momentum
};

/// One parameter's data (null where the step keeps no such tensor).
struct RangePointers {
  void* param;
  void* grad;
  float* master;
  void* comp;
  void* state0;
  void* state1;
  void* state2;
};

/// Throws the sentence for a kind no loop is built for (defined in low_precision_kernels.cpp, so
/// that the per-instruction-set files instantiate none of c10's error helpers).
[[noreturn]] void unsupported_range_kind(const RangeKind& kind);

/// Elements [begin, end) of one parameter: the update, then (with `unscale`) the unscaled
/// gradients written back.
using AdamRangeFn = void (*)(const RangeKind&, const RangePointers&, const AdamScalars&,
                             uint64_t key, bool unscale, int64_t begin, int64_t end);
using SgdRangeFn = void (*)(const RangeKind&, const RangePointers&, const SgdScalars&,
                            uint64_t key, bool unscale, int64_t begin, int64_t end);

void adam_range_default(const RangeKind&, const RangePointers&, const AdamScalars&, uint64_t,
                        bool, int64_t, int64_t);
void adam_range_avx2(const RangeKind&, const RangePointers&, const AdamScalars&, uint64_t, bool,
                     int64_t, int64_t);
void adam_range_avx512(const RangeKind&, const RangePointers&, const AdamScalars&, uint64_t, bool,
                       int64_t, int64_t);
void sgd_range_default(const RangeKind&, const RangePointers&, const SgdScalars&, uint64_t, bool,
                       int64_t, int64_t);
void sgd_range_avx2(const RangeKind&, const RangePointers&, const SgdScalars&, uint64_t, bool,
                    int64_t, int64_t);
void sgd_range_avx512(const RangeKind&, const RangePointers&, const SgdScalars&, uint64_t, bool,
                      int64_t, int64_t);

}  // namespace amp::optim::detail::cpu
