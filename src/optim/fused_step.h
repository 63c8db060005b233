// What FusedAdam/FusedAdamW/FusedSGD share around ATen's fused kernels: the checks on a group's
// parameters, buckets by dtype, the scale and flag per device, capturable learning rates, and
// the all-or-nothing reading of a checkpoint archive in LibTorch's optimizer layout.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include <amp/optim.h>

namespace amp::optim::detail {

/// The parameters of one group that have a gradient, all on `device`, split by dtype (ATen's
/// CUDA kernels take one dtype per call; the order within a bucket follows the group).
struct GroupWork {
  c10::Device device{c10::kCPU};
  std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> params_by_dtype;
  bool empty() const { return params_by_dtype.empty(); }
};

/// Collects and checks group `group_index`'s parameters with gradients: floating dtype, CPU or
/// CUDA (CUDA only when capturable), one device for the whole group, dense gradients of the
/// parameter's dtype, shape and device. Throws c10::Error naming `optimizer`, the group, the
/// parameter index and the fix.
GroupWork collect_group(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                        const char* optimizer, bool capturable);

/// Checks at construction what can be checked before gradients exist (dtype, device type).
void check_params(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                  const char* optimizer, bool capturable);

/// The scale and flag handed over by GradScaler for this step, moved to each device at most once
/// (no copy when already there). Both empty when no scaler is involved.
class StepScaling {
 public:
  explicit StepScaling(const SupportsAmpScaling& optimizer);
  std::optional<at::Tensor> grad_scale(const c10::Device& device);
  std::optional<at::Tensor> found_inf(const c10::Device& device);

