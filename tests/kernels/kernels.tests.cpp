// amp's kernel platform (src/kernels): the CUDA launch planner's invariants, the CPU capability
// pick and its cap, and device dispatch's entries and sentences. Host code only: it runs on
// every machine.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu_capability.h"
#include "kernels/dispatch.h"
#include "kernels/launch_plan.h"

namespace {

int cpu_entry() { return 1; }
int cuda_entry() { return 2; }

}  // namespace

TEST_CASE("The launch planner covers every element once within its limits", "[kernels][plan]") {
  const amp::kernels::LaunchLimits limits{64, 5, 7};
  const std::vector<int64_t> sizes = {0, 1, 63, 64, 65, 0, 640, 3, 129, 1000, 1, 1, 1, 1, 1, 1};
  const auto launches = amp::kernels::plan_launches(sizes, limits);
  std::vector<std::vector<int>> covered(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) covered[i].assign(sizes[i], 0);
  for (const auto& launch : launches) {
    REQUIRE(!launch.blocks.empty());
    REQUIRE(static_cast<int64_t>(launch.tensors.size()) <= limits.max_tensors);
    REQUIRE(static_cast<int64_t>(launch.blocks.size()) <= limits.max_blocks);
    for (const auto& block : launch.blocks) {
      REQUIRE(block.slot < static_cast<int32_t>(launch.tensors.size()));
      const int64_t t = launch.tensors[block.slot];
      const int64_t begin = block.chunk * limits.chunk_elems;
      REQUIRE(begin < sizes[t]);
      for (int64_t e = begin; e < std::min(sizes[t], begin + limits.chunk_elems); ++e) {
        covered[t][e] += 1;
      }
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int c : covered[i]) REQUIRE(c == 1);
  }
  // Packing is tight: a launch is cut only when one of its limits is reached.
  for (size_t l = 0; l + 1 < launches.size(); ++l) {
    CHECK((static_cast<int64_t>(launches[l].blocks.size()) == limits.max_blocks ||
           static_cast<int64_t>(launches[l].tensors.size()) == limits.max_tensors));
  }
}

TEST_CASE("The launch planner handles tensors beyond 2^31 elements", "[kernels][plan]") {
  const int64_t big = (int64_t{1} << 33) + 5;
  const amp::kernels::LaunchLimits limits{65536, 256, 3072};
  const auto launches = amp::kernels::plan_launches(std::vector<int64_t>{big, 10}, limits);
  int64_t blocks = 0, last_chunk = -1;
  for (const auto& launch : launches) {
    for (const auto& block : launch.blocks) {
      if (launch.tensors[block.slot] == 0) {
        REQUIRE(block.chunk == last_chunk + 1);
        last_chunk = block.chunk;
      }
      ++blocks;
    }
  }
  CHECK(last_chunk * limits.chunk_elems < big);
  CHECK((last_chunk + 1) * limits.chunk_elems >= big);
  CHECK(blocks == last_chunk + 2);
  CHECK_THROWS_WITH(amp::kernels::plan_launches(std::vector<int64_t>{1}, {60, 1, 1}),
                    Catch::Contains("chunk_elems must be a positive multiple of 8, but got 60"));
}

TEST_CASE("The CPU capability cap picks a narrower build, never a wider one", "[kernels]") {
  using amp::kernels::CpuCapability;
  using amp::kernels::pick_cpu_capability;
  const CpuCapability widest = pick_cpu_capability(nullptr);
  CHECK(pick_cpu_capability("") == widest);
  CHECK(pick_cpu_capability("default") == CpuCapability::kDefault);
  CHECK(pick_cpu_capability("avx2") <= CpuCapability::kAvx2);
  CHECK(pick_cpu_capability("avx2") <= widest);
  CHECK(pick_cpu_capability("avx512") == widest);   // a cap, not a request
  CHECK(pick_cpu_capability("sse9000") == widest);  // unknown: ignored
  CHECK(std::string(amp::kernels::to_string(CpuCapability::kAvx512)) == "avx512");
  // CpuKernels picks the function of the process's capability.
  const amp::kernels::CpuKernels<int (*)()> kernels{[] { return 0; }, [] { return 1; },
                                                    [] { return 2; }};
  CHECK(kernels.for_this_cpu()() == static_cast<int>(amp::kernels::cpu_capability()));
}

TEST_CASE("Device dispatch gives the CPU entry, the registered CUDA one, and sentences otherwise",
          "[kernels]") {
  amp::kernels::DeviceDispatch<int (*)()> dispatch("the test kernel", cpu_entry);
  CHECK(dispatch[c10::DeviceType::CPU]() == 1);
  CHECK_THROWS_WITH(dispatch[c10::DeviceType::CUDA],
                    Catch::Contains("amp: the test kernel has no CUDA kernel in this build of amp "
                                    "(AMP_WITH_CUDA=OFF)"));
  CHECK_THROWS_WITH(dispatch[c10::DeviceType::XPU],
                    Catch::Contains("amp: the test kernel runs on CPU and CUDA tensors, not on "
                                    "xpu."));
  dispatch.register_cuda(cuda_entry);
  CHECK(dispatch[c10::DeviceType::CUDA]() == 2);
}
