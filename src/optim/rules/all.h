// The update rules the library builds the step engine for: each is instantiated in every CPU loop
// build and in the CUDA kernel, and found by its position in this list. A new optimizer's rule is
// one line here (AllRules); a rule that is not listed does not compile where it is asked for
// (rule_id), and still runs on the CPU through engine/cpu/rule_step_here.h.
#pragma once

#include <cstddef>
#include <type_traits>

#include "optim/rules/adam.h"
#include "optim/rules/lion.h"
#include "optim/rules/sgd.h"

namespace amp::optim::detail {
namespace engine {
namespace {

template <typename... Rules>
struct RuleList {
  static constexpr size_t kSize = sizeof...(Rules);
};

using AllRules = RuleList<AdamRule, SgdRule, LionRule>;

template <typename Rule, typename List>
struct RuleIndex;
template <typename Rule, typename First, typename... Rest>
struct RuleIndex<Rule, RuleList<First, Rest...>> {
  static constexpr size_t value =
      std::is_same_v<Rule, First> ? 0 : 1 + RuleIndex<Rule, RuleList<Rest...>>::value;
};
template <typename Rule>
struct RuleIndex<Rule, RuleList<>> {
  static constexpr size_t value = 0;
};

/// Calls fn(Rule{}) for the rule at `index` of AllRules; returns false for an unknown index.
template <typename Fn, typename... Rules>
bool with_rule_in(RuleList<Rules...>, size_t index, const Fn& fn) {
  size_t position = 0;
  return ((position++ == index ? (fn(Rules{}), true) : false) || ...);
}
template <typename Fn>
bool with_rule(size_t index, const Fn& fn) {
  return with_rule_in(AllRules{}, index, fn);
}

}  // namespace
}  // namespace engine

/// A rule's position in AllRules: how a step names the rule to the library's engine builds.
template <typename Rule>
constexpr size_t rule_id() {
  constexpr size_t index = engine::RuleIndex<Rule, engine::AllRules>::value;
  static_assert(index < engine::AllRules::kSize,
                "this rule is not listed in AllRules (src/optim/rules/all.h): add it there, or "
                "run it with run_rule_step_here (engine/cpu/rule_step_here.h)");
  return index;
}

}  // namespace amp::optim::detail
