// custom_fwd / custom_bwd for torch::autograd::Function: run a custom forward and its backward
// under consistent autocast state, as Python's torch.amp.custom_fwd / custom_bwd do.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/autograd/custom_function.h>

#include <concepts>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <amp/autocast.h>
#include <amp/export.h>

namespace amp {

/// The autocast state custom_fwd records in an AutogradContext for custom_bwd.
struct RecordedAutocastState {
  /// The device type given to custom_fwd.
  c10::DeviceType device;
  /// The device's autocast dtype when forward ran.
  c10::ScalarType dtype;
  /// Whether forward ran with autocast on (always false when custom_fwd cast the inputs).
  bool enabled;
};

namespace detail {

/// Records in `ctx->saved_data` (keys prefixed "amp.") the device, its current autocast dtype,
/// and as the enabled flag: false when `casts_inputs`, else whether autocast is on for `device`.
/// Returns: whether autocast is on for `device` now.
AMP_EXPORT bool record_forward_state(torch::autograd::AutogradContext* ctx, c10::DeviceType device,
                                     bool casts_inputs);

/// Reads what record_forward_state stored; throws c10::Error when nothing was recorded or the
/// device differs from `device`.
AMP_EXPORT RecordedAutocastState recorded_autocast_state(torch::autograd::AutogradContext* ctx,
                                                         c10::DeviceType device);

/// custom_fwd's cast: floating tensors on `device` other than float64 become `dtype`; others
/// are returned as they are (undefined tensors included).
AMP_EXPORT at::Tensor cast_forward_input(const at::Tensor& tensor, c10::DeviceType device,
                                         c10::ScalarType dtype);

template <class T>
inline constexpr bool is_optional_v = false;
template <class T>
inline constexpr bool is_optional_v<std::optional<T>> = true;

template <class T>
inline constexpr bool is_vector_v = false;
template <class T, class A>
inline constexpr bool is_vector_v<std::vector<T, A>> = true;

template <class T>
inline constexpr bool is_tuple_like_v = false;
template <class... T>
inline constexpr bool is_tuple_like_v<std::tuple<T...>> = true;
template <class A, class B>
inline constexpr bool is_tuple_like_v<std::pair<A, B>> = true;

template <class T>
inline constexpr bool is_c10_list_v = false;
template <class T>
inline constexpr bool is_c10_list_v<c10::List<T>> = true;

template <class T>
inline constexpr bool is_c10_dict_v = false;
template <class K, class V>
inline constexpr bool is_c10_dict_v<c10::Dict<K, V>> = true;

template <class T>
inline constexpr bool is_std_map_v = false;
template <class K, class V, class C, class A>
inline constexpr bool is_std_map_v<std::map<K, V, C, A>> = true;

template <class T>
inline constexpr bool is_std_unordered_map_v = false;
template <class K, class V, class H, class E, class A>
inline constexpr bool is_std_unordered_map_v<std::unordered_map<K, V, H, E, A>> = true;

/// Casts one forward argument for custom_fwd, recursing into std::optional, std::vector,
/// at::TensorList (which becomes a std::vector<at::Tensor>), std::tuple, std::pair, c10::List,
/// and the values of c10::Dict, std::map and std::unordered_map (keys are left as they are); any
/// other value is passed through untouched (forwarded as the same reference).
template <class T>
decltype(auto) cast_forward_arg(T&& value, c10::DeviceType device, c10::ScalarType dtype) {
  using V = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<V, at::Tensor>) {
    return cast_forward_input(value, device, dtype);
  } else if constexpr (std::is_same_v<V, at::TensorList>) {
    std::vector<at::Tensor> out;
    out.reserve(value.size());
    for (const auto& t : value) out.push_back(cast_forward_input(t, device, dtype));
    return out;
  } else if constexpr (is_optional_v<V>) {
    using Elem = std::remove_cvref_t<decltype(cast_forward_arg(*value, device, dtype))>;
    return value.has_value() ? std::optional<Elem>(cast_forward_arg(*value, device, dtype))
                             : std::optional<Elem>();
  } else if constexpr (is_vector_v<V>) {
    using Elem = std::remove_cvref_t<decltype(cast_forward_arg(*value.begin(), device, dtype))>;
    std::vector<Elem> out;
    out.reserve(value.size());
    for (const auto& element : value) out.push_back(cast_forward_arg(element, device, dtype));
    return out;
  } else if constexpr (is_tuple_like_v<V>) {
    return std::apply(
        [&](const auto&... elements) { return V(cast_forward_arg(elements, device, dtype)...); },
        value);
  } else if constexpr (is_c10_list_v<V>) {
    // c10::List shares its storage between copies: the caller's list must stay as it was, so
    // the casts go into a copy (which keeps the element type, also for a list of IValues).
    V out = value.copy();
    for (size_t i = 0; i < out.size(); ++i) out.set(i, cast_forward_arg(out.get(i), device, dtype));
    return out;
  } else if constexpr (is_c10_dict_v<V>) {
    V out = value.copy();  // shared storage, as for c10::List
    for (const auto& entry : out) entry.setValue(cast_forward_arg(entry.value(), device, dtype));
    return out;
  } else if constexpr (is_std_map_v<V> || is_std_unordered_map_v<V>) {
    using Elem =
        std::remove_cvref_t<decltype(cast_forward_arg(value.begin()->second, device, dtype))>;
    if constexpr (is_std_map_v<V>) {
      std::map<typename V::key_type, Elem, typename V::key_compare> out(value.key_comp());
      for (const auto& [key, element] : value) {
        out.emplace(key, cast_forward_arg(element, device, dtype));
      }
      return out;
    } else {
      std::unordered_map<typename V::key_type, Elem, typename V::hasher, typename V::key_equal> out(
          value.bucket_count(), value.hash_function(), value.key_eq());
      for (const auto& [key, element] : value) {
        out.emplace(key, cast_forward_arg(element, device, dtype));
      }
      return out;
    }
  } else {
    return std::forward<T>(value);
  }
}

}  // namespace detail

