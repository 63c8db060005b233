// amp::distributed's shared helpers: argument checks of groups, error sentences around c10d, and
// the value exchange behind the cross-rank consistency checks.
#include "distributed/collective.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace amp::distributed::detail {

namespace {

// Whether `group` has a backend for tensors of `type`. Through getDeviceTypes(), which LibTorch
// 2.11 has too (hasBackendForDeviceType came later); both read the map setBackend fills.
bool serves(const c10d::ProcessGroup& group, c10::DeviceType type) {
  const std::vector<c10::Device> devices = group.getDeviceTypes();
  return std::any_of(devices.begin(), devices.end(),
                     [type](const c10::Device& device) { return device.type() == type; });
}

std::string device_types_served(c10d::ProcessGroup& group) {
  std::string served;
  for (const auto type : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (!serves(group, type)) continue;
    if (!served.empty()) served += ", ";
    served += c10::DeviceTypeName(type, /*lower_case=*/true);
  }
  return served.empty() ? "no CPU or CUDA tensors" : served;
}

}  // namespace

void check_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& who) {
  TORCH_CHECK(group, who,
              ": the process group is null; pass the group returned by new_gloo_group, "
              "init_gloo_from_torchrun or new_nccl_group.");
}

void check_group_arguments(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                           const GroupOptions& options, const std::string& who) {
  TORCH_CHECK(store, who,
              ": the store is null; pass a c10d store (torchrun_store(...), a c10d::TCPStore or a "
              "c10d::FileStore).");
  TORCH_CHECK(world_size >= 1, who, ": world_size must be >= 1; got ", world_size, ".");
  TORCH_CHECK(rank >= 0 && rank < world_size, who, ": rank must be in [0, world_size=", world_size,
              "); got ", rank, ".");
  TORCH_CHECK(options.timeout().count() > 0, who, ": GroupOptions::timeout must be > 0 ms; got ",
              options.timeout().count(), " ms.");
}

std::string next_group_prefix(const char* backend) {
  static std::atomic<int> groups{0};
  return std::string("amp/") + backend + "/" + std::to_string(groups.fetch_add(1));
}

void check_group_serves(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                        c10::DeviceType device_type, const std::string& who,
                        const std::string& what) {
  check_group(group, who);
  TORCH_CHECK(serves(*group, device_type), who, ": ", what, " are ",
              c10::DeviceTypeName(device_type, /*lower_case=*/true),
              " tensors, but the process group (backend ", group->getBackendName(), ") serves ",
              device_types_served(*group),
              ". Use a Gloo group (new_gloo_group) for CPU tensors and an NCCL group "
              "(new_nccl_group) for CUDA tensors.");
}

namespace {

[[noreturn]] void rethrow_failure(c10d::ProcessGroup& group, const std::string& what,
                                  const std::string& cause) {
  TORCH_CHECK(false, "amp::distributed: ", what, " failed on rank ", group.getRank(), " of ",
              group.getSize(),
              ". Every rank must reach this call: a rank that stopped, crashed or never started "
              "makes the others fail here once the group's timeout (GroupOptions::timeout) "
              "passes. c10d said: ",
              cause);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> start_all_reduce(c10d::ProcessGroup& group,
                                                std::vector<at::Tensor>& tensors,
                                                c10d::ReduceOp::RedOpType op,
                                                const std::string& what) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  try {
    return group.allreduce(tensors, options);
  } catch (const c10::Error& error) {
    rethrow_failure(group, what, error.what_without_backtrace());
  }
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work, c10d::ProcessGroup& group,
              const std::string& what) {
  try {
    work->wait();
  } catch (const c10::Error& error) {
    rethrow_failure(group, what, error.what_without_backtrace());
  } catch (const std::exception& error) {
    rethrow_failure(group, what, error.what());
  }
}

std::vector<std::vector<double>> exchange_values(c10d::ProcessGroup& group,
                                                 const c10::Device& device,
                                                 const std::vector<double>& values,
                                                 const std::string& what) {
  const int world = group.getSize();
  const auto count = static_cast<int64_t>(values.size());
  // A table with this rank's row filled and zeros elsewhere, summed over the ranks: an
  // all-gather that every backend supports for every dtype.
  at::Tensor table = at::zeros({world, count}, at::TensorOptions().dtype(at::kDouble));
  table[group.getRank()].copy_(at::tensor(values, at::TensorOptions().dtype(at::kDouble)));
  std::vector<at::Tensor> tensors{table.to(device)};
  wait_for(start_all_reduce(group, tensors, c10d::ReduceOp::SUM, what), group, what);
  const at::Tensor host = tensors.front().to(at::kCPU).contiguous();
  const double* data = host.data_ptr<double>();
  std::vector<std::vector<double>> rows(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    rows[static_cast<size_t>(r)].assign(data + r * count, data + (r + 1) * count);
  return rows;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out << (i + 1 == ranks.size() ? " and " : ", ");
    out << ranks[i];
  }
  return out.str();
}

std::vector<std::string> describe_differences(const std::vector<std::vector<double>>& rows,
                                              const std::vector<std::string>& names,
                                              std::string (*format)(size_t index, double value)) {
  std::vector<std::string> differences;
  for (size_t i = 0; i < names.size(); ++i) {
    // Ranks grouped by value, in order of the first rank holding each value.
    std::vector<std::pair<double, std::vector<int>>> groups;
    for (size_t r = 0; r < rows.size(); ++r) {
      const double value = rows[r][i];
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
        return g.first == value || (value != value && g.first != g.first);
      });
      if (it == groups.end()) it = groups.insert(groups.end(), {value, {}});
      it->second.push_back(static_cast<int>(r));
    }
    if (groups.size() < 2) continue;
    std::ostringstream phrase;
    phrase << names[i] << " is ";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) phrase << (g + 1 == groups.size() ? " and " : ", ");
      phrase << format(i, groups[g].first) << " on rank"
             << (groups[g].second.size() > 1 ? "s " : " ") << rank_list(groups[g].second);
    }
    differences.push_back(phrase.str());
  }
  return differences;
}

c10::Device check_device(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                         c10::DeviceType preferred, const std::string& who) {
  // No index: tensors made for it go to the current device of that type.
  if (serves(*group, preferred)) return c10::Device(preferred);
  check_group_serves(group, c10::DeviceType::CPU, who, "its consistency checks' values");
  return c10::Device(c10::DeviceType::CPU);
}

}  // namespace amp::distributed::detail
