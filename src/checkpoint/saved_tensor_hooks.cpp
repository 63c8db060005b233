// amp's autograd engine: LibTorch's Engine, answering get_default_saved_variable_hooks() from the
// calling thread's stack of providers (saved_tensor_hooks.h). Installed once, through LibTorch's
// own engine stub, the way Python installs its engine.
#include "checkpoint/saved_tensor_hooks.h"

#include <mutex>
#include <typeinfo>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

namespace amp::detail {
namespace {

thread_local std::vector<SavedTensorHooksProvider*> providers;

class HookingEngine final : public torch::autograd::Engine {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    return providers.empty() ? nullptr : providers.back()->make_hooks();
  }

  static torch::autograd::Engine& get() {
    static HookingEngine engine;
    return engine;
  }
};

void install_engine() {
  static std::once_flag once;
  std::call_once(once, [] {
    const auto& current = torch::autograd::Engine::get_default_engine();
    TORCH_CHECK(typeid(current) == typeid(torch::autograd::Engine),
                "amp::checkpoint needs LibTorch's own autograd engine, but this process runs "
                "another (",
                typeid(current).name(),
                "; in a Python process, Python's). Use torch.utils.checkpoint from Python.");
    torch::autograd::set_default_engine_stub(&HookingEngine::get);
  });
}

}  // namespace

SavedTensorHooksScope::SavedTensorHooksScope(SavedTensorHooksProvider& provider) {
  install_engine();
  providers.push_back(&provider);
}

SavedTensorHooksScope::~SavedTensorHooksScope() { providers.pop_back(); }

}  // namespace amp::detail
