// An optimizer's options and per-parameter state described once, as lists of fields (as the
// scaler's option_fields() describes GradScalerOptions): the archive entries, operator== and the
// param-group merge walk the lists. A new option is then its AMP_OPTION_ARG in the public header,
// one row in its optimizer's list, its range check, and its place in the rule's hyper-parameters;
// a new state tensor its TORCH_ARG and one row.
#pragma once

#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "optim/archive_io.h"
#include "optim/low_precision.h"

namespace amp::optim::detail {

/// Whether the archives of LibTorch's counterpart optimizer carry a field: a load then requires
/// it. amp's own fields read as unset (zero, false) when absent.
enum class InLibTorch : bool { kNo, kYes };

/// One field: its name (the setter's, and the archive key), whether LibTorch writes it, and its
/// getter and setter.
template <typename Get, typename Set>
struct OptionField {
  const char* name;
  InLibTorch in_libtorch;
  Get get;  // (const Options&) -> the value
  Set set;  // (Options&, value): the setter, which marks the field as set
};

// clang-format off
// AMP_FOR_EACH_FIELD(macro, type, kind, a, b, ...): macro(type, a, kind), macro(type, b, kind), ...
// (up to 64 names: each AMP_FIELDS_RESCAN level rescans its argument four times).
#define AMP_FIELDS_PARENS ()
#define AMP_FIELDS_RESCAN(...) \
  AMP_FIELDS_RESCAN3(AMP_FIELDS_RESCAN3(AMP_FIELDS_RESCAN3(AMP_FIELDS_RESCAN3(__VA_ARGS__))))
#define AMP_FIELDS_RESCAN3(...) \
  AMP_FIELDS_RESCAN2(AMP_FIELDS_RESCAN2(AMP_FIELDS_RESCAN2(AMP_FIELDS_RESCAN2(__VA_ARGS__))))
#define AMP_FIELDS_RESCAN2(...) \
  AMP_FIELDS_RESCAN1(AMP_FIELDS_RESCAN1(AMP_FIELDS_RESCAN1(AMP_FIELDS_RESCAN1(__VA_ARGS__))))
#define AMP_FIELDS_RESCAN1(...) __VA_ARGS__
#define AMP_FOR_EACH_FIELD(macro, type, kind, ...) \
  __VA_OPT__(AMP_FIELDS_RESCAN(AMP_FOR_EACH_FIELD_STEP(macro, type, kind, __VA_ARGS__)))
#define AMP_FOR_EACH_FIELD_STEP(macro, type, kind, field, ...) \
  macro(type, field, kind)                                     \
  __VA_OPT__(, AMP_FOR_EACH_FIELD_AGAIN AMP_FIELDS_PARENS(macro, type, kind, __VA_ARGS__))
#define AMP_FOR_EACH_FIELD_AGAIN() AMP_FOR_EACH_FIELD_STEP
// clang-format on

// clang-format off
/// The field `field` of the options type `Options`, through its getter and setter.
#define AMP_OPTIMIZER_FIELD(Options, field, in_libtorch)                                \
  ::amp::optim::detail::OptionField{                                                    \
      #field, ::amp::optim::detail::InLibTorch::in_libtorch,                            \
      [](const Options& o) -> decltype(auto) { return o.field(); },                     \
      [](Options& o, const std::decay_t<decltype(std::declval<const Options&>().field())>& v) { \
        o.field(v);                                                                     \
      }}
/// AMP_OPTIMIZER_FIELD for each of the fields named after `in_libtorch`, in order.
#define AMP_OPTIMIZER_FIELDS(Options, in_libtorch, ...) \
  AMP_FOR_EACH_FIELD(AMP_OPTIMIZER_FIELD, Options, in_libtorch, __VA_ARGS__)
// clang-format on

// The archive forms of the value types options use.
inline void write_value(torch::serialize::OutputArchive& archive, const char* key, double v) {
  archive.write(key, c10::IValue(v));
}
inline void write_value(torch::serialize::OutputArchive& archive, const char* key, bool v) {
  archive.write(key, c10::IValue(v));
}
inline void write_value(torch::serialize::OutputArchive& archive, const char* key,
                        const std::tuple<double, double>& v) {
  archive.write(key, c10::IValue(v));
}
inline void read_value(torch::serialize::InputArchive& archive, const char* key, bool required,
                       double& v) {
  v = read_double(archive, key, required, 0.0);
}
inline void read_value(torch::serialize::InputArchive& archive, const char* key, bool required,
                       bool& v) {
  v = read_bool(archive, key, required, false);
}
inline void read_value(torch::serialize::InputArchive& archive, const char* key, bool required,
                       std::tuple<double, double>& v) {
  TORCH_INTERNAL_ASSERT(required && std::string_view(key) == "betas");
  v = read_betas(archive);
}

/// The fields of one options type, in archive order, with what every optimizer does with them.
template <typename... Fields>
class OptionList {
 public:
  constexpr explicit OptionList(Fields... fields) : fields_(fields...) {}

