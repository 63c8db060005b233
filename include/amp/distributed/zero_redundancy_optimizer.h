// amp::distributed::ZeroRedundancyOptimizer: ZeRO stage 1 for LibTorch, as Python's
// torch.distributed.optim.ZeroRedundancyOptimizer: each rank keeps the optimizer state of its share
// of the parameters only, steps that share, and sends the updated parameters to the other ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <amp/distributed_export.h>
#include <amp/optim/wraps_optimizer.h>
#include <amp/scaler_hooks.h>

namespace amp::distributed {

/// Makes the optimizer of one rank's shard from param groups: one per group of the
/// ZeroRedundancyOptimizer, in order, each holding that rank's parameters of the group (possibly
/// none) and the group's options. shard_optimizer<T>(defaults) makes one for optimizer type T.
using ShardOptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::optim::OptimizerParamGroup>)>;

/// The factory of optimizers of type `Optimizer` (amp's FusedAdam/FusedAdamW/FusedSGD/FusedLion,
/// or LibTorch's Adam/AdamW/SGD/...) with `defaults` for groups that state no options.
template <typename Optimizer, typename Options>
ShardOptimizerFactory shard_optimizer(Options defaults) {
  return [defaults = std::move(defaults)](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return std::unique_ptr<torch::optim::Optimizer>(new Optimizer(std::move(groups), defaults));
  };
}

struct AMP_DISTRIBUTED_EXPORT ZeroRedundancyOptimizerOptions {
  /// Python's parameters_as_bucket_view: the parameters become views into one flat buffer per
  /// device, owning rank and dtype, and each owner sends its updated parameters as that one
  /// buffer instead of one broadcast per parameter. The parameters' values do not change.
  TORCH_ARG(bool, parameters_as_bucket_view) = false;
};

