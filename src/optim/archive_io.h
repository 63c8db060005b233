// The fused optimizers' save/load archives in LibTorch's optimizer layout: an archive read
// completely and matched to the optimizer's parameters before anything is applied, and the entry
// readers and writers the options and states use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace amp::optim::detail {

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
/// after checking group count and sizes; `check_state(param, state, group_index, where)`
/// validates and moves one entry to the parameter's device. Returns the new state map; the
/// optimizer is untouched.
template <typename Options, typename ParamState, typename CheckState>
ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> match_state(
    const ArchiveContents<Options, ParamState>& contents, const torch::optim::Optimizer& optimizer,
    const std::string& name, CheckState check_state);

/// Reads a double from an archive key written by LibTorch (a double, or an int).
double read_double(torch::serialize::InputArchive& archive, const char* key, bool required,
                   double fallback);
bool read_bool(torch::serialize::InputArchive& archive, const char* key, bool required,
               bool fallback);
/// Reads an integer key.
int64_t read_int(torch::serialize::InputArchive& archive, const char* key, bool required,
                 int64_t fallback);
/// Reads "betas", a pair of floats (a tuple, or a list as Python's optimizers save it).
std::tuple<double, double> read_betas(torch::serialize::InputArchive& archive);
/// A state entry's step count as LibTorch's Adam keeps it, an int64 (each library then reads the
/// other's archives; a float32 count is exact up to 2^24 steps); 0 when undefined.
void write_step_count(torch::serialize::OutputArchive& archive, const at::Tensor& step);

/// Reads write_step_count's entry, or a 1-element tensor (as Python keeps it), as a 0-dim
/// float32 tensor; throws a sentence when it is missing, negative or above 2^24.
at::Tensor read_step_count(torch::serialize::InputArchive& archive);
/// Reads a tensor-valued key, undefined when absent.
at::Tensor read_tensor(torch::serialize::InputArchive& archive, const char* key);

/// Writes a tensor-valued key; as LibTorch, an undefined tensor is not written (Python omits it).
void write_tensor(torch::serialize::OutputArchive& archive, const char* key,
                  const at::Tensor& tensor);
/// Both undefined, or equal dtype, device, shape and values (operator== of the param states).
bool same_tensor(const at::Tensor& lhs, const at::Tensor& rhs);

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
      state[params[i].unsafeGetTensorImpl()] = check_state(params[i], saved->second, g, where);
    }
  }
  return state;
}

}  // namespace amp::optim::detail
