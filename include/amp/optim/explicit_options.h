// amp::optim::ExplicitOptions and AMP_OPTION_ARG: optimizer options that remember which fields
// were set, so that a param group keeps every option it states, as in Python, even one equal to
// the options type's default (LibTorch's rule reads such a value as "not set").
#pragma once

#include <string_view>
#include <utility>
#include <vector>

namespace amp::optim {

/// The record of which fields of an options object were set, by its setters or by a constructor
/// taking them; a copy (a clone) keeps it.
class ExplicitOptions {
 public:
  /// Whether `field` (the setter's name, e.g. "weight_decay") was set.
  bool is_set(std::string_view field) const {
    for (const char* name : set_) {
      if (field == name) return true;
    }
    return false;
  }

 protected:
  ExplicitOptions() = default;
  ExplicitOptions(const ExplicitOptions&) = default;
  ExplicitOptions& operator=(const ExplicitOptions&) = default;
  ~ExplicitOptions() = default;

  /// Records `field` (a string literal) as set.
  void mark_set(const char* field) {
    if (!is_set(field)) set_.push_back(field);
  }

 private:
  std::vector<const char*> set_;
};

}  // namespace amp::optim

/// TORCH_ARG for amp's optimizer options: the same chained setter and getters, and the setter also
/// records the field as set (ExplicitOptions::is_set). The non-const getter, which can change the
/// value in place, records nothing.
#define AMP_OPTION_ARG(T, name)                                         \
 public:                                                                \
  inline auto name(const T& new_##name)->decltype(*this) { /* NOLINT */ \
    this->name##_ = new_##name;                                         \
    this->mark_set(#name);                                              \
    return *this;                                                       \
  }                                                                     \
  inline auto name(T&& new_##name)->decltype(*this) { /* NOLINT */      \
    this->name##_ = std::move(new_##name);                              \
    this->mark_set(#name);                                              \
    return *this;                                                       \
  }                                                                     \
  inline const T& name() const noexcept { /* NOLINT */                  \
    return this->name##_;                                               \
  }                                                                     \
  inline T& name() noexcept { /* NOLINT */                              \
    return this->name##_;                                               \
  }                                                                     \
                                                                        \
 private:                                                               \
  T name##_ /* NOLINT */
