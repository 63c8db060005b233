// amp::ScriptAutocastGuard and prepare_for_autocast: TorchScript modules run op by op through the
// dispatcher, with the ops eager code calls, so that eager autocast's kernels (not the JIT's
// autocast pass) decide every cast.
#include "amp/autocast.h"

#include <mutex>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/autocast.h>
#include <torch/csrc/jit/passes/graph_rewrite_helper.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

namespace amp {

namespace {

// Guards alive in the process: the JIT autocast pass (a process-wide setting) stays off while
// any lives, and the last to end restores what the first found. The count, the saved setting and
// the JIT's switch change together under one lock: with them apart, one thread's last guard could
// end while another's first began, and the second would save "off" as the setting to restore.
struct LiveGuards {
  std::mutex lock;
  int count = 0;
  bool jit_autocast_before = false;
};

LiveGuards& live_guards() {
  static LiveGuards guards;
  return guards;
}

// aten::_convolution under CPU autocast: what torch.jit.trace records for a convolution, and
// what CPU autocast does not cast (its list names conv1d/conv2d/conv3d; CUDA's names both). A
// traced module loaded without prepare_for_autocast would run its convolutions in float32 and say
// nothing; this kernel at the AutocastCPU key says so once, then runs the op as before.
void warn_uncast_convolution(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                             torch::jit::Stack* stack) {
  TORCH_WARN_ONCE(
      "aten::_convolution runs under CPU autocast in its inputs' dtype (float32): CPU autocast "
      "casts conv1d/conv2d/conv3d and conv_transpose, not aten::_convolution, which "
      "torch.jit.trace records for a convolution. Call amp::prepare_for_autocast(module) once "
      "after torch::jit::load so that a traced module's convolutions run as eager autocast runs "
      "them.");
  op.redispatchBoxed(
      keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::AutocastCPU),
      stack);
}

TORCH_LIBRARY_IMPL(aten, AutocastCPU, m) {
  // Only the current overload: CPU autocast already casts _convolution.deprecated.
  m.impl("_convolution", torch::CppFunction::makeFromBoxedFunction<&warn_uncast_convolution>());
}

}  // namespace

ScriptAutocastGuard::ScriptAutocastGuard()
    : previous_optimize_(torch::jit::getGraphExecutorOptimize()) {
  torch::jit::setGraphExecutorOptimize(false);
  LiveGuards& guards = live_guards();
  const std::lock_guard<std::mutex> hold(guards.lock);
  if (guards.count++ == 0) {
    guards.jit_autocast_before = torch::jit::autocastEnabled();
    torch::jit::setAutocastMode(false);
  }
}

ScriptAutocastGuard::~ScriptAutocastGuard() {
  torch::jit::setGraphExecutorOptimize(previous_optimize_);
  LiveGuards& guards = live_guards();
  const std::lock_guard<std::mutex> hold(guards.lock);
  if (--guards.count == 0) torch::jit::setAutocastMode(guards.jit_autocast_before);
}

void prepare_for_autocast(torch::jit::Module& module) {
  for (const torch::jit::Module& part : module.modules()) {
    for (const torch::jit::Method& method : part.get_methods()) {
      std::shared_ptr<torch::jit::Graph> graph = method.graph();
      torch::jit::graph_rewrite_helper::replaceConvolutionWithAtenConv(graph);
    }
  }
}

}  // namespace amp
