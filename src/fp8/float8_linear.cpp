// Float8Linear: the module (Linear's parameters, the delayed recipe's buffers, dtype changes
// that keep those float32) and its forward, which checks the input and calls the float8
// autograd function (float8_function.cpp) inside a float8 region.
#include <amp/fp8.h>

#include <cmath>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include "fp8/float8_function.h"

namespace amp::fp8 {
namespace {

using detail::gemm_dtype;
using detail::kRoles;
using detail::LayerContext;

std::string describe(const Float8LinearImpl& layer) {
  std::ostringstream out;
  if (!layer.qualified_name().empty()) out << "'" << layer.qualified_name() << "' ";
  out << "(in_features=" << layer.options.in_features()
      << ", out_features=" << layer.options.out_features() << ")";
  return out.str();
}

// The message (and the layer's description in it) is built only when the check fails.
void check_cuda_dim(const Float8LinearImpl& layer, int64_t size, const char* what) {
  TORCH_CHECK(size % 16 == 0, "amp::fp8::Float8Linear ", describe(layer),
              ": on CUDA the float8 GEMMs (at::_scaled_mm) need every dimension divisible by 16, "
              "but ",
              what, " is ", size,
              "; pad it to a multiple of 16 or leave the layer out (convert_to_float8_training's "
              "filter).");
}

}  // namespace

Float8LinearImpl::Float8LinearImpl(Float8LinearOptions options_) : options(std::move(options_)) {
  reset();
}

Float8LinearImpl::Float8LinearImpl(const torch::nn::LinearImpl& linear, Recipe recipe)
    : options(Float8LinearOptions(linear.options.in_features(), linear.options.out_features())
                  .bias(linear.options.bias())
                  .recipe(std::move(recipe))) {
  options.recipe().validate();
  // Each parameter keeps its requires_grad flag (register_parameter's default would unfreeze a
  // frozen weight).
  weight = register_parameter("weight", linear.weight, linear.weight.requires_grad());
  bias = register_parameter("bias", linear.bias,
                            /*requires_grad=*/linear.bias.defined() && linear.bias.requires_grad());
  register_delayed_buffers();
}

void Float8LinearImpl::reset() {
  options.recipe().validate();
  kept_weight_casts_.reset();
  TORCH_CHECK(options.in_features() > 0 && options.out_features() > 0,
              "amp::fp8::Float8Linear: in_features and out_features must be positive. Got ",
              options.in_features(), " and ", options.out_features(), ".");
  weight =
      register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
  register_delayed_buffers();
}

void Float8LinearImpl::reset_parameters() {
  // torch::nn::Linear's initialisation, so a seeded Float8Linear starts where a Linear would.
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const auto fan_in = static_cast<double>(options.in_features());
    const auto bound = 1 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void Float8LinearImpl::register_delayed_buffers() {
  const auto& delayed = options.recipe().delayed_scaling;
  if (!delayed) return;
  const auto float_options = weight.options().dtype(at::kFloat);
  for (const char* role : kRoles) {
    register_buffer(std::string("amax_history_") + role,
                    torch::zeros({delayed->amax_history_len()}, float_options));
    register_buffer(std::string("scale_") + role, torch::ones({}, float_options));
  }
}

namespace {

// Runs `change` (a Module::to) and gives the buffers the module keeps float32 back their float32
// values on the device the change left them on.
template <typename Change>
void keeping_float32_buffers(torch::nn::Module& module, Change change) {
  std::vector<std::pair<at::Tensor, at::Tensor>> kept;
  for (auto& buffer : module.named_buffers(/*recurse=*/false)) {
    if (amp::detail::keeps_float32_buffer(module, buffer.key()))
      kept.emplace_back(buffer.value(), buffer.value().clone());
  }
  change();
  torch::NoGradGuard no_grad;
  for (auto& [buffer, value] : kept) buffer.set_data(value.to(buffer.device()));
}

}  // namespace

void Float8LinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  keeping_float32_buffers(*this, [&] { Module::to(device, dtype, non_blocking); });
}

void Float8LinearImpl::to(torch::Dtype dtype, bool non_blocking) {
  keeping_float32_buffers(*this, [&] { Module::to(dtype, non_blocking); });
}

void Float8LinearImpl::to(torch::Device device, bool non_blocking) {
  Module::to(device, non_blocking);
}

namespace {
// The delayed recipe's buffers: "amax_history_<role>" and "scale_<role>".
bool is_delayed_buffer(const std::string& name) {
  for (const char* role : kRoles) {
    if (name == std::string("amax_history_") + role || name == std::string("scale_") + role)
      return true;
  }
  return false;
}
}  // namespace

bool Float8LinearImpl::keeps_float32(const std::string& name) const {
  return is_delayed_buffer(name);
}

bool Float8LinearImpl::rank_local(const std::string& name) const { return is_delayed_buffer(name); }

void Float8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "amp::fp8::Float8Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ", recipe=" << options.recipe().name << ")";
}

