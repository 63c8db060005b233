// amp::detail::option_fields(): GradScalerOptions described as data, for the code that saves and
// loads the scaler's extension keys and compares options across ranks (amp::distributed).
#pragma once

#include <vector>

#include <amp/export.h>
#include <amp/grad_scaler.h>

namespace amp::detail {

/// One field of GradScalerOptions described as data. The code that saves and loads amp's
/// extension keys and the code that compares options across ranks walk option_fields() instead
/// of naming every field, so a new option is one member of GradScalerOptions and one row in
/// src/scaler/option_fields.cpp.
struct OptionField {
  /// How the value is kept; every value travels as a double, which holds each one exactly.
  enum class Kind { kFloat, kInt, kBool, kPolicy };
  const char* name;  // the setter's name, as error messages print it
  Kind kind;
  const char* state_key;    // its own key in state_dict() (an extension key), or nullptr
  bool saved_as_extension;  // away from its default, state_dict() writes amp's extension keys
  double (*get)(const GradScalerOptions&);
  void (*set)(GradScalerOptions&, double);
};

/// Every field of GradScalerOptions except found_inf_sync (a process-group handle, not a value):
/// `enabled`, then the others in declaration order.
AMP_EXPORT const std::vector<OptionField>& option_fields();
}  // namespace amp::detail
