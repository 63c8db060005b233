// ZeroRedundancyOptimizer: the partition, the shard's optimizer, and the step with its parameter
// broadcast (the checkpoints are in zero_checkpoint.cpp).
#include <amp/distributed/zero_redundancy_optimizer.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <amp/detail/fused_optimizer.h>
#include <amp/ops.h>

#include "distributed/collective.h"
#include "distributed/zero_parts.h"

namespace amp::distributed {

using torch::optim::OptimizerParamGroup;

void partition_parameters(const std::vector<std::vector<int64_t>>& sizes, int64_t world_size,
                          std::vector<int64_t>& totals, std::vector<int64_t>& owner,
                          std::vector<int64_t>& order) {
  TORCH_CHECK(world_size >= 1, "partition_parameters: world_size must be >= 1, got ", world_size);
  if (totals.empty()) totals.assign(static_cast<size_t>(world_size), 0);
  TORCH_CHECK(static_cast<int64_t>(totals.size()) == world_size,
              "partition_parameters: totals has ", totals.size(), " entries for ", world_size,
              " ranks");
  int64_t base = static_cast<int64_t>(owner.size());
  for (const auto& group : sizes) {
    const int64_t count = static_cast<int64_t>(group.size());
    std::vector<int64_t> by_size(static_cast<size_t>(count));
    std::iota(by_size.begin(), by_size.end(), 0);
    // Python sorts by size with reverse=True, which keeps equal sizes in their order.
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](int64_t a, int64_t b) { return group[a] > group[b]; });
    owner.resize(static_cast<size_t>(base + count), 0);
    for (const int64_t local : by_size) {
      // The smallest running total; min_element returns the first, the lowest rank, on ties.
      const auto rank = std::min_element(totals.begin(), totals.end()) - totals.begin();
      owner[base + local] = rank;
      totals[rank] += group[local];
      order.push_back(base + local);
    }
    base += count;
  }
}

namespace detail {

int64_t param_bytes(const at::Tensor& param) {
  return param.numel() * static_cast<int64_t>(param.element_size());
}

std::vector<OptimizerParamGroup> clone_groups(const std::vector<OptimizerParamGroup>& groups) {
  std::vector<OptimizerParamGroup> copies;
  copies.reserve(groups.size());
  for (const auto& group : groups) copies.emplace_back(group.params(), group.options().clone());
  return copies;
}

std::string to_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void from_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

void move_states(torch::optim::Optimizer& from, torch::optim::Optimizer& to,
                 const std::vector<at::Tensor>& params) {
  auto& source = from.state();
  auto& target = to.state();
  for (const auto& param : params) {
    auto* key = param.unsafeGetTensorImpl();
    const auto found = source.find(key);
    if (found == source.end()) {
      target.erase(key);
    } else {
      target[key] = std::move(found->second);
      source.erase(found);
    }
  }
}

}  // namespace detail

