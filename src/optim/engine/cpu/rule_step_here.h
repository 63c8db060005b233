// One rule's step on the CPU: the skip decision, the step counts (host values here), each slot's
// constants and rounding key, then one parallel pass over every element (kernels/cpu_ranges.h).
// The library's listed rules run it with the widest per-instruction-set loop build
// (rule_step_cpu.cpp); run_rule_step_here() runs any rule, listed or not (a new one, a test's),
// with the loop compiled in the including file.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "kernels/cpu_ranges.h"
#include "optim/engine/cpu/rule_loop.h"
#include "optim/engine/step.h"

namespace amp::optim::detail::cpu {

/// Runs `Rule` over `slots` (CPU tensors, one parameter dtype) with `range(kind, pointers,
/// scalars, key, unscale, begin, end)` for each element range; `rule` is what the kind carries.
template <typename Rule, typename Range>
void run_rule_on_cpu(size_t rule, const std::vector<StepSlot>& slots,
                     const typename Rule::Hyper& hyper, const StepArgs& args, const Range& range) {
  if (slots.empty()) return;
  const StepKind kind = step_kind(rule, slots, args, Rule::variant(hyper));
  if (args.found_inf.defined() && *args.found_inf.data_ptr<float>() != 0.0f) return;
  const bool unscale = args.grad_scale.defined();
  const float scale = unscale ? *args.grad_scale.data_ptr<float>() : 1.0f;
  std::vector<typename Rule::Scalars> scalars;
  std::vector<uint64_t> keys;
  std::vector<RangePointers> pointers;
  std::vector<int64_t> numels;
  const auto data = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  for (const StepSlot& slot : slots) {
    // Counts the step (where the slot keeps a count); the rule reads the count after it.
    float count = 0.0f;
    if (slot.step.defined()) count = ++*slot.step.data_ptr<float>();
    scalars.push_back(Rule::scalars(hyper, count, slot.first, scale));
    keys.push_back(engine::tensor_key(args.seed, slot.stream, static_cast<uint64_t>(count)));
    RangePointers r{data(slot.param),
                    data(slot.grad),
                    slot.master.defined() ? slot.master.data_ptr<float>() : nullptr,
                    data(slot.comp),
                    {}};
    for (int s = 0; s < kMaxStateSlots; ++s) r.state[s] = data(slot.state[s]);
    pointers.push_back(r);
    numels.push_back(slot.param.numel());
  }
  kernels::for_each_list_range(numels, [&](int, size_t k, int64_t begin, int64_t end) {
    range(kind, pointers[k], &scalars[k], keys[k], unscale, begin, end);
  });
}

}  // namespace amp::optim::detail::cpu

namespace amp::optim::detail {

/// Runs `Rule` over `slots` (CPU tensors of one dtype) as the engine runs a listed rule, with the
/// element loop compiled here at this file's instruction set: how a rule that rules/all.h does
/// not list runs (engine/rule.h says what a rule provides).
template <typename Rule>
void run_rule_step_here(const std::vector<StepSlot>& slots, const typename Rule::Hyper& hyper,
                        const StepArgs& args) {
  for (const StepSlot& slot : slots) {
    TORCH_CHECK(slot.param.device().is_cpu(), Rule::kName,
                ": run_rule_step_here runs on CPU tensors; the parameter is on ",
                slot.param.device(), ". List the rule in rules/all.h for the CUDA kernel.");
  }
  cpu::run_rule_on_cpu<Rule>(
      kUnlistedRule, slots, hyper, args,
      [](const StepKind& kind, const cpu::RangePointers& r, const void* scalars, uint64_t key,
         bool unscale, int64_t begin,
         int64_t end) { cpu::rule_range<Rule>(kind, r, scalars, key, unscale, begin, end); });
}

}  // namespace amp::optim::detail
