// GradScalerOptions as a table (detail::option_fields): the one list of option names, kinds and
// state-dict keys that state_dict()/load_state_dict() and amp::distributed's option check read.
#include <amp/detail/option_fields.h>
#include <amp/grad_scaler.h>

#include <type_traits>

namespace amp::detail {

namespace {

using Kind = OptionField::Kind;

// A row for a field whose value converts to and from double with a static_cast.
// clang-format off
#define AMP_OPTION_ROW(field, kind, key, saved)                                            \
  OptionField{#field, kind, key, saved,                                                    \
              [](const GradScalerOptions& o) { return static_cast<double>(o.field()); }, \
              [](GradScalerOptions& o, double v) {                                         \
                o.field(static_cast<std::decay_t<decltype(o.field())>>(v));                \
              }}
// clang-format on

}  // namespace

const std::vector<OptionField>& option_fields() {
  static const std::vector<OptionField> fields{
      // `enabled` first: the cross-rank check reports it before the values it makes moot.
      AMP_OPTION_ROW(enabled, Kind::kBool, nullptr, false),
      AMP_OPTION_ROW(init_scale, Kind::kFloat, nullptr, false),
      AMP_OPTION_ROW(growth_factor, Kind::kFloat, nullptr, false),
      AMP_OPTION_ROW(backoff_factor, Kind::kFloat, nullptr, false),
      AMP_OPTION_ROW(growth_interval, Kind::kInt, nullptr, false),
      AMP_OPTION_ROW(hysteresis, Kind::kInt, "_amp_hysteresis", true),
      AMP_OPTION_ROW(consecutive_hysteresis, Kind::kBool, "_amp_consecutive_hysteresis", true),
      AMP_OPTION_ROW(min_scale, Kind::kFloat, "_amp_min_scale", true),
      AMP_OPTION_ROW(max_scale, Kind::kFloat, "_amp_max_scale", true),
      // A policy, not state: a checkpoint does not carry it (as `enabled`).
      AMP_OPTION_ROW(at_min_scale, Kind::kPolicy, nullptr, false),
      // Its values are the counters, saved under their own keys (_amp_steps_taken, ...).
      AMP_OPTION_ROW(track_counters, Kind::kBool, nullptr, true),
  };
  return fields;
}

#undef AMP_OPTION_ROW

}  // namespace amp::detail
