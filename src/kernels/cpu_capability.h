// Which build of amp's CPU element loops runs: each loop file is compiled for baseline x86-64,
// AVX2 (+FMA, F16C) and AVX-512 (amp_isa_sources in cmake/AmpKernels.cmake), and one pick here,
// made once per process, chooses among them for every kernel family.
#pragma once

#include <cstdint>

namespace amp::kernels {

/// An instruction-set level of the CPU loops, narrowest first.
enum class CpuCapability : uint8_t { kDefault, kAvx2, kAvx512 };

/// The widest level this CPU runs, capped by the environment variable AMP_CPU_CAPABILITY
/// (default, avx2 or avx512, as ATEN_CPU_CAPABILITY caps ATen's) so that every build can be
/// tested on one machine; a value the CPU cannot run, or an unknown one, is ignored. Read once.
CpuCapability cpu_capability();

/// The pick itself for a given cap (nullptr or "" for none), uncached.
CpuCapability pick_cpu_capability(const char* cap);

/// "default", "avx2" or "avx512".
const char* to_string(CpuCapability capability);

/// One kernel per level: the functions the three builds of a loop file export. Only baseline
/// translation units refer to them (an ISA file defines its function and nothing shared, see
/// cmake/AmpKernels.cmake).
template <typename Fn>
struct CpuKernels {
  Fn default_isa;
  Fn avx2;
  Fn avx512;

  /// The function for cpu_capability().
  Fn for_this_cpu() const {
    switch (cpu_capability()) {
      case CpuCapability::kAvx512:
        return avx512;
      case CpuCapability::kAvx2:
        return avx2;
      case CpuCapability::kDefault:
        break;
    }
    return default_isa;
  }
};

}  // namespace amp::kernels