  /// The fields, then the low-precision options (written after LibTorch's own entries, which
  /// LibTorch's optimizers read, ignoring the rest).
  template <typename Options>
  void write(const Options& o, torch::serialize::OutputArchive& archive) const {
    std::apply([&](const auto&... f) { (write_value(archive, f.name, f.get(o)), ...); }, fields_);
    write_low_precision(o, archive);
  }

  /// Reads what write() wrote, or LibTorch's counterpart's archive (amp's fields absent).
  template <typename Options>
  void read(Options& o, torch::serialize::InputArchive& archive) const {
    std::apply(
        [&](const auto&... f) {
          (
              [&](const auto& field) {
                std::decay_t<decltype(field.get(o))> value{};
                read_value(archive, field.name, field.in_libtorch == InLibTorch::kYes, value);
                field.set(o, value);
              }(f),
              ...);
        },
        fields_);
    read_low_precision(o, archive);
  }

  /// Field by field.
  template <typename Options>
  bool equal(const Options& lhs, const Options& rhs) const {
    return std::apply([&](const auto&... f) { return ((f.get(lhs) == f.get(rhs)) && ...); },
                      fields_) &&
           equal_low_precision(lhs, rhs);
  }

  /// Python's rule: each field `group` set (ExplicitOptions::is_set), the others from
  /// `defaults`; the low-precision write-backs as one choice (merge_low_precision).
  template <typename Options>
  Options merge(const Options& group, const Options& defaults) const {
    Options merged = defaults;
    std::apply(
        [&](const auto&... f) {
          ((group.is_set(f.name) ? f.set(merged, f.get(group)) : void()), ...);
        },
        fields_);
    merge_low_precision(merged, group);
    return merged;
  }

 private:
  std::tuple<Fields...> fields_;
};

/// How a state tensor is archived: as a tensor (undefined: left out), or as a step count, an
/// int64 as LibTorch's Adam keeps it (write_step_count, read_step_count).
enum class StateKind : bool { kTensor, kStepCount };

/// One state tensor of a ParamState: its archive key (the accessor's name), how it is archived,
/// and its accessors.
template <typename Get, typename Set>
struct StateField {
  const char* name;
  StateKind kind;
  Get get;  // (const State&) -> const at::Tensor&
  Set set;  // (State&, at::Tensor)
};

// clang-format off
/// The tensor `field` of the state type `State`, archived as `kind` (kTensor or kStepCount).
#define AMP_STATE_FIELD(State, field, kind)                              \
  ::amp::optim::detail::StateField{                                      \
      #field, ::amp::optim::detail::StateKind::kind,                     \
      [](const State& s) -> const at::Tensor& { return s.field(); },     \
      [](State& s, const at::Tensor& t) { s.field(t); }}
/// AMP_STATE_FIELD for each of the tensors named after `kind`, in order.
#define AMP_STATE_FIELDS(State, kind, ...) \
  AMP_FOR_EACH_FIELD(AMP_STATE_FIELD, State, kind, __VA_ARGS__)
// clang-format on

/// The state tensors of one ParamState type, in archive order (an undefined tensor is not
/// written, as LibTorch and Python leave it out, and reads back undefined).
template <typename... Fields>
class StateList {
 public:
  constexpr explicit StateList(Fields... fields) : fields_(fields...) {}

  template <typename State>
  void write(const State& state, torch::serialize::OutputArchive& archive) const {
    std::apply(
        [&](const auto&... f) {
          ((f.kind == StateKind::kStepCount ? write_step_count(archive, f.get(state))
                                            : write_tensor(archive, f.name, f.get(state))),
           ...);
        },
        fields_);
  }
  template <typename State>
  void read(State& state, torch::serialize::InputArchive& archive) const {
    std::apply(
        [&](const auto&... f) {
          (f.set(state, f.kind == StateKind::kStepCount ? read_step_count(archive)
                                                        : read_tensor(archive, f.name)),
           ...);
        },
        fields_);
  }
  /// Tensor by tensor (same_tensor).
  template <typename State>
  bool equal(const State& lhs, const State& rhs) const {
    return std::apply(
        [&](const auto&... f) { return (same_tensor(f.get(lhs), f.get(rhs)) && ...); }, fields_);
  }

 private:
  std::tuple<Fields...> fields_;
};

/// Defines the two serialize() members and operator== of an options type from its OptionList,
/// or of a ParamState type from its StateList, `fields()`.
#define AMP_SERIALIZE_FROM_FIELDS(Type, fields)                                                    \
  void Type::serialize(torch::serialize::OutputArchive& archive) const {                           \
    fields().write(*this, archive);                                                                \
  }                                                                                                \
  void Type::serialize(torch::serialize::InputArchive& archive) { fields().read(*this, archive); } \
  bool operator==(const Type& lhs, const Type& rhs) { return fields().equal(lhs, rhs); }

}  // namespace amp::optim::detail
