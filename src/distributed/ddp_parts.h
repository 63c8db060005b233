// The pieces of DistributedDataParallel that stand on their own: amp's comm hooks
// (ddp_comm_hooks.cpp) and the sink its outputs pass through (ddp_sink.cpp).
#pragma once

#include <functional>
#include <memory>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <amp/distributed.h>

namespace amp::distributed::detail {

/// How DistributedDataParallel names itself in errors.
constexpr const char* kDdpName = "amp::distributed::DistributedDataParallel";

/// The hook for `kind`: each bucket all-reduced over `group` with Python's arithmetic for that
/// hook; a failure arrives as a sentence naming the bucket, the rank and the world size.
std::unique_ptr<c10d::CommHookInterface> make_comm_hook(
    c10::intrusive_ptr<c10d::ProcessGroup> group, CommHook kind);

/// Python's _DDPSink: returns clones of `outputs` (all requiring grad) behind one autograd node,
/// whose backward runs `on_backward` (may be empty) and passes undefined gradients through as
/// undefined (an output the loss leaves out reports to the Reducer instead of being waited for).
torch::autograd::variable_list pass_through_sink(const torch::autograd::variable_list& outputs,
                                                 std::function<void()> on_backward);

}  // namespace amp::distributed::detail