at::Tensor Float8LinearImpl::forward(const at::Tensor& input_) {
  if (!is_float8_enabled()) return torch::nn::functional::linear(input_, weight, bias);
  TORCH_CHECK(input_.dim() >= 1 && input_.size(-1) == options.in_features(),
              "amp::fp8::Float8Linear ", describe(*this),
              ": the input's last dimension must be "
              "in_features=",
              options.in_features(), ". Got an input of shape ", input_.sizes(), ".");
  at::Tensor input = input_;
  // torchao's rule: with CUDA autocast on, the input is first cast to CUDA's autocast dtype.
  if (at::autocast::is_autocast_enabled(at::kCUDA)) {
    input = input.to(at::autocast::get_autocast_dtype(at::kCUDA));
  }
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "amp::fp8::Float8Linear ", describe(*this),
              ": the input must be float32, bfloat16 or float16 to be cast to float8. Got ", dtype,
              ".");
  const bool grad_mode = at::GradMode::is_enabled();
  const bool needs_grad_weight = grad_mode && weight.requires_grad();
  if (input.is_cuda()) {
    check_cuda_dim(*this, options.in_features(), "in_features");
    check_cuda_dim(*this, options.out_features(), "out_features");
    // The rows are the reduction dimension of the grad_weight GEMM, run only for a weight that
    // trains.
    if (options.recipe().input_for_grad_weight.enabled && needs_grad_weight) {
      check_cuda_dim(*this, input.numel() / options.in_features(),
                     "the number of input rows (the product of all dims but the last)");
    }
  }
  auto layer = c10::make_intrusive<LayerContext>();
  layer->recipe = options.recipe();
  layer->needs_grad_weight = needs_grad_weight;
  layer->needs_grad_input = grad_mode && input.requires_grad();
  if (layer->recipe.delayed_scaling) {
    const auto buffers = named_buffers(/*recurse=*/false);
    for (int role = 0; role < 3; ++role) {
      layer->delayed[role].amax_history = buffers[std::string("amax_history_") + kRoles[role]];
      layer->delayed[role].scale = buffers[std::string("scale_") + kRoles[role]];
    }
  }
  const bool empty = input.numel() == 0;
  const auto weight_casts = current_weight_casts();
  if (weight_casts == WeightCasts::fresh) {
    kept_weight_casts_.reset();  // the memory of earlier micro-batches' casts goes back
  } else if (layer->recipe.weight.enabled) {
    if (weight_casts == WeightCasts::keep) {
      // Also for an input without rows (an MoE expert that gets no tokens in the step's first
      // micro-batch): the step's later `reuse` micro-batches must find this step's casts.
      kept_weight_casts_ = detail::cast_weight(*layer, weight);
    } else if (!empty) {
      TORCH_CHECK(kept_weight_casts_, "amp::fp8::Float8Linear ", describe(*this),
                  ": WeightCasts::reuse found no kept weight casts; run the first micro-batch "
                  "after each optimizer step with WeightCasts::keep.");
      TORCH_CHECK(detail::kept_casts_match(*kept_weight_casts_, weight), "amp::fp8::Float8Linear ",
                  describe(*this),
                  ": WeightCasts::reuse, but the weight changed since its casts were kept "
                  "(another tensor or storage, or its version counter moved: changed in place); "
                  "run the first forward after each change with WeightCasts::keep.");
    }
    layer->weight_casts = kept_weight_casts_;
  }
  if (empty) {
    // No rows (an MoE expert without tokens, an empty last micro-batch): nothing to cast, and an
    // amax of no elements is undefined. The empty product in the dtype the float8 GEMM would
    // give keeps the graph (zero parameter gradients, as Linear's) and leaves the input and
    // grad_output histories as they are.
    const auto out_dtype = gemm_dtype(dtype, input.device().type());  // before autocast is off
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto output = at::matmul(input.to(out_dtype), weight.to(out_dtype).t());
    if (bias.defined()) output = output + bias.to(out_dtype);
    return output;
  }
  auto output = detail::float8_linear_function(input, weight, layer);
  if (bias.defined()) output = output + bias.to(output.scalar_type());
  return output;
}

}  // namespace amp::fp8
