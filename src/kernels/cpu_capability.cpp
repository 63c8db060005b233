// The CPU capability pick (cpu_capability.h): AMP_CPU_CAPABILITY's cap, then cpuid.
#include "kernels/cpu_capability.h"

#include <cstdlib>
#include <string>

namespace amp::kernels {

CpuCapability pick_cpu_capability(const char* cap) {
  const std::string limit = cap != nullptr ? cap : "";
  if (limit == "default") return CpuCapability::kDefault;
#if defined(__x86_64__) && defined(__GNUC__)
  if (limit != "avx2" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return CpuCapability::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return CpuCapability::kAvx2;
  }
#endif
  return CpuCapability::kDefault;
}

CpuCapability cpu_capability() {
  static const CpuCapability picked = pick_cpu_capability(std::getenv("AMP_CPU_CAPABILITY"));
  return picked;
}

const char* to_string(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::kAvx512:
      return "avx512";
    case CpuCapability::kAvx2:
      return "avx2";
    case CpuCapability::kDefault:
      break;
  }
  return "default";
}

}  // namespace amp::kernels
