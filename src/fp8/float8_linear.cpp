// Float8Linear: the float8 region flag, the autograd function with the three float8 GEMMs
// (torchao's matmul_with_hp_or_float8_args; delayed scaling casts each operand once per step),
// the module, and convert_to_float8_training's swap in module trees and containers.
#include <amp/fp8.h>

#include <cmath>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include "fp8/scaling.h"

namespace amp::fp8 {
namespace {

thread_local bool float8_enabled = false;

constexpr const char* kRoles[3] = {"input", "weight", "grad_output"};
enum Role { kInput = 0, kWeight = 1, kGradOutput = 2 };

// What the autograd function needs from its layer: the recipe and, for the delayed recipe, the
// layer's history and scale buffers (updated in place, so a checkpoint of the module holds them).
struct LayerContext : torch::CustomClassHolder {
  Recipe recipe;
  detail::DelayedState delayed[3];
  // Which gradients the backward computes (grad mode on and the tensor requires grad, as seen at
  // forward time): a frozen weight costs neither its GEMM nor the input kept for it.
  bool needs_grad_input = true;
  bool needs_grad_weight = true;
};

// The dtype a GEMM whose first operand has `dtype` produces: under autocast for the operand's
// device type, the autocast dtype (autocast casts both operands of mm), as with torchao.
c10::ScalarType gemm_dtype(c10::ScalarType dtype, c10::DeviceType device) {
  if (at::autocast::is_autocast_enabled(device) && at::isFloatingType(dtype) &&
      dtype != at::kDouble) {
    return at::autocast::get_autocast_dtype(device);
  }
  return dtype;
}

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
              "but ", what, " is ", size,
              "; pad it to a multiple of 16 or leave the layer out (convert_to_float8_training's "
              "filter).");
}

// Whether an operand's cast for its second GEMM reuses the forward's float8 tensor (saved for the
// backward) instead of casting the high-precision tensor again. Delayed scaling casts each
// operand once per step, so it always reuses. A dynamic recipe reuses the input and grad_output
// when both their casts are the same tensorwise cast (the bits are then the same: the input keeps
// 1 byte an element for the backward instead of the activation, grad_output is cast once); the
// weight it casts again, as torchao does, since the parameter is held anyway and a float8 copy
// would add a byte per parameter.
bool reuse_forward_cast(const Recipe& recipe, Role role, const CastConfig& forward,
                        const CastConfig& second) {
  if (recipe.delayed_scaling) return true;
  return role != kWeight && forward == second && forward.enabled &&
         forward.granularity == Granularity::tensorwise;
}

detail::Float8Operand cast(LayerContext& layer, Role role, const CastConfig& config,
                           const at::Tensor& x, int64_t axis) {
  if (layer.recipe.delayed_scaling) {
    return detail::cast_delayed(x, config.dtype, layer.delayed[role], *layer.recipe.delayed_scaling);
  }
  return detail::cast_dynamic(x, config, axis, layer.recipe.round_scales_to_power_of_2);
}

void save_operand(torch::autograd::AutogradContext* ctx, const std::string& key,
                  const detail::Float8Operand& op) {
  ctx->saved_data[key + "_data"] = op.data;
  ctx->saved_data[key + "_scale"] = op.scale;
  ctx->saved_data[key + "_dtype"] = static_cast<int64_t>(op.orig_dtype);
}

detail::Float8Operand load_operand(torch::autograd::AutogradContext* ctx, const std::string& key) {
  return detail::Float8Operand{ctx->saved_data[key + "_data"].toTensor(),
                               ctx->saved_data[key + "_scale"].toTensor(),
                               static_cast<c10::ScalarType>(ctx->saved_data[key + "_dtype"].toInt()),
                               std::nullopt};
}

// torchao's matmul_with_hp_or_float8_args: forward(input [..., K], weight [N, K]) -> [..., N]
// with three GEMMs, each float8 or (when the recipe disables its casts) high precision.
struct Float8LinearFunction : torch::autograd::Function<Float8LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, c10::intrusive_ptr<LayerContext> layer) {
    const auto& r = layer->recipe;
    const auto weight_t = weight.t();
    const auto out_dtype = gemm_dtype(input.scalar_type(), input.device().type());

