// amp::checkpoint: activation checkpointing for LibTorch, as Python's
// torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False): a function's intermediate
// activations are not kept for backward but recomputed when backward needs them, under the
// autocast state, float8 region and RNG state of the original forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <amp/export.h>

namespace amp {

/// What the recomputation is compared with (Python's `determinism_check`).
enum class DeterminismCheck {
  /// Every tensor saved for backward has the same shape, dtype and device in the recomputation
  /// as in the forward, and as many are saved; otherwise backward throws ("default").
  kDefault,
  /// No comparison ("none").
  kNone,
};

/// Options of amp::checkpoint, named and defaulted as torch.utils.checkpoint's.
struct CheckpointOptions {
  /// Restore the CPU RNG state (and the CUDA states of the devices of the tensor arguments) of
  /// the forward for the recomputation, so that dropout draws the same mask; the states after the
  /// recomputation are those before it.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// See DeterminismCheck.
  TORCH_ARG(DeterminismCheck, determinism_check) = DeterminismCheck::kDefault;
  /// Stop the recomputation as soon as every tensor backward needs from it exists.
  TORCH_ARG(bool, early_stop) = true;
};

namespace detail {

template <typename T>
constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, at::Tensor>;

template <typename T>
void collect_tensor(const T& value, std::vector<at::Tensor>& tensors) {
  if constexpr (kIsTensor<T>) tensors.push_back(value);
}

// The argument kept for the recomputation: a tensor is kept by the checkpoint itself (saved for
// backward, so that an enclosing checkpoint need not keep it either), anything else as it is.
template <typename T>
T without_tensor(const T& value) {
  if constexpr (kIsTensor<T>) {
    return T();
  } else {
    return value;
  }
}

template <typename T>
T with_tensor(const T& value, const std::vector<at::Tensor>& tensors, size_t& next) {
  if constexpr (kIsTensor<T>) {
    return tensors[next++];
  } else {
    return value;
  }
}

/// The engine behind amp::checkpoint (src/checkpoint/checkpoint.cpp): runs `forward` (the call
/// with the user's arguments) so that the tensors autograd saves in it are dropped, and keeps
/// `recompute` (the same call on the given tensor arguments) to rebuild them in backward.
AMP_EXPORT void run_checkpointed(const CheckpointOptions& options,
                                 const std::vector<at::Tensor>& tensor_args,
                                 std::function<void(const std::vector<at::Tensor>&)> recompute,
                                 const std::function<void()>& forward);

}  // namespace detail

/// Runs `fn(args...)` and returns its result, keeping none of the tensors the function's
/// operations save for backward (activations); backward recomputes them by running `fn` again on
/// the same arguments, as Python's `torch.utils.checkpoint.checkpoint(fn, *args,
/// use_reentrant=False)` does. The recomputation runs under the forward's autocast state (CPU
/// and CUDA: enabled, dtype, cache), float8 region (amp::fp8) and, with preserve_rng_state, RNG
/// states (so dropout draws the same mask), in grad mode; it happens at most once per backward
/// (per `backward()` or `torch::autograd::grad` call), when the first dropped tensor is needed,
/// and stops once it has rebuilt them all (early_stop).
///
/// Works with any autograd graph: several outputs (a tuple or vector), inputs that do not
/// require grad, non-tensor arguments (copied and passed again), nested checkpoints,
/// `torch::autograd::grad` as well as `backward()`, GradScaler, amp's optimizers, DDP, bfloat16
/// weights and amp::fp8 layers (delayed scaling's histories are updated by the forward only: the
/// recomputation casts with the forward's scales, as Transformer Engine does).
///
/// `fn` is kept for backward (by value: a lambda capturing a model by reference must outlive the
/// backward), and so are the tensor arguments (saved for backward: modifying one in place before
/// backward is an error, as for any saved tensor). Without grad mode `fn` simply runs.
///
/// Errors (c10::Error, in backward): the recomputation saved other tensors than the forward
/// (DeterminismCheck), a second backward through a graph already freed (LibTorch's sentence),
/// an argument modified in place since the forward, a saved tensor unpacked twice; at the call:
/// a process whose autograd engine is not LibTorch's (Python's).
template <typename Fn, typename... Args>
auto checkpoint(const CheckpointOptions& options, Fn fn, Args... args)
    -> std::invoke_result_t<Fn&, Args&...> {
  using Result = std::invoke_result_t<Fn&, Args&...>;
  std::vector<at::Tensor> tensors;
  (detail::collect_tensor(args, tensors), ...);
  auto kept_fn = std::make_shared<Fn>(fn);
  auto kept_args = std::make_shared<std::tuple<Args...>>(detail::without_tensor(args)...);
  std::optional<Result> result;
  detail::run_checkpointed(
      options, tensors,
      [kept_fn, kept_args](const std::vector<at::Tensor>& inputs) {
        std::apply(
            [&](const auto&... kept) {
              size_t next = 0;
              // A braced list evaluates left to right: the tensors go back in order.
              std::tuple<Args...> again{detail::with_tensor(kept, inputs, next)...};
              std::apply(*kept_fn, again);
            },
            *kept_args);
      },
      [&] { result.emplace(fn(args...)); });
  return std::move(*result);
}

/// checkpoint with the default options.
template <typename Fn, typename... Args,
          typename = std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, CheckpointOptions>>>
auto checkpoint(Fn fn, Args... args) -> std::invoke_result_t<Fn&, Args&...> {
  return checkpoint(CheckpointOptions{}, std::move(fn), std::move(args)...);
}

/// Python's torch.utils.checkpoint.checkpoint_sequential: `sequential`'s modules split into
/// `segments` runs of len / segments modules (the last segment takes the rest); every segment
/// but the last is checkpointed, the last runs as usual. Throws c10::Error when `segments` is not
/// in [1, number of modules].
AMP_EXPORT at::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, int64_t segments,
                                            const at::Tensor& input,
                                            const CheckpointOptions& options = {});

/// A module whose forward is `module`'s, checkpointed: put it where the module was (in a
/// Sequential, a ModuleList, a member holder) and the model's own forward needs no change. The
/// wrapped module is registered as "module" (its parameters are "module.<name>").
/// forward(input) -> `module`'s forward(input) (a tensor to a tensor).
class AMP_EXPORT CheckpointWrapperImpl : public torch::nn::Module {
 public:
  /// Wraps `module` (any module holder or AnyModule with forward(Tensor) -> Tensor).
  explicit CheckpointWrapperImpl(torch::nn::AnyModule module, CheckpointOptions options = {});
  /// The wrapped module's forward, under amp::checkpoint.
  at::Tensor forward(const at::Tensor& input);
  /// The wrapped module.
  const torch::nn::AnyModule& wrapped() const { return module_; }
  /// Prints "amp::CheckpointWrapper(<the wrapped module>)".
  void pretty_print(std::ostream& stream) const override;

 private:
  torch::nn::AnyModule module_;
  CheckpointOptions options_;
};
/// The module holder of CheckpointWrapperImpl (a shared pointer to it, as torch::nn::Linear is
/// to LinearImpl): `amp::CheckpointWrapper(torch::nn::AnyModule(layer))`.
TORCH_MODULE(CheckpointWrapper);

}  // namespace amp
