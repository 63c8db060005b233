// amp::checkpoint: activation checkpointing for LibTorch, as Python's
// torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False): a function's intermediate
// activations are not kept for backward but recomputed when backward needs them, under the
// autocast state, float8 region and RNG state of the original forward.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <amp/export.h>

namespace amp {

/// What the recomputation is compared with (Python's `determinism_check`).
enum class DeterminismCheck {
  /// Every tensor saved for backward has the same shape, dtype and device in the recomputation
  /// as in the forward, and as many are saved; otherwise backward throws ("default").
  kDefault,
  /// Only the count is compared ("none": Python too counts the tensors whatever the check).
  kNone,
};

/// Options of amp::checkpoint, named and defaulted as torch.utils.checkpoint's.
struct CheckpointOptions {
  /// Restore the CPU RNG state (and the states of the CUDA devices of the tensor arguments, those
  /// nested in vectors, arrays, tuples, optionals and maps included, as Python's tree_map) of
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

template <typename T, typename = void>
struct IsRange : std::false_type {};
template <typename T>
struct IsRange<T, std::void_t<decltype(std::begin(std::declval<const T&>())),
                              decltype(std::end(std::declval<const T&>()))>> : std::true_type {};

template <typename T, typename = void>
struct IsTupleLike : std::false_type {};
template <typename T>
struct IsTupleLike<T, std::void_t<decltype(std::tuple_size<T>::value)>> : std::true_type {};

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

// Calls `visit` on every tensor in `value`: the value itself, or the tensors inside an optional,
// a pair or tuple, or a range (std::vector, std::array, at::TensorList, a map's values), nested
// to any depth, as Python's tree_map walks a checkpoint's arguments.
template <typename T, typename Visit>
void for_each_tensor(const T& value, const Visit& visit) {
  using V = std::decay_t<T>;
  if constexpr (kIsTensor<V>) {
    visit(value);
  } else if constexpr (IsOptional<V>::value) {
    if (value) for_each_tensor(*value, visit);
  } else if constexpr (std::is_same_v<V, std::string>) {
    // characters hold no tensor
  } else if constexpr (IsTupleLike<V>::value) {
    std::apply([&](const auto&... items) { (for_each_tensor(items, visit), ...); }, value);
  } else if constexpr (IsRange<V>::value) {
    for (const auto& item : value) for_each_tensor(item, visit);
  }
}

// The devices (other than the CPU) of every tensor in the arguments, nested ones included, each
// once: the generators whose states the recomputation restores.
template <typename... Args>
std::vector<c10::Device> accelerator_devices(const Args&... args) {
  std::vector<c10::Device> devices;
  const auto add = [&devices](const at::Tensor& t) {
    if (!t.defined() || t.device().is_cpu() || t.device().is_meta()) return;
    for (const auto& d : devices) {
      if (d == t.device()) return;
    }
    devices.push_back(t.device());
  };
  (for_each_tensor(args, add), ...);
  return devices;
}

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
/// `rng_devices`: the devices, besides the CPU, whose generator states the recomputation restores.
AMP_EXPORT void run_checkpointed(const CheckpointOptions& options,
                                 const std::vector<at::Tensor>& tensor_args,
                                 const std::vector<c10::Device>& rng_devices,
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
/// `torch::autograd::grad` as well as `backward()`, a backward inside `fn` itself (a derivative
/// loss: it runs through the recomputation's own graph, as Python's rule 6), GradScaler, amp's
/// optimizers, DDP, bfloat16 weights and amp::fp8 layers (their float8 copies are dropped with the
/// activations; delayed scaling's histories are updated by the forward only: the recomputation
/// casts with the forward's scales, as Transformer Engine does).
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
      options, tensors, detail::accelerator_devices(args...),
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

/// A module whose forward is `module`'s, checkpointed: put it where the module was in a
/// Sequential (or anything that calls it through AnyModule or the holder's forward), and the
/// model's own forward needs no change. A forward that casts its submodules to their own type
/// (`list[i]->as<Block>()` on a ModuleList) finds the wrapper instead: there, call the wrapper's
/// forward, or reach the module with `wrapped().get<Block>()`.
///
/// Names, as Python's checkpoint_wrapper: the wrapped module is registered as the child "module",
/// so the module tree (named_modules, apply, named_parameters: "<name>.module.weight") shows it,
/// but checkpoints do not. torch::save writes the wrapped module's parameters, buffers and
/// children at the wrapper's own level ("<name>.weight"), and torch::load reads them there, so a
/// checkpoint of the unwrapped model loads into the wrapped one and back. (LibTorch's
/// named_parameters is not virtual, so unlike Python's it keeps the "module." level.) A
/// checkpoint written by amp 0.1, with the "module" level, still loads.
/// forward(input) -> `module`'s forward(input) (a tensor to a tensor).
class AMP_EXPORT CheckpointWrapperImpl : public torch::nn::Module {
 public:
  /// Wraps `module` (any module holder or AnyModule with forward(Tensor) -> Tensor).
  explicit CheckpointWrapperImpl(torch::nn::AnyModule module, CheckpointOptions options = {});
  /// The wrapped module's forward, under amp::checkpoint.
  at::Tensor forward(const at::Tensor& input);
  /// The wrapped module.
  const torch::nn::AnyModule& wrapped() const { return module_; }
  /// The options every forward checkpoints with.
  const CheckpointOptions& options() const { return options_; }
  /// Prints "amp::CheckpointWrapper(<the wrapped module>)".
  void pretty_print(std::ostream& stream) const override;
  /// A wrapper with the same options around a deep copy of the wrapped module (its clone(), so
  /// the wrapped module must be clonable, as every LibTorch layer is), on `device` when given:
  /// an EMA copy, LibTorch's data_parallel replicas, a Cloneable model holding wrappers.
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  /// Writes the wrapped module's parameters, buffers and children as the wrapper's own.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads what save() writes, or (older checkpoints) the same one level down under "module".
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  /// Becomes a clone of `other` (a CheckpointWrapperImpl), as Cloneable modules do with their
  /// children.
  void clone_(torch::nn::Module& other, const std::optional<torch::Device>& device) override;

 private:
  torch::nn::AnyModule module_;
  CheckpointOptions options_;
};
/// The module holder of CheckpointWrapperImpl (a shared pointer to it, as torch::nn::Linear is
/// to LinearImpl): `amp::CheckpointWrapper(torch::nn::AnyModule(layer))`.
TORCH_MODULE(CheckpointWrapper);

}  // namespace amp
