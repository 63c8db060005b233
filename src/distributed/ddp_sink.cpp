// DistributedDataParallel's sink: Python's _DDPSink, the autograd node its outputs pass through
// when searching for unused parameters and in a static graph's first iteration.
#include <utility>

#include <torch/csrc/autograd/custom_function.h>

#include "distributed/ddp_parts.h"

namespace amp::distributed::detail {
namespace {

// Python's _DDPSink: the outputs pass through this node. With find_unused_parameters, an output
// the loss does not use still gets an (undefined) gradient through it, so the parameters behind
// it, which the graph search counted as used, report to the Reducer instead of being waited for.
// In a static_graph model's first iteration its backward queues the Reducer's delayed all-reduce
// to run when backward completes (how DDP learns the static graph).
struct OnBackward : torch::CustomClassHolder {
  explicit OnBackward(std::function<void()> run) : run(std::move(run)) {}
  std::function<void()> run;  // may be empty
};

struct DdpSink : torch::autograd::Function<DdpSink> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList outputs,
                                                c10::intrusive_ptr<OnBackward> on_backward) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["on_backward"] = c10::IValue::make_capsule(std::move(on_backward));
    // Clones, as Python's sink returns: an input returned as it is comes back as a view of it,
    // and autograd then refuses in-place changes (`loss /= accumulation;`).
    torch::autograd::variable_list passed;
    passed.reserve(outputs.size());
    for (const auto& output : outputs) passed.push_back(output.clone());
    return passed;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto on_backward = c10::static_intrusive_pointer_cast<OnBackward>(
        ctx->saved_data.at("on_backward").toCapsule());
    if (on_backward->run) on_backward->run();
    grads.emplace_back();  // none for on_backward
    return grads;
  }
};

}  // namespace

torch::autograd::variable_list pass_through_sink(const torch::autograd::variable_list& outputs,
                                                 std::function<void()> on_backward) {
  return DdpSink::apply(at::TensorList(outputs),
                        c10::make_intrusive<OnBackward>(std::move(on_backward)));
}

}  // namespace amp::distributed::detail
