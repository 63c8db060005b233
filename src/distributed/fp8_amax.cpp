// amp::distributed::amax_all_reduce: the float8 delayed recipe's amaxes reduced (MAX) over a
// process group, so every rank derives the same scales.
#include <amp/distributed.h>

#include <vector>

#include <ATen/core/Tensor.h>

#include "distributed/collective.h"

namespace amp::distributed {

std::function<void(const at::Tensor& amax)> amax_all_reduce(
    c10::intrusive_ptr<c10d::ProcessGroup> group) {
  static constexpr const char* kWho = "amp::distributed::amax_all_reduce";
  detail::check_group(group, kWho);
  return [group = std::move(group)](const at::Tensor& amax) {
    detail::check_group_serves(group, amax.device().type(), kWho, "the float8 amaxes");
    // A one-element view of the 0-dim amax: the all-reduce writes the maximum into it.
    std::vector<at::Tensor> tensors{amax.reshape({1})};
    detail::wait_for(detail::start_all_reduce(*group, tensors, c10d::ReduceOp::MAX,
                                              "the float8 amax all-reduce"),
                     *group, "the float8 amax all-reduce");
  };
}

}  // namespace amp::distributed
