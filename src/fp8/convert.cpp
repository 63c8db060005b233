// convert_to_float8_training: finds the Linear layers of a module tree (depth first, as
// named_modules) and swaps each accepted one for a Float8Linear sharing its parameters, in the
// registry and in the container that holds it; every check before the first change.
#include <amp/fp8.h>

#include <functional>

#include <c10/util/Exception.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

namespace amp::fp8 {

namespace {

// Replaces `old_child` in the container `parent` holds it in (Sequential, ModuleList, ModuleDict);
// does nothing when `parent` is no such container.
void replace_in_container(torch::nn::Module& parent,
                          const std::shared_ptr<torch::nn::Module>& old_child,
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
            if (!filter || filter(name, *linear))
              candidates.push_back({&parent, child.key(), name});
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
    Float8Linear replacement(
        std::make_shared<Float8LinearImpl>(*child->as<torch::nn::LinearImpl>(), recipe));
    replacement->set_qualified_name(c.qualified_name);
    replace_in_container(*c.parent, child, replacement);
    c.parent->replace_module(c.child_key, replacement);
    converted.push_back(c.qualified_name);
  }
  return converted;
}

}  // namespace amp::fp8