 private:
  static std::optional<at::Tensor> on(const at::Tensor& source,
                                      std::vector<std::pair<c10::Device, at::Tensor>>& copies,
                                      const c10::Device& device);
  at::Tensor grad_scale_;
  at::Tensor found_inf_;
  std::vector<std::pair<c10::Device, at::Tensor>> grad_scale_copies_;
  std::vector<std::pair<c10::Device, at::Tensor>> found_inf_copies_;
};

/// Capturable mode: group `group_index`'s learning rate as a 0-dim float32 tensor on `device`.
/// Created once and then updated in place (a CUDA graph keeps its address) when `lr` changes.
const at::Tensor& capturable_lr(std::vector<std::pair<double, at::Tensor>>& cache,
                                size_t group_index, double lr, const c10::Device& device);

/// Writes each group's current lr into its capturable lr tensor (those that exist), in place.
void sync_capturable_lrs(std::vector<std::pair<double, at::Tensor>>& cache,
                         const std::vector<torch::optim::OptimizerParamGroup>& groups);

/// Range checks, one wording for construction, step and load (`where` names the caller).
void check_adam_options(const FusedAdamOptions& options, const std::string& where);
void check_adam_options(const FusedAdamWOptions& options, const std::string& where);
void check_sgd_options(const FusedSGDOptions& options, const std::string& where);

/// A group's options as given, with every field left at its constructor default taken from the
/// optimizer's defaults (LibTorch's rule for param groups).
std::unique_ptr<torch::optim::OptimizerOptions> merge_group_options(
    const torch::optim::OptimizerOptions& group, const torch::optim::OptimizerOptions& defaults);

/// Adds `groups` (options already merged and checked) to `optimizer` with exactly those options:
/// Optimizer::add_param_group merges only LibTorch's own option types.
void adopt_groups(torch::optim::Optimizer& optimizer,
                  std::vector<torch::optim::OptimizerParamGroup> groups);

/// An optimizer archive in LibTorch's layout, read completely before anything is applied.
template <typename Options, typename ParamState>
struct ArchiveContents {
  struct Group {
    std::vector<std::string> param_keys;
    Options options{0.0};
  };
  std::vector<Group> groups;
  std::unordered_map<std::string, ParamState> state;
};

/// Reads the whole archive (`optimizer` names the reader in errors); throws c10::Error naming
/// what is missing or malformed. Nothing is validated against the optimizer here.
template <typename Options, typename ParamState>
ArchiveContents<Options, ParamState> read_archive(torch::serialize::InputArchive& archive,
                                                  const std::string& optimizer);

/// Maps each current parameter to its saved state (by position in its group, as LibTorch does)
/// after checking group count and sizes; `check_state(param, state, where)` validates and moves
/// one entry to the parameter's device. Returns the new state map; the optimizer is untouched.
template <typename Options, typename ParamState, typename CheckState>
ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> match_state(
    const ArchiveContents<Options, ParamState>& contents, const torch::optim::Optimizer& optimizer,
    const std::string& name, CheckState check_state);

/// Reads a double from an archive key written by LibTorch (a double, or an int).
double read_double(torch::serialize::InputArchive& archive, const char* key, bool required,
                   double fallback);
bool read_bool(torch::serialize::InputArchive& archive, const char* key, bool required,
               bool fallback);
/// Reads a tensor-valued key, undefined when absent.
at::Tensor read_tensor(torch::serialize::InputArchive& archive, const char* key);

// ---- template definitions ----

template <typename Options, typename ParamState>
ArchiveContents<Options, ParamState> read_archive(torch::serialize::InputArchive& archive,
                                                  const std::string& optimizer) {
  ArchiveContents<Options, ParamState> contents;
  try {
    c10::IValue version;
    TORCH_CHECK(archive.try_read("pytorch_version", version) && version.isString() &&
                    version.toStringRef() == "1.5.0",
                "it has no pytorch_version \"1.5.0\" entry");
    torch::serialize::InputArchive state_archive;
    archive.read("state", state_archive);
    for (const std::string& key : state_archive.keys()) {
      torch::serialize::InputArchive entry;
      state_archive.read(key, entry);
      ParamState state;
      state.serialize(entry);
      contents.state.emplace(key, std::move(state));
    }
    torch::serialize::InputArchive groups_archive;
    archive.read("param_groups", groups_archive);
    at::Tensor group_count;
    groups_archive.read("param_groups/size", group_count);
    TORCH_CHECK(group_count.numel() == 1 && !group_count.is_floating_point() &&
                    group_count.item<int64_t>() >= 0,
                "param_groups/size is not a non-negative integer");
    for (int64_t i = 0; i < group_count.item<int64_t>(); ++i) {
      torch::serialize::InputArchive group_archive;
      groups_archive.read("param_groups/" + std::to_string(i), group_archive);
      at::Tensor param_count;
      group_archive.read("params/size", param_count);
      TORCH_CHECK(param_count.numel() == 1 && !param_count.is_floating_point() &&
                      param_count.item<int64_t>() >= 0,
                  "params/size of group ", i, " is not a non-negative integer");
      typename ArchiveContents<Options, ParamState>::Group group;
      for (int64_t j = 0; j < param_count.item<int64_t>(); ++j) {
        c10::IValue key;
        group_archive.read("params/" + std::to_string(j), key);
        TORCH_CHECK(key.isString(), "params/", j, " of group ", i, " is not a string");
        group.param_keys.push_back(key.toStringRef());
      }
      torch::serialize::InputArchive options_archive;
      group_archive.read("options", options_archive);
      group.options.serialize(options_archive);
      contents.groups.push_back(std::move(group));
    }
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, optimizer, "::load: the archive is not a readable ", optimizer,
                " checkpoint in LibTorch's optimizer layout (", e.what_without_backtrace(),
                "); the optimizer is unchanged. Save it with torch::save(optimizer, path) from ",
                "this optimizer or from LibTorch's counterpart.");
  }
  return contents;
}

template <typename Options, typename ParamState, typename CheckState>
ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> match_state(
    const ArchiveContents<Options, ParamState>& contents, const torch::optim::Optimizer& optimizer,
    const std::string& name, CheckState check_state) {
  const auto& groups = optimizer.param_groups();
  TORCH_CHECK(contents.groups.size() == groups.size(), name, "::load: the checkpoint has ",
              contents.groups.size(), " parameter groups but this optimizer has ", groups.size(),
              "; load it into an optimizer built with the same groups. The optimizer is "
              "unchanged.");
  ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> state;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    const auto& keys = contents.groups[g].param_keys;
    TORCH_CHECK(keys.size() == params.size(), name, "::load: group ", g, " of the checkpoint has ",
                keys.size(), " parameters but this optimizer's group ", g, " has ", params.size(),
                "; load it into an optimizer built with the same groups. The "
                "optimizer is unchanged.");
    for (size_t i = 0; i < params.size(); ++i) {
      const auto saved = contents.state.find(keys[i]);
      if (saved == contents.state.end()) continue;
      const std::string where = name + "::load: the state of parameter " + std::to_string(i) +
                                " of group " + std::to_string(g);
      state[params[i].unsafeGetTensorImpl()] = check_state(params[i], saved->second, where);
    }
  }
  return state;
}

}  // namespace amp::optim::detail
