// The optimizers' low-precision options (LowPrecisionOptions, mixed into every options type):
// their checks, merging and checkpoint entries, the plan they give a parameter of a given dtype,
// and the step engine's slots and arguments built from them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "optim/archive_io.h"
#include "optim/engine/step.h"

namespace amp::optim::detail {

/// How a parameter is updated when the low-precision options apply to it.
struct LowPrecisionPlan {
  WriteBack write_back;
  c10::ScalarType state_dtype;
};

inline bool is_low_precision(c10::ScalarType dtype) {
  return dtype == c10::kBFloat16 || dtype == c10::kHalf;
}

/// Whether any low-precision option is set.
template <typename Options>
bool wants_low_precision(const Options& o) {
  return o.master_weights() || o.kahan_summation() || o.stochastic_rounding() ||
         o.state_dtype().has_value();
}

/// The plan for a parameter of `dtype`, or nullopt when ATen's fused kernel updates it as before
/// (float32/float64 parameters, or no low-precision option set).
template <typename Options>
std::optional<LowPrecisionPlan> low_precision_plan(const Options& o, c10::ScalarType dtype) {
  if (!is_low_precision(dtype) || !wants_low_precision(o)) return std::nullopt;
  WriteBack write_back = WriteBack::kRoundNearest;
  if (o.master_weights()) write_back = WriteBack::kMasterWeights;
  if (o.kahan_summation()) write_back = WriteBack::kKahan;
  if (o.stochastic_rounding()) write_back = WriteBack::kStochastic;
  // float32 moments unless asked otherwise, whatever the write-back: in bf16, Adam's second
  // moment stops moving once 0.001 * (g^2 - v) is below half its rounding step, and every later
  // update is too large (docs/GUIDE.md, "Which state dtype").
  return LowPrecisionPlan{write_back, o.state_dtype().value_or(c10::kFloat)};
}

/// The dtype of a parameter's state tensors under `o`.
template <typename Options>
c10::ScalarType state_dtype_for(const Options& o, c10::ScalarType param_dtype) {
  const auto plan = low_precision_plan(o, param_dtype);
  return plan ? plan->state_dtype : param_dtype;
}

/// The options alone: at most one of the three write-backs; a state dtype amp's kernels store;
/// no capturable (the modes run amp's own kernels, which CUDA graphs do not capture yet).
template <typename Options>
void check_low_precision_options(const Options& o, const std::string& where) {
  const int modes =
      int{o.master_weights()} + int{o.kahan_summation()} + int{o.stochastic_rounding()};
  TORCH_CHECK(modes <= 1, where, ": master_weights(", o.master_weights(), "), kahan_summation(",
              o.kahan_summation(), ") and stochastic_rounding(", o.stochastic_rounding(),
              ") are alternatives: each keeps the updates a low-precision parameter would lose "
              "(an fp32 copy; a compensation buffer; unbiased rounding). Choose one.");
  if (const auto dtype = o.state_dtype()) {
    TORCH_CHECK(*dtype == c10::kFloat || *dtype == c10::kBFloat16 || *dtype == c10::kHalf, where,
                ": state_dtype must be Float, BFloat16 or Half. Got state_dtype=", *dtype,
                "; leave it unset for float32.");
  }
  TORCH_CHECK(!o.capturable() || !wants_low_precision(o), where,
              ": capturable(true) cannot be combined with master_weights, kahan_summation, "
              "stochastic_rounding or state_dtype, which run amp's own kernels rather than "
              "ATen's capturable ones; drop one of the two.");
}

/// The group's parameters against the options: stochastic rounding rounds to bfloat16 only and
/// numbers at most 2^32 elements of a parameter. float32 parameters are updated as without the
/// options (docs/GUIDE.md says what each option does to them), so a group of float32
/// normalisation weights may carry them (check_some_low_precision is the optimizer-wide check).
template <typename Options>
void check_low_precision_params(const Options& o, const std::vector<at::Tensor>& params,
                                const std::string& where) {
  if (!o.stochastic_rounding()) return;
  for (size_t i = 0; i < params.size(); ++i) {
    // The engine's legal matrix decides which low-precision dtypes stochastic rounding writes.
    const c10::ScalarType dtype = params[i].scalar_type();
    const bool rounds_stochastically =
        !is_low_precision(dtype) ||
        unsupported_step(*kernels::dtype_of(dtype), kernels::Dtype::kFloat,
                         WriteBack::kStochastic) == nullptr;
    TORCH_CHECK(rounds_stochastically, where, ": parameter ", i, " is ", dtype,
                ", but stochastic_rounding rounds to bfloat16 only (float16 has too few "
                "exponent bits for the dither to stay unbiased near its range limits); use "
                "kahan_summation or master_weights for float16 parameters.");
    TORCH_CHECK(params[i].numel() < (int64_t{1} << 32), where, ": parameter ", i, " has ",
                params[i].numel(),
                " elements, but stochastic rounding numbers elements with 32 "
                "bits; split it.");
  }
}

/// A low-precision option set on an optimizer none of whose parameters is bfloat16/float16 acts
/// on nothing: most likely the model was not cast. Throws a sentence starting with `name`.
/// `lists`: the groups already in the optimizer and those being added.
template <typename Options>
void check_some_low_precision(
    std::initializer_list<const std::vector<torch::optim::OptimizerParamGroup>*> lists,
    const char* name) {
  bool asked = false, any_low = false;
  c10::ScalarType seen = c10::kFloat;
  for (const auto* groups : lists) {
    for (const auto& group : *groups) {
      asked = asked || wants_low_precision(static_cast<const Options&>(group.options()));
      for (const auto& p : group.params()) {
        any_low = any_low || is_low_precision(p.scalar_type());
        seen = p.scalar_type();
      }
    }
  }
  TORCH_CHECK(!asked || any_low, name,
              ": master_weights, kahan_summation, stochastic_rounding and state_dtype act on "
              "bfloat16/float16 parameters, and none of the optimizer's parameters is one (they "
              "are ",
              seen, "); cast the model first (amp::to_low_precision) or drop these options.");
}

/// `merged.field` becomes `group.field` where the group set it (ExplicitOptions::is_set); the
/// merges of every options type are written with it.
#define AMP_TAKE_IF_SET(merged, group, field) \
  if ((group).is_set(#field)) (merged).field((group).field())

/// The low-precision fields of `merged` (a copy of the optimizer's defaults) from `group`, by
/// Python's rule (what the group set), with the three write-backs as one choice: a group that
/// turns one of them on replaces the defaults' write-back, so that master_weights(true) in a group
/// under kahan_summation(true) defaults asks for master weights, not for both.
template <typename Options>
void merge_low_precision(Options& merged, const Options& group) {
  const bool chooses_write_back =
      (group.is_set("master_weights") && group.master_weights()) ||
      (group.is_set("kahan_summation") && group.kahan_summation()) ||
      (group.is_set("stochastic_rounding") && group.stochastic_rounding());
  if (chooses_write_back) {
    merged.master_weights(group.is_set("master_weights") && group.master_weights())
        .kahan_summation(group.is_set("kahan_summation") && group.kahan_summation())
        .stochastic_rounding(group.is_set("stochastic_rounding") && group.stochastic_rounding());
  } else {
    AMP_TAKE_IF_SET(merged, group, master_weights);
    AMP_TAKE_IF_SET(merged, group, kahan_summation);
    AMP_TAKE_IF_SET(merged, group, stochastic_rounding);
  }
  AMP_TAKE_IF_SET(merged, group, state_dtype);
  AMP_TAKE_IF_SET(merged, group, rounding_seed);
}

template <typename Options>
bool equal_low_precision(const Options& lhs, const Options& rhs) {
  return lhs.master_weights() == rhs.master_weights() &&
         lhs.kahan_summation() == rhs.kahan_summation() &&
         lhs.stochastic_rounding() == rhs.stochastic_rounding() &&
         lhs.state_dtype() == rhs.state_dtype() && lhs.rounding_seed() == rhs.rounding_seed();
}

/// Written after LibTorch's own entries (which LibTorch's optimizers read and ignore the rest).
template <typename Options>
void write_low_precision(const Options& o, torch::serialize::OutputArchive& archive) {
  archive.write("master_weights", c10::IValue(o.master_weights()));
  archive.write("kahan_summation", c10::IValue(o.kahan_summation()));
  archive.write("stochastic_rounding", c10::IValue(o.stochastic_rounding()));
  // -1: unset, else the ScalarType's number.
  archive.write("state_dtype",
                c10::IValue(o.state_dtype() ? static_cast<int64_t>(*o.state_dtype()) : -1));
  archive.write("rounding_seed", c10::IValue(o.rounding_seed()));
}

/// Absent entries (checkpoints of LibTorch or of amp before these options) read as unset.
template <typename Options>
void read_low_precision(Options& o, torch::serialize::InputArchive& archive) {
  o.master_weights(read_bool(archive, "master_weights", false, false))
      .kahan_summation(read_bool(archive, "kahan_summation", false, false))
      .stochastic_rounding(read_bool(archive, "stochastic_rounding", false, false));
  const int64_t dtype = read_int(archive, "state_dtype", false, -1);
  TORCH_CHECK(dtype == -1 || dtype == static_cast<int64_t>(c10::kFloat) ||
                  dtype == static_cast<int64_t>(c10::kBFloat16) ||
                  dtype == static_cast<int64_t>(c10::kHalf),
              "the entry \"state_dtype\" is ", dtype,
              ", not -1 (unset) or the number of Float, BFloat16 or Half");
  o.state_dtype(dtype == -1 ? std::nullopt
                            : std::optional<c10::ScalarType>(static_cast<c10::ScalarType>(dtype)));
  o.rounding_seed(read_int(archive, "rounding_seed", false, 0));
}

/// Each parameter's position in its optimizer (groups in order, parameters in order): the stream
/// of rounding bits it draws, stable across save and load. Counted on first use.
class ParamPositions {
 public:
  /// `given`: positions set from outside (PositionedParams), which take precedence.
  ParamPositions(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                 const std::unordered_map<const void*, uint64_t>& given)
      : groups_(groups), given_(given) {}
  uint64_t of(const at::Tensor& param) const {
    if (const auto found = given_.find(param.unsafeGetTensorImpl()); found != given_.end())
      return found->second;
    if (positions_.empty()) {
      uint64_t next = 0;
      for (const auto& group : groups_) {
        for (const auto& p : group.params()) positions_.emplace(p.unsafeGetTensorImpl(), next++);
      }
    }
    return positions_.at(param.unsafeGetTensorImpl());
  }

 private:
  const std::vector<torch::optim::OptimizerParamGroup>& groups_;
  const std::unordered_map<const void*, uint64_t>& given_;
  mutable std::unordered_map<const void*, uint64_t> positions_;
};

/// The step's shared inputs for the engine: the plan, the seed and the scaler's hand-over.
template <typename Options>
StepArgs step_args(const Options& o, const LowPrecisionPlan& plan,
                   const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf) {
  StepArgs args;
  args.write_back = plan.write_back;
  args.state_dtype = plan.state_dtype;
  args.seed = static_cast<uint64_t>(o.rounding_seed());
  if (grad_scale) args.grad_scale = *grad_scale;
  if (found_inf) args.found_inf = *found_inf;
  return args;
}

/// A slot of the engine for `param` at `position` in its optimizer, with the step count, master
/// copy and compensation `plan` needs (created in the caller's state tensors when missing,
/// dropped when the plan has no use for them); the rule's own state slots are the caller's.
StepSlot engine_slot(const at::Tensor& param, uint64_t position, at::Tensor& step,
                     at::Tensor& master, at::Tensor& comp, const LowPrecisionPlan& plan);

/// Checks that the step engine can run on `param` (CPU or, built with CUDA, CUDA; contiguous),
/// the parameter at `position` in the optimizer; throws a sentence starting with `where`.
void check_low_precision_param(const at::Tensor& param, uint64_t position,
                               const std::string& where);

/// `saved` (a loaded state tensor) checked against `param` and copied to its device, as `dtype`,
/// in the parameter's layout (strides); undefined stays undefined. `key` names it in the error.
at::Tensor loaded_state_tensor(const at::Tensor& saved, const at::Tensor& param,
                               c10::ScalarType dtype, const char* key, const std::string& where);

/// A state tensor for `param` in `dtype`: `current` when it already is one, else a conversion of
/// it, else zeros (the first step).
at::Tensor state_tensor(const at::Tensor& current, const at::Tensor& param, c10::ScalarType dtype);

/// The master copy and compensation a parameter needs under `plan` (nullopt: neither): kept when
/// present, created from the parameter (master) or as zeros (compensation), dropped otherwise.
void fit_write_back_state(at::Tensor& master, at::Tensor& comp, const at::Tensor& param,
                          const std::optional<LowPrecisionPlan>& plan);

/// An optimizer's per-parameter state, as torch::optim::Optimizer keeps it (keyed by TensorImpl).
using StateMap = ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

/// The engine's slots for one dtype bucket of a group under `plan`, the one loop every optimizer
/// on the engine shares: each parameter checked (throws a sentence starting with `where`), its
/// `State` entry created on first use and given the step count, master copy and compensation the
/// plan needs, then `fill_rule_state(state, param, slot)` sets the rule's own state slots (in
/// plan.state_dtype, through state_tensor()).
template <typename State, typename FillRuleState>
std::vector<StepSlot> engine_slots(StateMap& states, const std::vector<at::Tensor>& params,
                                   const ParamPositions& positions, const LowPrecisionPlan& plan,
                                   const std::string& where, const FillRuleState& fill_rule_state) {
  std::vector<StepSlot> slots;
  slots.reserve(params.size());
  for (const at::Tensor& param : params) {
    const uint64_t position = positions.of(param);
    check_low_precision_param(param, position, where);
    auto& entry = states[param.unsafeGetTensorImpl()];
    if (!entry) entry = std::make_unique<State>();
    auto& state = static_cast<State&>(*entry);
    at::Tensor step = state.step(), master = state.master_weight(), comp = state.kahan_comp();
    StepSlot slot = engine_slot(param, position, step, master, comp, plan);
    state.step(step).master_weight(master).kahan_comp(comp);
    fill_rule_state(state, param, slot);
    slots.push_back(std::move(slot));
  }
  return slots;
}

/// One dtype bucket of a group's step on the engine: the parameters, their plan and positions,
/// the scaler's hand-over, and `where` for errors.
struct EngineBucket {
  StateMap& states;
  const LowPrecisionPlan& plan;
  const std::vector<at::Tensor>& params;
  const ParamPositions& positions;
  const std::optional<at::Tensor>& grad_scale;
  const std::optional<at::Tensor>& found_inf;
  const std::string& where;
};

/// Runs `Rule` over a bucket: engine_slots() with the rule's `fill_rule_state`, then the step
/// with `hyper`. Every optimizer on the engine takes this path.
template <typename Rule, typename State, typename Options, typename FillRuleState>
void step_on_engine(const EngineBucket& bucket, const Options& o, const typename Rule::Hyper& hyper,
                    const FillRuleState& fill_rule_state) {
  const auto slots = engine_slots<State>(bucket.states, bucket.params, bucket.positions,
                                         bucket.plan, bucket.where, fill_rule_state);
  run_rule_step<Rule>(slots, hyper, step_args(o, bucket.plan, bucket.grad_scale, bucket.found_inf));
}

/// The master copy and compensation of a loaded state entry (`saved`), kept where `plan` (the
/// loaded options' plan for the parameter; nullopt: none) uses them, checked against `param` and
/// moved to its device (the first step creates missing ones).
template <typename State>
void load_write_back_state(State& state, const State& saved, const at::Tensor& param,
                           const std::optional<LowPrecisionPlan>& plan, const std::string& where) {
  if (plan && plan->write_back == WriteBack::kMasterWeights) {
    state.master_weight(
        loaded_state_tensor(saved.master_weight(), param, at::kFloat, "master_weight", where));
  }
  if (plan && plan->write_back == WriteBack::kKahan) {
    state.kahan_comp(
        loaded_state_tensor(saved.kahan_comp(), param, param.scalar_type(), "kahan_comp", where));
  }
}

}  // namespace amp::optim::detail
