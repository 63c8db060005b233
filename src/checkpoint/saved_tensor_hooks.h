// Saved-tensor hooks for C++ programs: what Python's torch.autograd.graph.saved_tensors_hooks
// does, which LibTorch offers only to Python. Every tensor autograd saves for backward asks the
// engine for default hooks; amp installs an engine (LibTorch's, with that one question answered)
// that asks the innermost provider pushed on the calling thread.
#pragma once

#include <memory>

#include <torch/csrc/autograd/saved_variable_hooks.h>

namespace amp::detail {

/// Makes the hooks of each tensor saved for backward while it is the innermost provider of its
/// thread.
class SavedTensorHooksProvider {
 public:
  virtual ~SavedTensorHooksProvider() = default;
  /// Hooks for one saved tensor; nullptr saves it as autograd does by default.
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() = 0;
};

/// Pushes `provider` as the calling thread's innermost provider until destroyed (LIFO). The
/// first one ever installs amp's autograd engine; throws c10::Error, changing nothing, when the
/// process already runs another engine than LibTorch's own (a Python process: there, use
/// torch.utils.checkpoint).
class SavedTensorHooksScope {
 public:
  explicit SavedTensorHooksScope(SavedTensorHooksProvider& provider);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;
};

}  // namespace amp::detail
