// The autograd function behind Float8Linear (float8_function.h): torchao's
// matmul_with_hp_or_float8_args op for op, in a C++ torch::autograd::Function.
#include "fp8/float8_function.h"

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fp8/amax_batch.h"
#include "fp8/fused_cast.h"

namespace amp::fp8::detail {

c10::ScalarType gemm_dtype(c10::ScalarType dtype, c10::DeviceType device) {
  if (at::autocast::is_autocast_enabled(device) && at::isFloatingType(dtype) &&
      dtype != at::kDouble) {
    return at::autocast::get_autocast_dtype(device);
  }
  return dtype;
}

namespace {

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

Float8Operand recast(const Recipe& r, const at::Tensor& x, const CastConfig& config, int64_t axis,
                     Layouts layouts);

// The cast of an operand per the recipe: delayed or dynamic, eager or fused. `layouts` is what the
// GEMMs that use it want (fused casts write those; an eager cast writes x's layout and the GEMM
// copies).
Float8Operand cast(LayerContext& layer, Role role, const CastConfig& config, const at::Tensor& x,
                   int64_t axis, Layouts layouts = Layouts::kSame) {
  const auto& r = layer.recipe;
  if (r.delayed_scaling) {
    return r.fused_casts ? fused_cast_delayed(x, config.dtype, layer.delayed[role],
                                              *r.delayed_scaling, layouts)
                         : cast_delayed(x, config.dtype, layer.delayed[role], *r.delayed_scaling);
  }
  return recast(r, x, config, axis, layouts);
}

// A dynamic cast outside the layer's state (the backward's own casts).
Float8Operand recast(const Recipe& r, const at::Tensor& x, const CastConfig& config, int64_t axis,
                     Layouts layouts) {
  return r.fused_casts ? fused_cast_dynamic(x, config, axis, r.round_scales_to_power_of_2, layouts)
                       : cast_dynamic(x, config, axis, r.round_scales_to_power_of_2);
}

// Where the forward's tensors for the backward sit in save_for_backward's list. Every tensor goes
// through save_for_backward (never ctx->saved_data), so that saved-tensor hooks see them all: an
// amp::checkpoint drops the float8 copies with the activations, as torch.utils.checkpoint drops
// torchao's.
enum SavedSlot {
  kSavedInput = 0,
  kSavedWeight,
  kInputFp8,
  kInputScale,
  kWeightFp8,
  kWeightScale,
  kSavedCount
};

// What the forward keeps of an operand for the backward: with a fused cast, the second layout
// (the one the backward's GEMM wants), so that the backward copies nothing and the float8 bytes
// kept stay one per element. The dtype the GEMM produces is not a tensor and stays in saved_data.
void save_operand(torch::autograd::AutogradContext* ctx, std::vector<at::Tensor>& saved,
                  SavedSlot data_slot, const std::string& key, const Float8Operand& operand) {
  const Float8Operand& op = operand.alternate.defined() ? operand.in_alternate_layout() : operand;
  saved[data_slot] = op.data;
  saved[data_slot + 1] = op.scale;
  ctx->saved_data[key + "_dtype"] = static_cast<int64_t>(op.orig_dtype);
}

Float8Operand load_operand(torch::autograd::AutogradContext* ctx,
                           const std::vector<at::Tensor>& saved, SavedSlot data_slot,
                           const std::string& key) {
  return Float8Operand{saved[data_slot],
                       saved[data_slot + 1],
                       static_cast<c10::ScalarType>(ctx->saved_data[key + "_dtype"].toInt()),
                       std::nullopt,
                       {}};
}

// torchao's matmul_with_hp_or_float8_args: forward(input [..., K], weight [N, K]) -> [..., N]
// with three GEMMs, each float8 or (when the recipe disables its casts) high precision.
struct Float8LinearFunction : torch::autograd::Function<Float8LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, c10::intrusive_ptr<LayerContext> layer) {
    const auto& r = layer->recipe;
    const auto weight_t = weight.t();
    const auto out_dtype = gemm_dtype(input.scalar_type(), input.device().type());