/// ZeRO stage 1 over `group` (Gloo for CPU tensors, NCCL for CUDA ones) around any optimizer.
///
/// The partition is Python's: groups in order; within a group the parameters sorted by size,
/// largest first (stable); each to the rank with the smallest running total, ties to the lowest
/// rank; the totals carried from group to group; frozen parameters included; no parameter split.
/// Size is a parameter's bytes (Python's numel, times the element size): with one dtype, as
/// Python's models have, the two give the same partition; with bfloat16 weights and float32
/// norms (amp::to_low_precision) the shares balance in bytes, where Python refuses mixed dtypes.
///
/// param_groups() are the whole model's groups, as in Python: GradScaler checks every gradient
/// for inf/NaN, so an overflow that only a non-owner sees still skips the owner's step. With
/// scaler.step(zero) the scaler hands the scale and the inf/NaN flag to step(), which combines
/// the flag over the ranks (max, in place, so the scaler's update() sees it too) before anything
/// changes: every rank steps or skips together and none waits for a broadcast that never comes,
/// with or without GradScalerOptions::found_inf_sync. A fused inner optimizer (amp's Fused*)
/// unscales and skips on the device, with no host read; a LibTorch one costs the one host read
/// that GradScaler makes for it anyway. Options changed on param_groups() (an lr schedule) reach
/// the shard's optimizer at the next step.
///
/// After every step each rank holds the parameters that unsharded training with the same
/// optimizer gives, bit for bit. Stochastic rounding draws each parameter's bits from its
/// position in the whole model, so sharded and unsharded rounding agree too.
///
/// Contract: every rank constructs it with the same parameters (shapes, dtypes, order) and makes
/// the same calls in the same order (SPMD). Collective calls: the constructor (it compares the
/// ranks' parameter counts and bytes, and refuses with a sentence when they differ), step,
/// consolidate_state_dict, save_sharded and load_sharded. add_param_group communicates nothing, but
/// every rank must make it: each computes the partition itself.
class AMP_DISTRIBUTED_EXPORT ZeroRedundancyOptimizer : public torch::optim::Optimizer,
                                                       public amp::optim::SupportsAmpScaling,
                                                       public amp::optim::WrapsOptimizer {
 public:
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          ShardOptimizerFactory make_optimizer,
                          c10::intrusive_ptr<c10d::ProcessGroup> group,
                          ZeroRedundancyOptimizerOptions options = {});
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, ShardOptimizerFactory make_optimizer,
                          c10::intrusive_ptr<c10d::ProcessGroup> group,
                          ZeroRedundancyOptimizerOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  /// Steps this rank's shard, then sends every updated parameter from its owner to all ranks.
  /// A closure is run on every rank before the step, its loss returned.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Adds a group (options resolved by the inner optimizer's own rule) and partitions its
  /// parameters after those already placed, which keep their ranks (Python's add_param_group).
  /// Hides Optimizer::add_param_group: call it on the ZeroRedundancyOptimizer itself.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  /// For a float16 parameter whose group has master_weights (amp's fused optimizers): GradScaler's
  /// unscale_ then unscales its gradient into a float32 copy, as without ZeRO. The owner's shard
  /// optimizer steps with it; another rank gets a scratch copy that only the inf/NaN check reads.
  bool keeps_float32_gradient(const at::Tensor& param) const override;
  at::Tensor float32_gradient(const at::Tensor& param) override;

  /// The rank owning each parameter, by global index: groups in order, parameters in order.
  const std::vector<int64_t>& partition() const { return owner_; }
  /// This rank's optimizer, over its shard.
  torch::optim::Optimizer& shard() { return *shard_; }
  const torch::optim::Optimizer& shard() const { return *shard_; }
  /// The shard (amp::optim::WrapsOptimizer): amp's Python-format state dicts (amp/state_dict.h)
  /// of this optimizer, which hold the consolidated state, name and check the inner optimizer's
  /// implementation.
  const torch::optim::Optimizer& wrapped_optimizer() const override { return *shard_; }
  /// The bytes of optimizer state this rank holds (every tensor of its shard's state).
  int64_t state_bytes() const;
  /// The flat buffers the parameters are views into (parameters_as_bucket_view), this rank's
  /// view of every owner's, in the order (device, owner, dtype); empty without the option.
  const std::vector<at::Tensor>& buckets() const { return buckets_; }
  int rank() const;
  int world_size() const;

  /// Collective: gathers every rank's state on rank `to`, as one unsharded optimizer of the
  /// inner type over all parameters (Python's consolidate_state_dict).
  void consolidate_state_dict(int64_t to = 0);
  /// On the rank consolidate_state_dict gathered to: the unsharded optimizer holding the whole
  /// state. torch::save(zero.state_dict(), path) writes the inner optimizer's ordinary file,
  /// which the unsharded optimizer loads. Throws on any other rank, or before consolidating.
  const torch::optim::Optimizer& state_dict() const;
  /// Writes state_dict() (the consolidated state) to `archive`: torch::save(zero, path) works.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads an unsharded optimizer's file (an inner-type optimizer over all parameters, or
  /// another world size's consolidated save) and keeps this rank's part; all or nothing. Not
  /// collective: every rank reads the whole file, as Python's load_state_dict takes the whole
  /// state dict.
  void load(torch::serialize::InputArchive& archive) override;

  /// Collective: each rank writes its shard to `directory`/zero-shard-<rank>-of-<world>.pt and
  /// rank 0 an index (zero-index.pt: the world size, the partition, each parameter's shape and
  /// dtype); nothing is gathered. Files are replaced atomically; the call returns on every rank
  /// once every file is written.
  void save_sharded(const std::string& directory) const;
  /// Collective: reads a save_sharded checkpoint of any world size, each rank opening only the
  /// shards that hold its parameters. Refuses another model (naming the parameter), a damaged
  /// index or shard, with a sentence on every rank; then no rank has changed anything.
  void load_sharded(const std::string& directory);

 private:
  // The param groups of `rank` under the partition (`owner`, `order`): one per group, that
  // rank's parameters in the order `order` lists them, the group's options.
  std::vector<torch::optim::OptimizerParamGroup> groups_of_rank(
      int64_t rank, const std::vector<int64_t>& owner, const std::vector<int64_t>& order) const;
  // An inner optimizer over those groups, with each parameter's global position.
  std::unique_ptr<torch::optim::Optimizer> make_shard(int64_t rank,
                                                      const std::vector<int64_t>& owner,
                                                      const std::vector<int64_t>& order) const;
  // The parameters whose global index `selected` accepts, in global order.
  std::vector<at::Tensor> params_where(const std::function<bool(size_t)>& selected) const;
  // Whether this rank owns `param`.
  bool owns(const at::Tensor& param) const;
  // save_sharded's and load_sharded's work on this rank (they agree with the others around it).
  void write_sharded(const std::string& directory) const;
  std::unique_ptr<torch::optim::Optimizer> read_sharded(
      const std::string& directory,
      std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& loaded_options) const;
  void build_buckets();
  void sync_group_options();
  void broadcast_parameters();

  ShardOptimizerFactory make_optimizer_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  ZeroRedundancyOptimizerOptions options_;
  std::unique_ptr<torch::optim::Optimizer> shard_;
  // An inner optimizer over every parameter, never stepped (it holds no state): it answers for
  // parameters this rank does not own, by the same rules.
  std::unique_ptr<torch::optim::Optimizer> probe_;
  std::unordered_map<const void*, at::Tensor> scratch_gradients_;
  std::unique_ptr<torch::optim::Optimizer> consolidated_;
  int64_t consolidated_to_ = -1;
  // By global index: the owner, and the order in which each rank's groups list their parameters
  // (Python's: largest first, stable), as global indices.
  std::vector<int64_t> owner_;
  std::vector<int64_t> order_;
  // Every parameter by global index, and each one's global index by TensorImpl (also its position
  // for stochastic rounding's streams).
  std::vector<at::Tensor> params_;
  std::unordered_map<const void*, uint64_t> index_of_;
  std::vector<int64_t> rank_totals_;
  std::vector<at::Tensor> buckets_;
  std::vector<int64_t> bucket_owner_;
};

/// The bytes of every tensor in `optimizer`'s per-parameter state, whatever its type (read through
/// the state's own serialization): what one rank holds, to compare with ZeroRedundancyOptimizer's
/// state_bytes().
AMP_DISTRIBUTED_EXPORT int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

/// The partition of `sizes` (each parameter's bytes) (one
/// list per group) over `world_size` ranks: the owner of each parameter by global index, and the
/// order of the parameters within each group (largest first, stable). `totals` carries each
/// rank's running total from earlier groups and is updated. Exposed for tests.
AMP_DISTRIBUTED_EXPORT void partition_parameters(const std::vector<std::vector<int64_t>>& sizes,
                                                 int64_t world_size, std::vector<int64_t>& totals,
                                                 std::vector<int64_t>& owner,
                                                 std::vector<int64_t>& order);

}  // namespace amp::distributed
