// ZeroRedundancyOptimizer's checkpoints: the state consolidated on one rank in the inner
// optimizer's ordinary format, and sharded files (one per rank plus an index) that load at any
// world size, each rank reading only the shards that hold its parameters.
#include <amp/distributed/zero_redundancy_optimizer.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "distributed/collective.h"
#include "distributed/zero_parts.h"

namespace amp::distributed {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWho = "ZeroRedundancyOptimizer";
constexpr int64_t kIndexFormat = 1;

std::string shard_name(int64_t rank, int64_t world_size) {
  return "zero-shard-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".pt";
}

// Writes `archive` to `path` through a partial file renamed into place.
void write_atomically(torch::serialize::OutputArchive& archive, const fs::path& path) {
  const fs::path partial = path.string() + ".partial";
  archive.save_to(partial.string());
  fs::rename(partial, path);
}

at::Tensor int64_tensor(const std::vector<int64_t>& values) {
  return at::tensor(values, at::kLong);
}

std::vector<int64_t> int64_values(const at::Tensor& t, const std::string& what) {
  TORCH_CHECK(t.defined() && t.dim() == 1 && t.scalar_type() == at::kLong, what,
              " is not a 1-d int64 tensor");
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

at::Tensor read_tensor(torch::serialize::InputArchive& archive, const std::string& key,
                       const std::string& file) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value) && value.isTensor(), file, " has no tensor '", key, "'");
  return value.toTensor();
}

// Opens `path` as a LibTorch archive; a file that is not one is named.
void open_archive(torch::serialize::InputArchive& archive, const std::string& path) {
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, path, " is damaged or not a checkpoint file (", e.what_without_backtrace(),
                ")");
  }
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key,
                 const std::string& file) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value) && value.isInt(), file, " has no integer '", key, "'");
  return value.toInt();
}

// Runs `attempt` on this rank, then learns whether it succeeded on every rank (one all-reduce, MIN,
// on `device`); throws on every rank unless it did: `failed_here` and the error on a rank where it
// failed, `failed_elsewhere` on the others.
void all_or_none(c10d::ProcessGroup& group, const c10::Device& device, const std::string& what,
                 const std::function<void()>& attempt, const std::string& failed_here,
                 const std::string& failed_elsewhere) {
  std::string error;
  try {
    attempt();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<at::Tensor> flag{
      at::full({1}, error.empty() ? 1 : 0, at::TensorOptions(at::kInt).device(device))};
  detail::wait_for(detail::start_all_reduce(group, flag, c10d::ReduceOp::MIN, what), group, what);
  TORCH_CHECK(error.empty(), what, ": ", failed_here, ": ", error);
  TORCH_CHECK(flag[0].item<int>() == 1, what, ": ", failed_elsewhere);
}

}  // namespace

std::vector<at::Tensor> ZeroRedundancyOptimizer::params_where(
    const std::function<bool(size_t)>& selected) const {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (selected(i)) params.push_back(params_[i]);
  }
  return params;
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int64_t to) {
  TORCH_CHECK(to >= 0 && to < world_size(), kWho, "::consolidate_state_dict: to=", to,
              " is not a rank of this group of ", world_size(), "; pass a rank in [0, ",
              world_size() - 1, "].");
  const std::string what =
      std::string(kWho) +
      "::consolidate_state_dict (every rank must call it, with the same to=" + std::to_string(to) +
      ")";
  const c10::Device device = params_.front().device();
  const std::string mine = detail::to_bytes(*shard_);
  // The sizes first (every rank's), then the bytes, padded to the largest, gathered on `to`.
  std::vector<at::Tensor> size_in{at::full({1}, static_cast<int64_t>(mine.size()),
                                           at::TensorOptions(at::kLong).device(device))};
  std::vector<std::vector<at::Tensor>> size_out(1);
  for (int r = 0; r < world_size(); ++r) size_out[0].push_back(at::empty_like(size_in[0]));
  detail::wait_for(group_->allgather(size_out, size_in), *group_, what);
  std::vector<int64_t> sizes;
  for (const auto& t : size_out[0]) sizes.push_back(t.item<int64_t>());
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<uint8_t>());
  std::vector<at::Tensor> bytes_in{padded.to(device)};
  std::vector<std::vector<at::Tensor>> bytes_out;
  if (rank() == to) {
    bytes_out.emplace_back();
    for (int r = 0; r < world_size(); ++r) bytes_out[0].push_back(at::empty_like(bytes_in[0]));
  }
  c10d::GatherOptions gather;
  gather.rootRank = to;
  detail::wait_for(group_->gather(bytes_out, bytes_in, gather), *group_, what);
  consolidated_.reset();
  consolidated_to_ = to;
  if (rank() != to) return;
  // Each rank's shard is read into an optimizer over that rank's parameters (this rank holds
  // them all), then its entries move into one optimizer over every parameter.
  auto whole = make_optimizer_(detail::clone_groups(param_groups_));
  for (int r = 0; r < world_size(); ++r) {
    const at::Tensor received = bytes_out[0][r].cpu();
    const std::string shard_bytes(reinterpret_cast<const char*>(received.data_ptr<uint8_t>()),
                                  static_cast<size_t>(sizes[r]));
    auto theirs = make_shard(r, owner_, order_);
    detail::from_bytes(*theirs, shard_bytes);
    detail::move_states(*theirs, *whole, params_where([&](size_t i) { return owner_[i] == r; }));
  }
  consolidated_ = std::move(whole);
}