/// Runs a custom autograd function's forward computation the way Python's
/// `@torch.amp.custom_fwd(device_type=device)` does: records the device's autocast dtype and
/// whether autocast is on in `ctx` (for custom_bwd), then calls `fn(args...)` unchanged.
/// Use it inside the static `forward` of a `torch::autograd::Function<T>`:
///
///     static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
///                                  torch::Tensor w) {
///       return amp::custom_fwd(ctx, torch::kCUDA, [&](const torch::Tensor& x,
///                                                     const torch::Tensor& w) {
///         ctx->save_for_backward({x, w});
///         return x.mm(w);
///       }, x, w);
///     }
///
/// Args: ctx: forward's context; device: the device type whose autocast state counts; fn: the
///   forward computation; args: its arguments.
/// Returns: what `fn` returns.
template <class Fn, class... Args>
std::invoke_result_t<Fn, Args...> custom_fwd(torch::autograd::AutogradContext* ctx,
                                             c10::DeviceType device, Fn&& fn,
                                             Args&&... args) requires std::invocable<Fn, Args...> {
  detail::record_forward_state(ctx, device, /*casts_inputs=*/false);
  return std::invoke(std::forward<Fn>(fn), std::forward<Args>(args)...);
}

/// Like the overload above, with Python's `cast_inputs`: when autocast is on for `device`, `fn`
/// runs with autocast off and every floating tensor argument on `device` (float64 excluded) is
/// first cast to `cast_inputs`, also inside std::optional, std::vector, at::TensorList (passed
/// on as a std::vector<at::Tensor>), std::tuple, std::pair and c10::List, and in the values of
/// c10::Dict, std::map and std::unordered_map, nested to any depth; other arguments are
/// untouched. A container comes out as a new container of the same type (c10::List and
/// c10::Dict too, so the caller's own, which share storage between copies, are not changed).
/// Map keys are never cast: Python's custom_fwd casts tensor keys of a dict as well, but a C++
/// map's keys order or hash its entries, and a tensor key of a c10::Dict is looked up by identity,
/// which a cast would break. Outside an autocast region it just calls `fn(args...)`. Either way
/// it records "autocast off" and the device's autocast dtype, so custom_bwd runs backward with
/// autocast off too.
/// Args: ctx: forward's context; device: the device type; cast_inputs: the dtype forward
///   computes in (e.g. at::kFloat for an op that needs full precision); fn, args: as above.
/// Returns: what `fn` returns.
template <class Fn, class... Args>
auto custom_fwd(torch::autograd::AutogradContext* ctx, c10::DeviceType device,
                c10::ScalarType cast_inputs, Fn&& fn, Args&&... args) {
  const bool autocast_on = detail::record_forward_state(ctx, device, /*casts_inputs=*/true);
  if (autocast_on) {
    AutocastGuard autocast_off(device, std::nullopt, /*enabled=*/false);
    return std::invoke(std::forward<Fn>(fn),
                       detail::cast_forward_arg(std::forward<Args>(args), device, cast_inputs)...);
  }
  return std::invoke(std::forward<Fn>(fn), std::forward<Args>(args)...);
}

/// Runs a custom autograd function's backward computation the way Python's
/// `@torch.amp.custom_bwd(device_type=device)` does: inside an autocast region with the enabled
/// flag and dtype that custom_fwd recorded in `ctx`. Use it inside the static `backward`:
///
///     static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
///                                                    torch::autograd::variable_list grads) {
///       return amp::custom_bwd(ctx, torch::kCUDA, [&] {
///         auto saved = ctx->get_saved_variables();
///         return torch::autograd::variable_list{grads[0].mm(saved[1].t()),
///                                               saved[0].t().mm(grads[0])};
///       });
///     }
///
/// Args: ctx: backward's context; device: the same device type as in custom_fwd; fn, args: the
///   backward computation and its arguments.
/// Returns: what `fn` returns.
/// Errors: c10::Error when forward did not go through custom_fwd, or used another device type.
template <class Fn, class... Args>
std::invoke_result_t<Fn, Args...> custom_bwd(torch::autograd::AutogradContext* ctx,
                                             c10::DeviceType device, Fn&& fn, Args&&... args) {
  const RecordedAutocastState recorded = detail::recorded_autocast_state(ctx, device);
  AutocastGuard autocast(device, recorded.dtype, recorded.enabled);
  return std::invoke(std::forward<Fn>(fn), std::forward<Args>(args)...);
}

}  // namespace amp
