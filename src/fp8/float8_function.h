// The autograd function behind Float8Linear: torchao's matmul_with_hp_or_float8_args, three
// GEMMs each float8 or high precision per the recipe (delayed scaling casts each operand once per
// step), and what it needs from its layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/custom_class.h>

#include <amp/fp8.h>

#include "fp8/scaling.h"

namespace amp::fp8::detail {

/// The operands a layer casts, indexing its delayed-scaling state and buffer names.
inline constexpr const char* kRoles[3] = {"input", "weight", "grad_output"};
enum Role { kInput = 0, kWeight = 1, kGradOutput = 2 };

/// A weight's casts kept for WeightCasts::reuse, with what identifies the weight they came from.
struct KeptWeightCasts {
  /// The cast for the output GEMM (of weight.t(), as the forward casts it).
  Float8Operand forward;
  /// The cast for the grad_input GEMM where the backward would cast the weight apart from the
  /// forward (dynamic recipes); unset where it reuses `forward` (delayed) or multiplies in high
  /// precision.
  std::optional<Float8Operand> for_grad_input;
  /// The weight: its TensorImpl and StorageImpl (weak references pin their addresses, so an equal
  /// pointer is the same object) and its version counter at the cast.
  c10::weak_intrusive_ptr<c10::TensorImpl> weight;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t version;
};

// What the autograd function needs from its layer: the recipe and, for the delayed recipe, the
// layer's history and scale buffers (updated in place, so a checkpoint of the module holds them).
struct LayerContext : torch::CustomClassHolder {
  Recipe recipe;
  detail::DelayedState delayed[3];
  // Casts of the weight made before the forward (WeightCasts::keep and reuse); null: cast it.
  std::shared_ptr<const KeptWeightCasts> weight_casts;
  // Which gradients the backward computes (grad mode on and the tensor requires grad, as seen at
  // forward time): a frozen weight costs neither its GEMM nor the input kept for it.
  bool needs_grad_input = true;
  bool needs_grad_weight = true;
};

/// The dtype a GEMM whose first operand has `dtype` produces: under autocast for the operand's
/// device type, the autocast dtype (autocast casts both operands of mm), as with torchao.
c10::ScalarType gemm_dtype(c10::ScalarType dtype, c10::DeviceType device);

/// The weight's casts for both of its GEMMs, as the forward and backward would make them, to keep
/// for WeightCasts::reuse (a delayed cast records its amax).
std::shared_ptr<const KeptWeightCasts> cast_weight(LayerContext& layer, const at::Tensor& weight);

/// Whether `kept` was cast from `weight` as it is now (the same tensor, storage and version).
bool kept_casts_match(const KeptWeightCasts& kept, const at::Tensor& weight);

/// input [..., K] @ weight [N, K].t() -> [..., N] through the autograd function; the gradients
/// the layer context asks for flow back to input and weight.
at::Tensor float8_linear_function(const at::Tensor& input, const at::Tensor& weight,
                                  c10::intrusive_ptr<LayerContext> layer);

}  // namespace amp::fp8::detail
