// amp::distributed::found_inf_sync: GradScaler's inf/NaN flag combined by MAX over a process
// group, and the set-up check that every rank's scaler is configured alike.
#include <amp/detail/option_fields.h>
#include <amp/distributed.h>

#include <cmath>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "distributed/collective.h"

namespace amp::distributed {

namespace {

constexpr const char* kWho = "amp::distributed::found_inf_sync";

// The values compared across ranks: the device type, then every option (detail::option_fields).
std::vector<std::string> compared_names() {
  std::vector<std::string> names{"the device type"};
  for (const auto& field : amp::detail::option_fields()) names.emplace_back(field.name);
  return names;
}

std::vector<double> compared_values(c10::DeviceType device, const GradScalerOptions& options) {
  std::vector<double> values{static_cast<double>(static_cast<int>(device))};
  for (const auto& field : amp::detail::option_fields()) values.push_back(field.get(options));
  return values;
}

std::string format_compared(size_t index, double value) {
  std::ostringstream out;
  if (index == 0) {
    out << c10::DeviceTypeName(static_cast<c10::DeviceType>(static_cast<int>(value)),
                               /*lower_case=*/true);
    return out.str();
  }
  switch (amp::detail::option_fields().at(index - 1).kind) {
    case amp::detail::OptionField::Kind::kBool:
      out << (value != 0.0 ? "true" : "false");
      break;
    case amp::detail::OptionField::Kind::kPolicy:
      out << (static_cast<MinScalePolicy>(value) == MinScalePolicy::kThrow ? "kThrow" : "kSkip");
      break;
    case amp::detail::OptionField::Kind::kInt:
    case amp::detail::OptionField::Kind::kFloat:
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
