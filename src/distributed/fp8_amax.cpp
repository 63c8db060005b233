// amp::distributed::amax_all_reduce: the float8 delayed recipe's amaxes reduced (MAX) over a
// process group, so every rank derives the same scales.
#include <amp/distributed.h>

#include <vector>

#include <ATen/core/Tensor.h>

#include "distributed/collective.h"
#include "fp8/amax_batch.h"

namespace amp::distributed {

std::function<void(const at::Tensor& amax)> amax_all_reduce(
    c10::intrusive_ptr<c10d::ProcessGroup> group) {
  static constexpr const char* kWho = "amp::distributed::amax_all_reduce";
  detail::check_group(group, kWho);
  const void* ranks = group.get();
  // Batched: the float8 code collects the amaxes of all casts since the last flush into one 1-d
  // tensor and calls this once for them (amp/fp8.h, flush_delayed_scaling).
  return fp8::detail::batched_amax_reduction(
      ranks, [group = std::move(group)](const at::Tensor& amaxes) {
        detail::check_group_serves(group, amaxes.device().type(), kWho, "the float8 amaxes");
        std::vector<at::Tensor> tensors{amaxes};
        detail::wait_for(detail::start_all_reduce(*group, tensors, c10d::ReduceOp::MAX,
                                                  "the float8 amax all-reduce"),
                         *group, "the float8 amax all-reduce");
      });
}

}  // namespace amp::distributed
