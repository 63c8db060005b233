// amp::fp8::Recipe: torchao's three dynamic recipes, Transformer Engine's delayed scaling, and the
// consistency checks of a hand-made recipe.
#include <amp/fp8.h>

#include <c10/util/Exception.h>

namespace amp::fp8 {
namespace {

constexpr auto kE4M3 = c10::ScalarType::Float8_e4m3fn;
constexpr auto kE5M2 = c10::ScalarType::Float8_e5m2;

CastConfig cast(Granularity granularity, c10::ScalarType dtype) {
  return CastConfig{true, granularity, dtype};
}

// Every operand of both GEMMs cast with `granularity`: inputs and weights to e4m3, gradients to
// `grad_dtype`.
Recipe every_operand(const char* name, Granularity granularity, c10::ScalarType grad_dtype) {
  Recipe r;
  r.name = name;
  r.input = r.input_for_grad_weight = r.weight = r.weight_for_grad_input = cast(granularity, kE4M3);
  r.grad_output = r.grad_output_for_grad_weight = cast(granularity, grad_dtype);
  return r;
}

const char* granularity_name(Granularity granularity) {
  return granularity == Granularity::tensorwise ? "tensorwise" : "rowwise";
}

void check_pair(const CastConfig& a, const char* a_name, const CastConfig& b, const char* b_name,
                const char* gemm) {
  TORCH_CHECK(a.enabled == b.enabled, "amp::fp8::Recipe: the ", gemm, " GEMM has ", a_name, " ",
              a.enabled ? "in float8" : "in high precision", " but ", b_name, " ",
              b.enabled ? "in float8" : "in high precision",
              "; enable or disable both operands of a GEMM.");
}

void check_same_dtype(const CastConfig& a, const CastConfig& b, const char* operand) {
  if (!a.enabled || !b.enabled) return;
  TORCH_CHECK(a.dtype == b.dtype, "amp::fp8::Recipe: ", operand, " is cast to ", a.dtype,
              " for one GEMM and to ", b.dtype,
              " for the other; an operand must be cast to the same float8 dtype in both.");
}

void check_dtype(const CastConfig& config, const char* operand) {
  TORCH_CHECK(!config.enabled || config.dtype == kE4M3 || config.dtype == kE5M2,
              "amp::fp8::Recipe: ", operand, ".dtype must be Float8_e4m3fn or Float8_e5m2. Got ",
              config.dtype, ".");
}

}  // namespace

Recipe Recipe::tensorwise() { return every_operand("tensorwise", Granularity::tensorwise, kE5M2); }

Recipe Recipe::rowwise() {
  // torchao's rowwise recipe keeps its gradients in e4m3 and power-of-2 scales.
  Recipe r = every_operand("rowwise", Granularity::rowwise, kE4M3);
  r.round_scales_to_power_of_2 = true;
  return r;
}

Recipe Recipe::rowwise_with_gw_hp() {
  Recipe r = rowwise();
  r.name = "rowwise_with_gw_hp";
  r.weight_for_grad_input = cast(Granularity::tensorwise, kE4M3);
  r.input_for_grad_weight = CastConfig{false, Granularity::tensorwise, kE4M3};
  r.grad_output_for_grad_weight = CastConfig{false, Granularity::tensorwise, kE4M3};
  return r;
}

Recipe Recipe::delayed(DelayedScalingOptions options) {
  Recipe r = tensorwise();
  r.name = "delayed";
  if (options.fp8_format() == Float8Format::e4m3) {
    r.grad_output = r.grad_output_for_grad_weight = cast(Granularity::tensorwise, kE4M3);
  }
  r.delayed_scaling = std::move(options);
  return r;
}

const std::vector<std::string>& Recipe::names() {
  static const std::vector<std::string> kNames = {"tensorwise", "rowwise", "rowwise_with_gw_hp",
                                                  "delayed"};
  return kNames;
}

Recipe Recipe::from_name(const std::string& name) {
  if (name == "tensorwise") return tensorwise();
  if (name == "rowwise") return rowwise();
  if (name == "rowwise_with_gw_hp") return rowwise_with_gw_hp();
  if (name == "delayed") return delayed();
  std::string valid;
  for (size_t i = 0; i < names().size(); ++i) {
    valid += (i == 0 ? "" : i + 1 == names().size() ? " or " : ", ") + names()[i];
  }
  TORCH_CHECK(false, "amp::fp8::Recipe::from_name: unknown recipe name '", name, "'; use ", valid,
              ".");
}

void Recipe::validate() const {
  check_dtype(input, "input");
  check_dtype(weight, "weight");
  check_dtype(grad_output, "grad_output");
  check_dtype(input_for_grad_weight, "input_for_grad_weight");
  check_dtype(weight_for_grad_input, "weight_for_grad_input");
  check_dtype(grad_output_for_grad_weight, "grad_output_for_grad_weight");
  check_pair(input, "input", weight, "weight", "output");
  check_pair(grad_output, "grad_output", weight_for_grad_input, "weight_for_grad_input",
             "grad_input");
  check_pair(input_for_grad_weight, "input_for_grad_weight", grad_output_for_grad_weight,
             "grad_output_for_grad_weight", "grad_weight");
  check_same_dtype(input, input_for_grad_weight, "input");
  check_same_dtype(weight, weight_for_grad_input, "weight");
  check_same_dtype(grad_output, grad_output_for_grad_weight, "grad_output");
  if (!delayed_scaling) return;
  const auto& d = *delayed_scaling;
  TORCH_CHECK(d.amax_history_len() >= 1,
              "amp::fp8::DelayedScalingOptions: amax_history_len must be at least 1. Got ",
              d.amax_history_len(), ".");
  TORCH_CHECK(d.margin() >= 0 && d.margin() <= 126,
              "amp::fp8::DelayedScalingOptions: margin must be in [0, 126]. Got ", d.margin(), ".");
  for (const auto* config : {&input, &weight, &grad_output, &input_for_grad_weight,
                             &weight_for_grad_input, &grad_output_for_grad_weight}) {
    TORCH_CHECK(config->enabled && config->granularity == Granularity::tensorwise,
                "amp::fp8::Recipe: the delayed recipe casts every operand tensorwise in float8; "
                "found a ",
                config->enabled ? granularity_name(config->granularity) : "disabled",
                " cast. Use Recipe::delayed() as it comes.");
  }
  TORCH_CHECK(input == input_for_grad_weight && weight == weight_for_grad_input &&
                  grad_output == grad_output_for_grad_weight,
              "amp::fp8::Recipe: the delayed recipe casts each operand once per step and uses it "
              "in both its GEMMs; the *_for_grad_* casts must equal the forward ones.");
}

}  // namespace amp::fp8
