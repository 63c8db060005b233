// Launch planning for multi-tensor kernels (see launch_plan.h).
#include "kernels/launch_plan.h"

#include <c10/util/Exception.h>

namespace amp::kernels {

std::vector<PlannedLaunch> plan_launches(c10::ArrayRef<int64_t> numels,
                                         const LaunchLimits& limits) {
  TORCH_CHECK(limits.chunk_elems > 0 && limits.chunk_elems % 8 == 0,
              "plan_launches: chunk_elems must be a positive multiple of 8, but got ",
              limits.chunk_elems, ".");
  TORCH_CHECK(limits.max_tensors > 0 && limits.max_blocks > 0,
              "plan_launches: max_tensors and max_blocks must be positive, but got ",
              limits.max_tensors, " and ", limits.max_blocks, ".");
  std::vector<PlannedLaunch> launches;
  PlannedLaunch current;
  const auto flush = [&] {
    if (!current.blocks.empty()) launches.push_back(std::move(current));
    current = PlannedLaunch{};
  };
  for (int64_t i = 0; i < static_cast<int64_t>(numels.size()); ++i) {
    TORCH_CHECK(numels[i] >= 0, "plan_launches: numels[", i, "] must be >= 0, but got ", numels[i],
                ".");
    if (numels[i] == 0) continue;
    const int64_t chunks = (numels[i] + limits.chunk_elems - 1) / limits.chunk_elems;
    for (int64_t c = 0; c < chunks; ++c) {
      const bool tensor_listed = !current.tensors.empty() && current.tensors.back() == i;
      if (!tensor_listed) {
        if (static_cast<int64_t>(current.tensors.size()) == limits.max_tensors) flush();
        current.tensors.push_back(i);
      }
      current.blocks.push_back(PlannedBlock{static_cast<int32_t>(current.tensors.size() - 1), c});
      if (static_cast<int64_t>(current.blocks.size()) == limits.max_blocks) flush();
    }
  }
  flush();
  return launches;
}

}  // namespace amp::kernels
