// Autocast kernels for users' operators: a boxed kernel that casts arguments by policy and
// redispatches below the autocast key, plus a run-time registration helper.
#include <amp/autocast_policy.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace amp {
namespace {

c10::DispatchKey autocast_key_for(c10::DeviceType device, const char* caller) {
  TORCH_CHECK(at::autocast::is_autocast_available(device), caller, ": device type '",
              c10::DeviceTypeName(device, /*lower_case=*/true),
              "' has no autocast dispatch key; use torch::kCPU, torch::kCUDA or another device "
              "type that supports autocast.");
  return at::autocast::get_autocast_dispatch_key_from_device_type(device);
}

// Widest floating dtype among the eligible tensors (float64 ignored, as ATen's promote does).
// ATen refuses a mix of fp16 and bf16; promoteTypes turns it into float32 instead.
c10::ScalarType widen(c10::ScalarType current, const c10::IValue& value, c10::DeviceType device) {
  if (value.isTensor()) {
    const auto& tensor = value.toTensor();
    return at::autocast::is_eligible(tensor, device)
               ? c10::promoteTypes(current, tensor.scalar_type())
               : current;
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) current = widen(current, element, device);
  }
  return current;
}

c10::IValue cast_value(const c10::IValue& value, c10::ScalarType dtype, c10::DeviceType device) {
  if (value.isTensor()) return at::autocast::cached_cast(dtype, value.toTensor(), device);
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(value.toListRef().size());
    for (const c10::IValue& element : value.toListRef()) {
      out.push_back(at::autocast::cached_cast(dtype, element.toTensor(), device));
    }
    return out;
  }
  if (value.isList()) {  // Tensor?[]: keep the list's element type, cast the tensors in it
    const auto elements = value.toListRef();
    const bool has_tensor = std::any_of(elements.begin(), elements.end(),
                                        [](const c10::IValue& e) { return e.isTensor(); });
    if (!has_tensor) return value;
    auto list = value.toList().copy();
    for (size_t i = 0; i < list.size(); ++i) list.set(i, cast_value(list.get(i), dtype, device));
    return list;
  }
  return value;
}

class AutocastBoxedKernel final : public c10::OperatorKernel {
 public:
  AutocastBoxedKernel(c10::DeviceType device, AutocastPolicy policy)
      : device_(device), key_(autocast_key_for(device, "amp::autocast_kernel")), policy_(policy) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                  torch::jit::Stack* stack) const {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key_);
    const auto& arguments = op.schema().arguments();
    const size_t first = stack->size() - arguments.size();

    // The lower-precision dtype is read per call: it is whatever the enclosing region chose.
    c10::ScalarType dtype = at::kFloat;
    if (policy_ != AutocastPolicy::fp32) dtype = at::autocast::get_autocast_dtype(device_);
    if (policy_ == AutocastPolicy::promote) {
      for (size_t i = 0; i < arguments.size(); ++i) {
        if (!writes_to(arguments[i])) dtype = widen(dtype, (*stack)[first + i], device_);
      }
    }
    for (size_t i = 0; i < arguments.size(); ++i) {
      // Casting an argument the op writes to would redirect the write to a temporary copy.
      if (!writes_to(arguments[i])) {
        (*stack)[first + i] = cast_value((*stack)[first + i], dtype, device_);
      }
    }
    op.callBoxed(stack);
  }

 private:
  static bool writes_to(const c10::Argument& argument) {
    return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
  }

  c10::DeviceType device_;
  c10::DispatchKey key_;
  AutocastPolicy policy_;
};

}  // namespace

torch::CppFunction autocast_kernel(c10::DeviceType device, AutocastPolicy policy) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<AutocastBoxedKernel>(device, policy));
}

void register_autocast(const std::string& qualified_name, c10::DeviceType device,
                       AutocastPolicy policy) {
  const auto separator = qualified_name.find("::");
  TORCH_CHECK(
      separator != std::string::npos && separator > 0 && separator + 2 < qualified_name.size(),
      "amp::register_autocast: operator name '", qualified_name,
      "' is not qualified; write it as \"namespace::name\" or "
      "\"namespace::name.overload\".");
  const std::string ns = qualified_name.substr(0, separator);
  std::string name = qualified_name.substr(separator + 2);
  std::string overload;
  if (const auto dot = name.find('.'); dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name.resize(dot);
  }
  TORCH_CHECK(c10::Dispatcher::singleton().findSchema({ns + "::" + name, overload}).has_value(),
              "amp::register_autocast: no operator '", qualified_name,
              "' is defined; define it with TORCH_LIBRARY (and load the library that does) before "
              "registering its autocast policy.");
  const c10::DispatchKey key = autocast_key_for(device, "amp::register_autocast");

  // Each registration lives in its own torch::Library, kept until the process ends; replacing
  // a policy destroys the old Library first, which deregisters its kernel.
  static std::mutex mutex;
  static std::map<std::pair<std::string, c10::DispatchKey>, std::unique_ptr<torch::Library>>
      libraries;
  std::lock_guard<std::mutex> lock(mutex);
  auto& library = libraries[{qualified_name, key}];
  library.reset();
  library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  library->impl(qualified_name.c_str(), autocast_kernel(device, policy));
}

}  // namespace amp