const torch::optim::Optimizer& ZeroRedundancyOptimizer::state_dict() const {
  TORCH_CHECK(consolidated_to_ >= 0, kWho,
              "::state_dict: no state was consolidated yet; call consolidate_state_dict(to) on "
              "every rank first, then state_dict() on rank to.");
  TORCH_CHECK(rank() == consolidated_to_ && consolidated_, kWho, "::state_dict: rank ", rank(),
              " holds no consolidated state; the last consolidate_state_dict gathered it on rank ",
              consolidated_to_, ". Call state_dict() there.");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  state_dict().save(archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  // Into an optimizer over every parameter first: a file that does not fit changes nothing.
  auto whole = make_optimizer_(detail::clone_groups(param_groups_));
  whole->load(archive);
  TORCH_CHECK(whole->param_groups().size() == param_groups_.size(), kWho, "::load: the file has ",
              whole->param_groups().size(),
              " param groups, this "
              "optimizer ",
              param_groups_.size(), "; load a file of this model's optimizer.");
  auto shard = make_shard(rank(), owner_, order_);
  detail::move_states(*whole, *shard, params_where([&](size_t i) { return owner_[i] == rank(); }));
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(whole->param_groups()[g].options().clone());
    shard->param_groups()[g].set_options(whole->param_groups()[g].options().clone());
  }
  shard_ = std::move(shard);
  probe_ = std::move(whole);  // its options are the loaded ones; its state is moved out
  probe_->state().clear();
}

void ZeroRedundancyOptimizer::write_sharded(const std::string& directory) const {
  fs::create_directories(directory);
  torch::serialize::OutputArchive optimizer;
  shard_->save(optimizer);
  torch::serialize::OutputArchive file;
  file.write("optimizer", optimizer);
  file.write("rank", c10::IValue(static_cast<int64_t>(rank())));
  file.write("world_size", c10::IValue(static_cast<int64_t>(world_size())));
  write_atomically(file, fs::path(directory) / shard_name(rank(), world_size()));
  if (rank() == 0) {
    std::vector<int64_t> group_sizes, dtypes, ndims, dims;
    for (const auto& g : param_groups_)
      group_sizes.push_back(static_cast<int64_t>(g.params().size()));
    for (const auto& p : params_) {
      dtypes.push_back(static_cast<int64_t>(p.scalar_type()));
      ndims.push_back(p.dim());
      for (const int64_t d : p.sizes()) dims.push_back(d);
    }
    torch::serialize::OutputArchive index;
    index.write("format", c10::IValue(kIndexFormat));
    index.write("world_size", c10::IValue(static_cast<int64_t>(world_size())));
    index.write("owner", int64_tensor(owner_));
    index.write("order", int64_tensor(order_));
    index.write("group_sizes", int64_tensor(group_sizes));
    index.write("dtypes", int64_tensor(dtypes));
    index.write("ndims", int64_tensor(ndims));
    index.write("dims", int64_tensor(dims));
    write_atomically(index, fs::path(directory) / "zero-index.pt");
  }
}

void ZeroRedundancyOptimizer::save_sharded(const std::string& directory) const {
  const std::string what = std::string(kWho) + "::save_sharded(" + directory + ")";
  // Returns once every rank has written its file, or throws on every rank.
  all_or_none(
      *group_, params_.front().device(), what, [&] { write_sharded(directory); },
      "rank " + std::to_string(rank()) + " could not write its shard",
      "another rank could not write its shard (its error says why); this checkpoint is "
      "incomplete.");
}