    std::vector<at::Tensor> saved(kSavedCount);
    at::Tensor output;
    if (r.input.enabled) {
      // A cast the backward reuses is written in both layouts: this GEMM's and the backward's.
      const bool save_input = layer->needs_grad_weight &&
                              reuse_forward_cast(r, kInput, r.input, r.input_for_grad_weight);
      const bool save_weight = layer->needs_grad_input &&
                               reuse_forward_cast(r, kWeight, r.weight, r.weight_for_grad_input);
      auto input_fp8 =
          cast(*layer, kInput, r.input, input, -1, save_input ? Layouts::kBoth : Layouts::kSame)
              .flatten_rows();
      auto weight_fp8 = layer->weight_casts ? layer->weight_casts->forward
                                            : cast(*layer, kWeight, r.weight, weight_t, 0,
                                                   save_weight ? Layouts::kBoth : Layouts::kSame);
      output = scaled_mm(input_fp8, weight_fp8, out_dtype, r.output_fast_accum);
      if (save_input) save_operand(ctx, saved, kInputFp8, "input", input_fp8);
      if (save_weight) save_operand(ctx, saved, kWeightFp8, "weight", weight_fp8);
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
    if (keep_input) saved[kSavedInput] = input;
    if (keep_weight) saved[kSavedWeight] = weight;
    ctx->save_for_backward(saved);
    ctx->saved_data["layer"] = c10::IValue::make_capsule(
        c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(layer));
    return output.reshape(sizes);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto layer =
        c10::static_intrusive_pointer_cast<LayerContext>(ctx->saved_data["layer"].toCapsule());
    const auto& r = layer->recipe;
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[kSavedInput];
    const auto& weight = saved[kSavedWeight];
    const auto& grad_output = grads[0];
    const auto grad_2d = grad_output.reshape({-1, grad_output.size(-1)});
    const auto device = grad_output.device().type();

    // grad_output in float8 is cast once and used by both GEMMs where the recipe allows it (a
    // delayed layer's history sees one cast per backward whichever gradients are needed).
    // The grad_input GEMM reads it row-major, the grad_weight GEMM transposed (the other layout).
    const bool grad_for_input = layer->needs_grad_input && r.grad_output.enabled;
    const bool grad_for_weight =
        layer->needs_grad_weight && r.grad_output_for_grad_weight.enabled &&
        reuse_forward_cast(r, kGradOutput, r.grad_output, r.grad_output_for_grad_weight);
    const Layouts grad_layouts = grad_for_input && grad_for_weight ? Layouts::kBoth
                                 : grad_for_weight                 ? Layouts::kOther
                                                                   : Layouts::kSame;
    std::optional<Float8Operand> grad_fp8;
    const auto grad_output_fp8 = [&]() -> const Float8Operand& {
      if (!grad_fp8) grad_fp8 = cast(*layer, kGradOutput, r.grad_output, grad_2d, -1, grad_layouts);
      return *grad_fp8;
    };

    // grad_input = grad_output @ weight, unless the input needs no gradient.
    at::Tensor grad_input;
    if (layer->needs_grad_input) {
      if (r.grad_output.enabled) {
        const auto& kept = layer->weight_casts;
        auto weight_fp8 = reuse_forward_cast(r, kWeight, r.weight, r.weight_for_grad_input)
                              ? load_operand(ctx, saved, kWeightFp8, "weight")
                          : kept && kept->for_grad_input
                              ? *kept->for_grad_input
                              : recast(r, weight.t(), r.weight_for_grad_input, -1, Layouts::kOther);
        grad_input = scaled_mm(grad_output_fp8(), weight_fp8.t(),
                               gemm_dtype(grad_2d.scalar_type(), device), r.grad_input_fast_accum);
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
                : recast(r, grad_2d, r.grad_output_for_grad_weight, 0, Layouts::kOther).t();
        auto input_fp8 = reuse_forward_cast(r, kInput, r.input, r.input_for_grad_weight)
                             ? load_operand(ctx, saved, kInputFp8, "input")
                             : recast(r, input_2d, r.input_for_grad_weight, 0, Layouts::kOther);
        grad_weight = scaled_mm(grad_fp8_t, input_fp8, gemm_dtype(grad_2d.scalar_type(), device),
                                r.grad_weight_fast_accum);
      } else {
        // torchao multiplies grad_output and the input as they are; under CPU autocast they
        // differ (bf16 and float32) and at::mm refuses, so the input takes grad_output's dtype.
        grad_weight = at::mm(grad_2d.t(), input_2d.to(grad_2d.scalar_type()));
      }
    }
    // A batched amax reduction waits for the end of the backward pass: one collective a step.
    if (r.delayed_scaling) flush_delayed_amaxes_when_backward_ends();
    return {grad_input, grad_weight, at::Tensor()};
  }
};

}  // namespace

std::shared_ptr<const KeptWeightCasts> cast_weight(LayerContext& layer, const at::Tensor& weight) {
  at::NoGradGuard no_grad;  // as inside the autograd function's forward
  const auto& r = layer.recipe;
  // As the forward and backward cast it: in both layouts where the backward reuses the forward's
  // cast (delayed), and apart for the grad_input GEMM where a dynamic recipe casts it again, which
  // for an equal tensorwise config is the forward's cast itself (the same bits).
  const bool backward_reuses = reuse_forward_cast(r, kWeight, r.weight, r.weight_for_grad_input);
  auto forward = cast(layer, kWeight, r.weight, weight.t(), 0,
                      backward_reuses ? Layouts::kBoth : Layouts::kSame);
  std::optional<Float8Operand> for_grad_input;
  if (r.weight_for_grad_input.enabled && !backward_reuses) {
    const bool same_cast =
        r.weight_for_grad_input == r.weight && r.weight.granularity == Granularity::tensorwise;
    for_grad_input =
        same_cast ? forward : recast(r, weight.t(), r.weight_for_grad_input, -1, Layouts::kOther);
  }
  return std::make_shared<const KeptWeightCasts>(
      KeptWeightCasts{std::move(forward), std::move(for_grad_input),
                      c10::weak_intrusive_ptr<c10::TensorImpl>(weight.getIntrusivePtr()),
                      weight.storage().getWeakStorageImpl(), weight._version()});
}

bool kept_casts_match(const KeptWeightCasts& kept, const at::Tensor& weight) {
  return kept.weight._unsafe_get_target() == weight.unsafeGetTensorImpl() &&
         kept.storage._unsafe_get_target() == weight.storage().unsafeGetStorageImpl() &&
         kept.version == weight._version();
}

at::Tensor float8_linear_function(const at::Tensor& input, const at::Tensor& weight,
                                  c10::intrusive_ptr<LayerContext> layer) {
  return Float8LinearFunction::apply(input, weight, std::move(layer));
}

}  // namespace amp::fp8::detail
