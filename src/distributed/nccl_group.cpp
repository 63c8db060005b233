// amp::distributed::new_nccl_group: a process group with LibTorch's NCCL backend, compiled only
// in CUDA builds, against the NCCL headers of the torch wheel (their version is checked below).
#include <amp/distributed.h>

#include <nccl.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <ATen/Context.h>

#include "distributed/collective.h"

// ProcessGroupNCCL::Options embeds ncclConfig_t, whose layout changes between NCCL versions: a
// header other than the one LibTorch was built with would silently misplace every field.
static_assert(NCCL_VERSION_CODE == AMP_TORCH_NCCL_VERSION_CODE,
              "amp must compile against the NCCL headers of the torch wheel (site-packages/"
              "nvidia/nccl/include), not another nccl.h on the include path.");

namespace amp::distributed {

bool built_with_nccl() { return true; }

c10::intrusive_ptr<c10d::ProcessGroup> new_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const GroupOptions& options) {
  constexpr const char* kWho = "amp::distributed::new_nccl_group";
  detail::check_group_arguments(store, rank, world_size, options, kWho);
  TORCH_CHECK(at::hasCUDA(), kWho,
              ": CUDA is not available on this machine; use new_gloo_group "
              "for CPU training.");
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(detail::next_group_prefix("nccl"), store);
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout();
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, world_size, nccl_options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(prefixed, rank, world_size);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  return group;
}

}  // namespace amp::distributed
