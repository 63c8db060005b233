// amp::distributed::found_inf_sync: GradScaler's inf/NaN flag combined by MAX over a process
// group, and the set-up check that every rank's scaler is configured alike.
#include <amp/distributed.h>

#include <cmath>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "distributed/collective.h"

namespace amp::distributed {

namespace {

constexpr const char* kWho = "amp::distributed::found_inf_sync";

// The options compared across ranks, as numbers (the names are GradScalerOptions' setters).
const std::vector<std::string>& compared_names() {
  static const std::vector<std::string> names{
      "the device type", "enabled",         "init_scale",   "growth_factor",
      "backoff_factor",  "growth_interval", "hysteresis",   "consecutive_hysteresis",
      "min_scale",       "max_scale",       "at_min_scale", "track_counters"};
  return names;
}

std::vector<double> compared_values(c10::DeviceType device, const GradScalerOptions& options) {
  return {static_cast<double>(static_cast<int>(device)),
          options.enabled() ? 1.0 : 0.0,
          options.init_scale(),
          options.growth_factor(),
          options.backoff_factor(),
          static_cast<double>(options.growth_interval()),
          static_cast<double>(options.hysteresis()),
          options.consecutive_hysteresis() ? 1.0 : 0.0,
          options.min_scale(),
          options.max_scale(),
          options.at_min_scale() == MinScalePolicy::kThrow ? 1.0 : 0.0,
          options.track_counters() ? 1.0 : 0.0};
}

std::string format_compared(size_t index, double value) {
  std::ostringstream out;
  switch (index) {
    case 0:
      out << c10::DeviceTypeName(static_cast<c10::DeviceType>(static_cast<int>(value)),
                                 /*lower_case=*/true);
      break;
    case 1:
    case 7:
    case 11:
      out << (value != 0.0 ? "true" : "false");
      break;
    case 10:
      out << (value != 0.0 ? "kThrow" : "kSkip");
      break;
    default:
      out.precision(17);
      out << value;
  }
  return out.str();
}

class ProcessGroupFoundInfSync final : public FoundInfSync {
 public:
  explicit ProcessGroupFoundInfSync(c10::intrusive_ptr<c10d::ProcessGroup> group)
      : group_(std::move(group)) {
    detail::check_group(group_, kWho);
  }

  void all_reduce_max_(at::Tensor& flag) override {
    TORCH_CHECK(flag.defined() && flag.numel() == 1, kWho,
                ": the flag must be a defined one-element tensor; got ",
                flag.defined() ? std::to_string(flag.numel()) + " elements" : "an undefined one",
                ".");
    detail::check_group_serves(group_, flag.device().type(), kWho, "the scaler's inf/NaN flags");
    std::vector<at::Tensor> tensors{flag};
    // No host read: with NCCL, wait() only orders the current stream after the collective.
    detail::wait_for(detail::start_all_reduce(*group_, tensors, c10d::ReduceOp::MAX,
                                              "the GradScaler's inf/NaN flag all-reduce"),
                     *group_, "the GradScaler's inf/NaN flag all-reduce");
  }

  void check_same_configuration(c10::DeviceType device, const GradScalerOptions& options) override {
    if (options.enabled()) {
      detail::check_group_serves(group_, device, kWho, "the scaler's inf/NaN flags");
    }
    const c10::Device on = detail::check_device(group_, device, kWho);
    const auto rows = detail::exchange_values(*group_, on, compared_values(device, options),
                                              "the GradScaler options check");
    const auto differences = detail::describe_differences(rows, compared_names(), &format_compared);
    if (differences.empty()) return;
    std::ostringstream message;
    message << "GradScaler: the scalers of the " << group_->getSize()
            << " ranks are configured differently: ";
    for (size_t i = 0; i < differences.size(); ++i)
      message << (i > 0 ? "; " : "") << differences[i];
    message << ". Every rank must construct its GradScaler with the same device type and the "
               "same GradScalerOptions, or the ranks would take different skip decisions.";
    TORCH_CHECK(false, message.str());
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

}  // namespace

std::shared_ptr<FoundInfSync> found_inf_sync(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  return std::make_shared<ProcessGroupFoundInfSync>(std::move(group));
}

}  // namespace amp::distributed
