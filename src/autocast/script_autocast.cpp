// amp::ScriptAutocastGuard and prepare_for_autocast: TorchScript modules run op by op through the
// dispatcher, with the ops eager code calls, so that eager autocast's kernels (not the JIT's
// autocast pass) decide every cast.
#include "amp/autocast.h"

#include <atomic>

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/autocast.h>
#include <torch/csrc/jit/passes/graph_rewrite_helper.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

namespace amp {

namespace {

// Guards alive in the process: the JIT autocast pass (a process-wide setting) stays off while
// any lives, and the last to end restores what the first found.
std::atomic<int> live_guards{0};
std::atomic<bool> jit_autocast_before{false};

}  // namespace

ScriptAutocastGuard::ScriptAutocastGuard()
    : previous_optimize_(torch::jit::getGraphExecutorOptimize()) {
  torch::jit::setGraphExecutorOptimize(false);
  if (live_guards.fetch_add(1) == 0) {
    jit_autocast_before = torch::jit::autocastEnabled();
    torch::jit::setAutocastMode(false);
  }
}

ScriptAutocastGuard::~ScriptAutocastGuard() {
  torch::jit::setGraphExecutorOptimize(previous_optimize_);
  if (live_guards.fetch_sub(1) == 1) torch::jit::setAutocastMode(jit_autocast_before);
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
