// amp's operator schemas (TORCH_LIBRARY(amp, ...)) and the public C++ functions, which call the
// operators through the dispatcher so that picking the CPU or CUDA kernel is the dispatcher's job.
#include <amp/ops.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

// Operator names and schemas: the one definition both Python and the C++ functions use.
constexpr const char* kUnscaleSchema =
    "non_finite_check_and_unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale, "
    "Tensor(c!)? per_tensor_found_inf=None) -> ()";
constexpr const char* kUpdateSchema =
    "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor found_inf, "
    "float growth_factor, float backoff_factor, int growth_interval) -> ()";
constexpr const char* kUpdateExtendedSchema =
    "update_scale_extended_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
    "Tensor(c!) hysteresis_remaining, Tensor(d!)? counters, Tensor found_inf, "
    "float growth_factor, float backoff_factor, int growth_interval, int hysteresis, "
    "bool consecutive_hysteresis, float min_scale, float max_scale) -> ()";
constexpr const char* kUnscaleNormSchema =
    "unscale_norm(Tensor[] grads, Tensor(a!) found_inf, Tensor inv_scale, bool per_tensor=False) "
    "-> (Tensor total_norm, Tensor per_tensor_norms)";
constexpr const char* kClipSchema =
    "clip_unscaled_(Tensor(a!)[] grads, Tensor inv_scale, Tensor total_norm, float max_norm, "
    "float eps=1e-06) -> ()";

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace

TORCH_LIBRARY(amp, m) {
  m.def(kUnscaleSchema);
  m.def(kUpdateSchema);
  m.def(kUpdateExtendedSchema);
  m.def(kUnscaleNormSchema);
  m.def(kClipSchema);
}

namespace amp {

void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale,
                                   const std::optional<at::Tensor>& per_tensor_found_inf) {
  static const auto handle =
      op<void(at::TensorList, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&)>("amp::non_finite_check_and_unscale_");
  handle.call(grads, found_inf, inv_scale, per_tensor_found_inf);
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  static const auto handle =
      op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, int64_t)>(
          "amp::update_scale_");
  handle.call(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
}

void update_scale_extended_(at::Tensor& scale, at::Tensor& growth_tracker,
                            at::Tensor& hysteresis_remaining, at::Tensor& counters,
                            const at::Tensor& found_inf, const ScaleUpdateOptions& options) {
  static const auto handle =
      op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, const at::Tensor&, double, double, int64_t, int64_t,
              bool, double, double)>("amp::update_scale_extended_");
  const std::optional<at::Tensor> maybe_counters =
      counters.defined() ? std::optional<at::Tensor>(counters) : std::nullopt;
  handle.call(scale, growth_tracker, hysteresis_remaining, maybe_counters, found_inf,
              options.growth_factor, options.backoff_factor, options.growth_interval,
              options.hysteresis, options.consecutive_hysteresis, options.min_scale,
              options.max_scale);
}

std::tuple<at::Tensor, at::Tensor> unscale_norm(at::TensorList grads, at::Tensor& found_inf,
                                                const at::Tensor& inv_scale, bool per_tensor) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(
      at::TensorList, const at::Tensor&, const at::Tensor&, bool)>("amp::unscale_norm");
  return handle.call(grads, found_inf, inv_scale, per_tensor);
}

void clip_unscaled_(at::TensorList grads, const at::Tensor& inv_scale, const at::Tensor& total_norm,
                    double max_norm, double eps) {
  static const auto handle =
      op<void(at::TensorList, const at::Tensor&, const at::Tensor&, double, double)>(
          "amp::clip_unscaled_");
  handle.call(grads, inv_scale, total_norm, max_norm, eps);
}

at::Tensor unscale_and_clip_(at::TensorList grads, at::Tensor& found_inf,
                             const at::Tensor& inv_scale, double max_norm, double eps) {
  at::Tensor total_norm = std::get<0>(unscale_norm(grads, found_inf, inv_scale, false));
  clip_unscaled_(grads, inv_scale, total_norm, max_norm, eps);
  return total_norm;
}

}  // namespace amp