    at::Tensor output;
    if (r.input.enabled) {
      auto input_fp8 = cast(*layer, kInput, r.input, input, -1).flatten_rows();
      auto weight_fp8 = cast(*layer, kWeight, r.weight, weight_t, 0);
      output = detail::scaled_mm(input_fp8, weight_fp8, out_dtype, r.output_fast_accum);
      if (layer->needs_grad_weight && reuse_forward_cast(r, kInput, r.input, r.input_for_grad_weight)) {
        save_operand(ctx, "input", input_fp8);
      }
      if (layer->needs_grad_input && reuse_forward_cast(r, kWeight, r.weight, r.weight_for_grad_input)) {
        save_operand(ctx, "weight", weight_fp8);
      }
    } else {
      output = at::mm(input.reshape({-1, input.size(-1)}), weight_t);
    }
    auto sizes = input.sizes().vec();
    sizes.back() = output.size(-1);
    // The high-precision tensors only where the backward casts them differently from the forward
    // or multiplies them in high precision: a tensorwise or delayed layer keeps its input in
    // float8 (1 byte an element) for the backward.
    const bool keep_input = layer->needs_grad_weight &&
                            (!r.input_for_grad_weight.enabled ||
                             !reuse_forward_cast(r, kInput, r.input, r.input_for_grad_weight));
    const bool keep_weight = layer->needs_grad_input &&
                             (!r.weight_for_grad_input.enabled ||
                              !reuse_forward_cast(r, kWeight, r.weight, r.weight_for_grad_input));
    ctx->save_for_backward({keep_input ? input : at::Tensor(), keep_weight ? weight : at::Tensor()});
    ctx->saved_data["layer"] =
        c10::IValue::make_capsule(c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(layer));
    return output.reshape(sizes);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto layer = c10::static_intrusive_pointer_cast<LayerContext>(
        ctx->saved_data["layer"].toCapsule());
    const auto& r = layer->recipe;
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto& grad_output = grads[0];
    const auto grad_2d = grad_output.reshape({-1, grad_output.size(-1)});
    const auto device = grad_output.device().type();

    // grad_output in float8 is cast once and used by both GEMMs where the recipe allows it (a
    // delayed layer's history sees one cast per backward whichever gradients are needed).
    std::optional<detail::Float8Operand> grad_fp8;
    const auto grad_output_fp8 = [&]() -> const detail::Float8Operand& {
      if (!grad_fp8) grad_fp8 = cast(*layer, kGradOutput, r.grad_output, grad_2d, -1);
      return *grad_fp8;
    };

    // grad_input = grad_output @ weight, unless the input needs no gradient.
    at::Tensor grad_input;
    if (layer->needs_grad_input) {
      if (r.grad_output.enabled) {
        auto weight_fp8 = reuse_forward_cast(r, kWeight, r.weight, r.weight_for_grad_input)
                              ? load_operand(ctx, "weight")
                              : detail::cast_dynamic(weight.t(), r.weight_for_grad_input, -1,
                                                     r.round_scales_to_power_of_2);
        grad_input = detail::scaled_mm(grad_output_fp8(), weight_fp8.t(),
                                       gemm_dtype(grad_2d.scalar_type(), device),
                                       r.grad_input_fast_accum);
      } else {
        grad_input = at::mm(grad_2d, weight);
      }
      auto sizes = grad_output.sizes().vec();
      sizes.back() = grad_input.size(-1);
      grad_input = grad_input.reshape(sizes);
    }

    // grad_weight = grad_output.t() @ input, unless the weight is frozen.
    at::Tensor grad_weight;
    if (layer->needs_grad_weight) {
      const auto input_2d = input.defined() ? input.reshape({-1, input.size(-1)}) : at::Tensor();
      if (r.grad_output_for_grad_weight.enabled) {
        auto grad_fp8_t =
            reuse_forward_cast(r, kGradOutput, r.grad_output, r.grad_output_for_grad_weight)
                ? grad_output_fp8().t()
                : detail::cast_dynamic(grad_2d, r.grad_output_for_grad_weight, 0,
                                       r.round_scales_to_power_of_2)
                      .t();
        auto input_fp8 = reuse_forward_cast(r, kInput, r.input, r.input_for_grad_weight)
                             ? load_operand(ctx, "input")
                             : detail::cast_dynamic(input_2d, r.input_for_grad_weight, 0,
                                                    r.round_scales_to_power_of_2);
        grad_weight = detail::scaled_mm(grad_fp8_t, input_fp8,
                                        gemm_dtype(grad_2d.scalar_type(), device),
                                        r.grad_weight_fast_accum);
      } else {
        // torchao multiplies grad_output and the input as they are; under CPU autocast they
        // differ (bf16 and float32) and at::mm refuses, so the input takes grad_output's dtype.
        grad_weight = at::mm(grad_2d.t(), input_2d.to(grad_2d.scalar_type()));
      }
    }
    return {grad_input, grad_weight, at::Tensor()};
  }
};

}  // namespace

Float8AutocastGuard::Float8AutocastGuard(bool enabled) : previous_(float8_enabled) {
  float8_enabled = enabled;
}

Float8AutocastGuard::~Float8AutocastGuard() { float8_enabled = previous_; }

bool is_float8_enabled() { return float8_enabled; }

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
  bias = register_parameter("bias", linear.bias, /*requires_grad=*/linear.bias.defined() &&
                                                     linear.bias.requires_grad());
  register_delayed_buffers();
}