namespace {

constexpr const char* kWho = "ZeroRedundancyOptimizer";

std::vector<OptimizerParamGroup> one_group(std::vector<at::Tensor> params) {
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::move(params));
  return groups;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params,
                                                 ShardOptimizerFactory make_optimizer,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 ZeroRedundancyOptimizerOptions options)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(make_optimizer),
                              std::move(group), options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> param_groups,
                                                 ShardOptimizerFactory make_optimizer,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 ZeroRedundancyOptimizerOptions options)
    : Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                std::make_unique<torch::optim::OptimizerOptions>()),
      make_optimizer_(std::move(make_optimizer)),
      group_(std::move(group)),
      options_(options) {
  detail::check_group(group_, kWho);
  TORCH_CHECK(make_optimizer_, kWho,
              ": make_optimizer is empty; pass shard_optimizer<T>(options), e.g. "
              "shard_optimizer<amp::optim::FusedAdamW>(amp::optim::FusedAdamWOptions(1e-3)).");
  size_t count = 0;
  for (const auto& g : param_groups) count += g.params().size();
  TORCH_CHECK(count > 0, kWho, ": got no parameters; pass the model's parameters().");
  // The inner optimizer type's own rule merges each group's options with its defaults: an
  // optimizer over all parameters, which allocates no state before its first step, resolves them.
  probe_ = make_optimizer_(std::move(param_groups));
  defaults_ = probe_->defaults().clone();
  param_groups_ = detail::clone_groups(probe_->param_groups());
  std::vector<std::vector<int64_t>> sizes;
  for (const auto& g : param_groups_) {
    sizes.emplace_back();
    for (const auto& p : g.params()) {
      TORCH_CHECK(p.defined() && !p.is_sparse(), kWho, ": parameter ", params_.size(),
                  " is undefined or sparse; pass dense parameters.");
      sizes.back().push_back(detail::param_bytes(p));
      index_of_.emplace(p.unsafeGetTensorImpl(), params_.size());
      params_.push_back(p);
    }
  }
  // Every rank must hold the same parameters: the partition is computed on each rank.
  int64_t total_bytes = 0;
  for (const auto& p : params_) total_bytes += detail::param_bytes(p);
  const c10::Device device = params_.front().device();
  const auto rows = detail::exchange_values(
      *group_, device, {static_cast<double>(params_.size()), static_cast<double>(total_bytes)},
      std::string(kWho) + ": the check that every rank has the same parameters");
  const auto differences = detail::describe_differences(
      rows, {"the parameter count", "the parameters' total bytes"},
      [](size_t, double v) { return std::to_string(static_cast<int64_t>(v)); });
  TORCH_CHECK(differences.empty(), kWho, ": the ranks hold different parameters (",
              differences.front(), "); construct it on every rank with the same model.");
  partition_parameters(sizes, world_size(), rank_totals_, owner_, order_);
  shard_ = make_shard(rank(), owner_, order_);
  if (options_.parameters_as_bucket_view()) build_buckets();
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

int ZeroRedundancyOptimizer::rank() const { return group_->getRank(); }
int ZeroRedundancyOptimizer::world_size() const { return group_->getSize(); }

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::groups_of_rank(
    int64_t rank, const std::vector<int64_t>& owner, const std::vector<int64_t>& order) const {
  std::vector<OptimizerParamGroup> groups;
  size_t next = 0;
  for (const auto& g : param_groups_) {
    std::vector<at::Tensor> mine;
    // `order` lists each group's global indices, group after group.
    for (size_t k = 0; k < g.params().size(); ++k, ++next) {
      const int64_t index = order.at(next);
      if (owner.at(static_cast<size_t>(index)) == rank) mine.push_back(params_.at(index));
    }
    groups.emplace_back(std::move(mine), g.options().clone());
  }
  return groups;
}

std::unique_ptr<torch::optim::Optimizer> ZeroRedundancyOptimizer::make_shard(
    int64_t rank, const std::vector<int64_t>& owner, const std::vector<int64_t>& order) const {
  auto shard = make_optimizer_(groups_of_rank(rank, owner, order));
  if (auto* positioned = dynamic_cast<amp::optim::PositionedParams*>(shard.get())) {
    // Stochastic rounding's streams follow the position in the whole model's optimizer.
    positioned->set_param_positions(index_of_);
  }
  return shard;
}

void ZeroRedundancyOptimizer::build_buckets() {
  // One flat buffer per (device, owner, dtype), the owner's parameters in its groups' order; each
  // parameter then lives in its buffer (set_data keeps the TensorImpl, so the optimizers' state
  // and DDP's references stay valid).
  std::map<std::tuple<std::string, int64_t, int>, std::vector<int64_t>> members;
  for (const int64_t index : order_) {
    const auto& p = params_[index];
    members[{p.device().str(), owner_[index], static_cast<int>(p.scalar_type())}].push_back(index);
  }
  buckets_.clear();
  bucket_owner_.clear();
  at::NoGradGuard no_grad;
  for (const auto& [key, indices] : members) {
    int64_t numel = 0;
    for (const int64_t index : indices) numel += params_[index].numel();
    const auto& first = params_[indices.front()];
    at::Tensor bucket = at::empty({numel}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (const int64_t index : indices) {
      at::Tensor& p = params_[index];
      at::Tensor view = bucket.narrow(0, offset, p.numel()).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);
      offset += p.numel();
    }
    buckets_.push_back(bucket);
    bucket_owner_.push_back(std::get<1>(key));
  }
}

void ZeroRedundancyOptimizer::sync_group_options() {
  // Options changed on the whole model's groups (an lr schedule) reach the shard, as Python's
  // _sync_param_groups does before every step.
  auto& shard_groups = shard_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    shard_groups.at(g).set_options(param_groups_[g].options().clone());
  }
}