std::unique_ptr<torch::optim::Optimizer> ZeroRedundancyOptimizer::read_sharded(
    const std::string& directory,
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& loaded_options) const {
  const std::string index_path = (fs::path(directory) / "zero-index.pt").string();
  TORCH_CHECK(fs::exists(index_path), "there is no ", index_path,
              "; pass the directory save_sharded wrote");
  torch::serialize::InputArchive index;
  open_archive(index, index_path);
  const int64_t format = read_int(index, "format", index_path);
  TORCH_CHECK(format == kIndexFormat, index_path, " has format ", format,
              "; this amp reads format ", kIndexFormat);
  const int64_t old_world = read_int(index, "world_size", index_path);
  TORCH_CHECK(old_world >= 1, index_path, " says world_size ", old_world);
  const auto old_owner = int64_values(read_tensor(index, "owner", index_path), "owner");
  const auto old_order = int64_values(read_tensor(index, "order", index_path), "order");
  const auto group_sizes =
      int64_values(read_tensor(index, "group_sizes", index_path), "group_sizes");
  const auto dtypes = int64_values(read_tensor(index, "dtypes", index_path), "dtypes");
  const auto ndims = int64_values(read_tensor(index, "ndims", index_path), "ndims");
  const auto dims = int64_values(read_tensor(index, "dims", index_path), "dims");
  // Another model is named by its first differing parameter.
  TORCH_CHECK(group_sizes.size() == param_groups_.size(), "the checkpoint has ", group_sizes.size(),
              " param groups, this optimizer ", param_groups_.size());
  for (size_t g = 0; g < group_sizes.size(); ++g) {
    TORCH_CHECK(group_sizes[g] == static_cast<int64_t>(param_groups_[g].params().size()),
                "param group ", g, " has ", group_sizes[g], " parameters in the checkpoint, ",
                param_groups_[g].params().size(), " here");
  }
  const size_t count = params_.size();
  TORCH_CHECK(old_owner.size() == count && old_order.size() == count && dtypes.size() == count &&
                  ndims.size() == count,
              index_path, " is damaged: its lists do not have one entry per parameter");
  size_t next_dim = 0;
  for (size_t i = 0; i < count; ++i) {
    TORCH_CHECK(old_owner[i] >= 0 && old_owner[i] < old_world && old_order[i] >= 0 &&
                    old_order[i] < static_cast<int64_t>(count) && ndims[i] >= 0 &&
                    next_dim + static_cast<size_t>(ndims[i]) <= dims.size(),
                index_path, " is damaged (parameter ", i, ")");
    const std::vector<int64_t> shape(dims.begin() + next_dim, dims.begin() + next_dim + ndims[i]);
    next_dim += static_cast<size_t>(ndims[i]);
    const at::Tensor& p = params_[i];
    TORCH_CHECK(shape == p.sizes().vec(), "parameter ", i, " has shape ", at::IntArrayRef(shape),
                " in the checkpoint but ", p.sizes(), " here");
    TORCH_CHECK(dtypes[i] == static_cast<int64_t>(p.scalar_type()), "parameter ", i, " has dtype ",
                static_cast<c10::ScalarType>(dtypes[i]), " in the checkpoint but ", p.scalar_type(),
                " here");
  }
  TORCH_CHECK(std::set<int64_t>(old_order.begin(), old_order.end()).size() == count, index_path,
              " is damaged: its order does not list every parameter once");
  // The old ranks whose shards hold this rank's parameters (rank 0's, for the group options,
  // when this rank holds none).
  std::set<int64_t> needed;
  for (size_t i = 0; i < count; ++i) {
    if (owner_[i] == rank()) needed.insert(old_owner[i]);
  }
  if (needed.empty()) needed.insert(0);
  auto shard = make_shard(rank(), owner_, order_);
  for (const int64_t r : needed) {
    const std::string path = (fs::path(directory) / shard_name(r, old_world)).string();
    TORCH_CHECK(fs::exists(path), "the shard ", path, " is missing");
    torch::serialize::InputArchive file;
    open_archive(file, path);
    TORCH_CHECK(
        read_int(file, "rank", path) == r && read_int(file, "world_size", path) == old_world, path,
        " is not rank ", r, "'s shard of ", old_world);
    torch::serialize::InputArchive optimizer;
    TORCH_CHECK(file.try_read("optimizer", optimizer), path, " holds no optimizer");
    auto theirs = make_shard(r, old_owner, old_order);
    theirs->load(optimizer);
    TORCH_CHECK(theirs->param_groups().size() == param_groups_.size(), path, " has ",
                theirs->param_groups().size(), " param groups");
    if (loaded_options.empty()) {
      for (const auto& g : theirs->param_groups()) loaded_options.push_back(g.options().clone());
    }
    detail::move_states(*theirs, *shard, params_where([&](size_t i) {
      return owner_[i] == rank() && old_owner[i] == r;
    }));
  }
  return shard;
}

void ZeroRedundancyOptimizer::load_sharded(const std::string& directory) {
  const std::string what = std::string(kWho) + "::load_sharded(" + directory + ")";
  std::unique_ptr<torch::optim::Optimizer> shard;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> loaded_options;
  // All or nothing on every rank: nothing changes until every rank has read its part.
  all_or_none(
      *group_, params_.front().device(), what,
      [&] { shard = read_sharded(directory, loaded_options); },
      "refused on rank " + std::to_string(rank()) + " (nothing was loaded)",
      "another rank refused the checkpoint (its error says why); nothing was loaded on any rank.");
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(loaded_options[g]->clone());
    shard->param_groups()[g].set_options(loaded_options[g]->clone());
    probe_->param_groups()[g].set_options(loaded_options[g]->clone());
  }
  shard_ = std::move(shard);
}

}  // namespace amp::distributed