void Float8LinearImpl::reset() {
  options.recipe().validate();
  TORCH_CHECK(options.in_features() > 0 && options.out_features() > 0,
              "amp::fp8::Float8Linear: in_features and out_features must be positive. Got ",
              options.in_features(), " and ", options.out_features(), ".");
  weight = register_parameter("weight",
                              torch::empty({options.out_features(), options.in_features()}));
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

// Runs `change` (a Module::to) and gives the float32 buffers back their float32 values on the
// device the change left them on.
template <typename Change>
void keeping_float32_buffers(torch::nn::Module& module, Change change) {
  std::vector<std::pair<at::Tensor, at::Tensor>> kept;
  for (auto& buffer : module.named_buffers(/*recurse=*/false)) {
    if (buffer.value().scalar_type() == at::kFloat) kept.emplace_back(buffer.value(), buffer.value().clone());
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

void Float8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "amp::fp8::Float8Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ", recipe=" << options.recipe().name << ")";
}

at::Tensor Float8LinearImpl::forward(const at::Tensor& input_) {
  if (!float8_enabled) return torch::nn::functional::linear(input_, weight, bias);
  TORCH_CHECK(input_.dim() >= 1 && input_.size(-1) == options.in_features(),
              "amp::fp8::Float8Linear ", describe(*this), ": the input's last dimension must be "
              "in_features=", options.in_features(), ". Got an input of shape ", input_.sizes(),
              ".");
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
  if (input.numel() == 0) {
    // No rows (an MoE expert without tokens, an empty last micro-batch): nothing to cast, and an
    // amax of no elements is undefined. The empty product in the dtype the float8 GEMM would
    // give keeps the graph (zero parameter gradients, as Linear's) and leaves delayed histories
    // as they are.
    const auto out_dtype = gemm_dtype(dtype, input.device().type());  // before autocast is off
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto output = at::matmul(input.to(out_dtype), weight.to(out_dtype).t());
    if (bias.defined()) output = output + bias.to(out_dtype);
    return output;
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
  auto output = Float8LinearFunction::apply(input, weight, layer);
  if (bias.defined()) output = output + bias.to(output.scalar_type());
  return output;
}

// ---- convert_to_float8_training ----
namespace {

// Replaces `old_child` in the container `parent` holds it in (Sequential, ModuleList, ModuleDict);
// does nothing when `parent` is no such container.
void replace_in_container(torch::nn::Module& parent, const std::shared_ptr<torch::nn::Module>& old_child,
                          const Float8Linear& replacement) {
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& slot : *sequential) {
      if (slot.ptr().get() == old_child.get()) slot = torch::nn::AnyModule(replacement);
    }
    return;
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& slot : *list) {
      if (slot.get() == old_child.get()) slot = replacement.ptr();
    }
    return;
  }
  if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    for (auto& item : *dict) {
      if (item.value().get() == old_child.get()) item.value() = replacement.ptr();
    }
  }
}

bool is_container(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&module) ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&module) ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&module);
}

struct Candidate {
  torch::nn::Module* parent;
  std::string child_key;
  std::string qualified_name;
};

}  // namespace

std::vector<std::string> convert_to_float8_training(torch::nn::Module& module, const Recipe& recipe,
                                                    const ModuleFilter& filter) {
  recipe.validate();
  // Depth first, in registration order: the order of named_modules().
  std::vector<Candidate> candidates;
  std::function<void(torch::nn::Module&, const std::string&)> walk =
      [&](torch::nn::Module& parent, const std::string& prefix) {
        for (const auto& child : parent.named_children()) {
          const auto name = prefix.empty() ? child.key() : prefix + "." + child.key();
          if (const auto* linear = child.value()->as<torch::nn::LinearImpl>()) {
            if (!filter || filter(name, *linear)) candidates.push_back({&parent, child.key(), name});
          } else {
            walk(*child.value(), name);
          }
        }
      };
  walk(module, "");

  // Every check before the first change: a refused conversion leaves the tree as it was.
  for (const auto& c : candidates) {
    auto child = c.parent->named_children()[c.child_key];
    // The parent's registry, this copy, and the container's slot are the expected holders.
    const long expected = 2 + (is_container(*c.parent) ? 1 : 0);
    TORCH_CHECK(child.use_count() <= expected, "amp::fp8::convert_to_float8_training: the Linear '",
                c.qualified_name,
                "' is also held outside the module tree (for example by a torch::nn::Linear member "
                "of its parent, or by two parents), and a C++ program cannot re-point that holder, "
                "so forward() would keep calling the Linear. Declare the member as "
                "amp::fp8::Float8Linear (it computes as Linear outside a Float8AutocastGuard) or "
                "leave it out with the filter. Nothing was converted.");
  }
  std::vector<std::string> converted;
  for (const auto& c : candidates) {
    auto child = c.parent->named_children()[c.child_key];
    Float8Linear replacement(std::make_shared<Float8LinearImpl>(
        *child->as<torch::nn::LinearImpl>(), recipe));
    replacement->set_qualified_name(c.qualified_name);
    replace_in_container(*c.parent, child, replacement);
    c.parent->replace_module(c.child_key, replacement);
    converted.push_back(c.qualified_name);
  }
  return converted;
}

}  // namespace amp::fp8