void ZeroRedundancyOptimizer::broadcast_parameters() {
  at::NoGradGuard no_grad;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  const auto send = [&](at::Tensor tensor, int64_t root) {
    std::vector<at::Tensor> tensors{std::move(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    works.push_back(group_->broadcast(tensors, options));
  };
  if (!buckets_.empty()) {
    for (size_t b = 0; b < buckets_.size(); ++b) send(buckets_[b], bucket_owner_[b]);
  } else {
    for (size_t i = 0; i < params_.size(); ++i) send(params_[i].detach(), owner_[i]);
  }
  for (const auto& work : works) {
    detail::wait_for(work, *group_,
                     std::string(kWho) + "::step: the broadcast of the updated parameters");
  }
}

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_mode(true);
    loss = closure();
  }
  sync_group_options();
  at::Tensor flag = found_inf();
  if (flag.defined()) {
    // Every rank steps or skips together: the flag is combined over the ranks, in place so that
    // the GradScaler that handed it over updates its scale from the combined one too.
    std::vector<at::Tensor> tensors{flag};
    detail::wait_for(detail::start_all_reduce(*group_, tensors, c10d::ReduceOp::MAX,
                                              std::string(kWho) + "::step: the inf/NaN flag"),
                     *group_, std::string(kWho) + "::step: the inf/NaN flag");
  }
  if (auto* scaling = dynamic_cast<amp::optim::SupportsAmpScaling*>(shard_.get())) {
    // A fused optimizer unscales and skips on the device.
    scaling->set_grad_scaling(grad_scale(), flag);
    try {
      shard_->step();
    } catch (...) {
      scaling->clear_grad_scaling();
      throw;
    }
    scaling->clear_grad_scaling();
  } else {
    if (grad_scale().defined()) {
      // Unscaled as GradScaler::unscale_ does (times the float32 reciprocal), every gradient, as
      // Python's scaler leaves them all unscaled.
      std::map<std::string, std::vector<at::Tensor>> grads_by_device;
      for (const auto& p : params_) {
        if (p.grad().defined()) grads_by_device[p.grad().device().str()].push_back(p.grad());
      }
      const at::Tensor inv_scale = grad_scale().to(at::kDouble).reciprocal().to(at::kFloat);
      for (auto& [device, grads] : grads_by_device) {
        const at::Tensor local_inv = inv_scale.to(grads.front().device());
        at::Tensor seen = at::zeros({}, local_inv.options());
        amp::non_finite_check_and_unscale_(grads, seen, local_inv);
      }
    }
    // HOST SYNC: a LibTorch optimizer steps on the host, so the skip is decided here (the one
    // read GradScaler makes for such an optimizer without ZeRO).
    const bool skip = flag.defined() && flag.item<float>() != 0.0f;
    if (!skip) shard_->step();
  }
  broadcast_parameters();
  return loss;
}

void ZeroRedundancyOptimizer::add_param_group(const OptimizerParamGroup& param_group) {
  // The new group's options by the inner type's rule, resolved beside the existing groups.
  auto all = detail::clone_groups(param_groups_);
  if (param_group.has_options()) {
    all.emplace_back(param_group.params(), param_group.options().clone());
  } else {
    all.emplace_back(param_group.params());
  }
  auto whole = make_optimizer_(std::move(all));
  const auto& added = whole->param_groups().back();
  probe_ = std::move(whole);
  std::vector<int64_t> sizes;
  for (const auto& p : added.params()) sizes.push_back(detail::param_bytes(p));
  // Already placed parameters keep their ranks: the new group continues from the totals.
  param_groups_.emplace_back(added.params(), added.options().clone());
  for (const auto& p : added.params()) {
    index_of_.emplace(p.unsafeGetTensorImpl(), params_.size());
    params_.push_back(p);
  }
  partition_parameters({sizes}, world_size(), rank_totals_, owner_, order_);
  auto shard = make_shard(rank(), owner_, order_);
  shard->state() = std::move(shard_->state());
  shard_ = std::move(shard);
  if (options_.parameters_as_bucket_view()) build_buckets();
}

bool ZeroRedundancyOptimizer::keeps_float32_gradient(const at::Tensor& param) const {
  const auto* owner = dynamic_cast<const amp::optim::SupportsAmpScaling*>(
      owns(param) ? shard_.get() : probe_.get());
  return owner != nullptr && owner->keeps_float32_gradient(param);
}

at::Tensor ZeroRedundancyOptimizer::float32_gradient(const at::Tensor& param) {
  if (owns(param)) {
    auto* scaling = dynamic_cast<amp::optim::SupportsAmpScaling*>(shard_.get());
    return scaling != nullptr ? scaling->float32_gradient(param) : at::Tensor();
  }
  at::Tensor& scratch = scratch_gradients_[param.unsafeGetTensorImpl()];
  if (!scratch.defined()) scratch = at::empty(param.sizes(), param.options().dtype(at::kFloat));
  return scratch;
}

bool ZeroRedundancyOptimizer::owns(const at::Tensor& param) const {
  const auto found = index_of_.find(param.unsafeGetTensorImpl());
  return found != index_of_.end() && owner_[found->second] == rank();
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  // Every tensor an entry serializes: the optimizer type's own fields, whatever they are.
  int64_t bytes = 0;
  for (const auto& entry : optimizer.state()) {
    torch::serialize::OutputArchive out;
    entry.second->serialize(out);
    std::stringstream buffer;
    out.save_to(buffer);
    torch::serialize::InputArchive in;
    in.load_from(buffer);
    for (const auto& key : in.keys()) {
      c10::IValue value;
      if (in.try_read(key, value) && value.isTensor()) {
        const at::Tensor t = value.toTensor();
        bytes += t.numel() * static_cast<int64_t>(t.element_size());
      }
    }
  }
  return bytes;
}

int64_t ZeroRedundancyOptimizer::state_bytes() const { return optimizer_state_bytes(*shard_); }

}  // namespace amp::distributed
