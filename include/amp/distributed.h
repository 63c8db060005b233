// amp::distributed: mixed precision across processes on c10d (Gloo on CPU, NCCL on CUDA), started
// by torchrun: process groups from torchrun's environment, a GradScaler flag sync so that every
// rank skips together, and DistributedDataParallel on c10d's Reducer (gradients all-reduced in
// buckets during backward, with float16/bfloat16 transfer hooks).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <amp/distributed_export.h>
#include <amp/grad_scaler.h>

namespace c10d {
class CommHookInterface;
class Logger;
class Reducer;
}  // namespace c10d

namespace amp::distributed {

namespace detail {
// The tensors of a forward's output, for DistributedDataParallel::forward.
template <typename T>
inline constexpr bool kIsForwardOutput =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::vector<at::Tensor>>;
template <typename... T>
inline constexpr bool kIsForwardOutput<std::tuple<T...>> = (kIsForwardOutput<T> && ...);
template <typename A, typename B>
inline constexpr bool kIsForwardOutput<std::pair<A, B>> = kIsForwardOutput<A>&& kIsForwardOutput<B>;

inline void collect_tensors(at::Tensor& output, std::vector<at::Tensor*>& slots);
inline void collect_tensors(std::vector<at::Tensor>& output, std::vector<at::Tensor*>& slots);
template <typename... T>
void collect_tensors(std::tuple<T...>& output, std::vector<at::Tensor*>& slots);
template <typename A, typename B>
void collect_tensors(std::pair<A, B>& output, std::vector<at::Tensor*>& slots);

inline void collect_tensors(at::Tensor& output, std::vector<at::Tensor*>& slots) {
  slots.push_back(&output);
}
inline void collect_tensors(std::vector<at::Tensor>& output, std::vector<at::Tensor*>& slots) {
  for (at::Tensor& tensor : output) slots.push_back(&tensor);
}
template <typename... T>
void collect_tensors(std::tuple<T...>& output, std::vector<at::Tensor*>& slots) {
  std::apply([&slots](auto&... part) { (collect_tensors(part, slots), ...); }, output);
}
template <typename A, typename B>
void collect_tensors(std::pair<A, B>& output, std::vector<at::Tensor*>& slots) {
  collect_tensors(output.first, slots);
  collect_tensors(output.second, slots);
}
}  // namespace detail

/// What torchrun tells each process it starts (`torchrun --no-python --nproc-per-node N prog`).
struct AMP_DISTRIBUTED_EXPORT TorchrunEnv {
  /// RANK: this process's rank in [0, world_size).
  int rank = 0;
  /// WORLD_SIZE: the number of processes.
  int world_size = 1;
  /// LOCAL_RANK: the rank on this node (picks the GPU: cuda:LOCAL_RANK); RANK when unset.
  int local_rank = 0;
  /// TORCHELASTIC_RESTART_COUNT: how often torchrun restarted the job (0 when unset).
  int restart_count = 0;
  /// MASTER_ADDR: the host of the rendezvous TCPStore.
  std::string master_addr;
  /// MASTER_PORT: the port of the rendezvous TCPStore.
  uint16_t master_port = 0;
  /// TORCHELASTIC_USE_AGENT_STORE == "True": torchrun's agent hosts the store and every rank is a
  /// client; otherwise rank 0 hosts it.
  bool agent_store = false;
};

/// Reads torchrun's variables. Throws c10::Error naming the variable, its value and the fix when
/// one is missing or invalid (e.g. the program was not started by torchrun).
AMP_DISTRIBUTED_EXPORT TorchrunEnv torchrun_env();
/// Whether the variables torchrun sets (RANK and WORLD_SIZE) are present.
AMP_DISTRIBUTED_EXPORT bool launched_by_torchrun();

/// How process groups are made.
struct AMP_DISTRIBUTED_EXPORT GroupOptions {
  /// How long to wait for the other ranks: at the rendezvous (store and connection set-up) and
  /// in every collective. A rank that never joins or dies makes the others throw within about
  /// this time instead of hanging. c10d's own default is 30 minutes; amp's is 5.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  /// The address Gloo binds and advertises; empty means c10d's default device (the host name,
  /// or the interface named by GLOO_SOCKET_IFNAME).
  TORCH_ARG(std::string, gloo_hostname) = "";
  /// The device types the Gloo group serves. Empty (the default) means CPU, plus CUDA when CUDA
  /// is available (Gloo moves CUDA tensors through host memory, blocking the host).
  TORCH_ARG(std::vector<c10::DeviceType>, gloo_device_types) = {};
};

/// A process group of `world_size` ranks over `store`, with a Gloo backend. Every rank calls it
/// with the same store and world size; it returns once all have joined and throws c10::Error
/// after GroupOptions::timeout when one does not. Keys go under a prefix of their own, so the
/// store may be shared.
AMP_DISTRIBUTED_EXPORT c10::intrusive_ptr<c10d::ProcessGroup> new_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const GroupOptions& options = {});
/// The rendezvous store torchrun's variables describe: a TCPStore client of torchrun's agent
/// store (TORCHELASTIC_USE_AGENT_STORE=True, as Python's init_process_group does) or one hosted
/// by rank 0 at MASTER_ADDR:MASTER_PORT.
AMP_DISTRIBUTED_EXPORT c10::intrusive_ptr<c10d::Store> torchrun_store(
    const TorchrunEnv& env, std::chrono::milliseconds timeout);
/// new_gloo_group over torchrun_store(torchrun_env()): the CPU process group of a program
/// started by `torchrun --no-python`. Keys are prefixed with the restart count, so a restarted
/// job never reads an earlier attempt's keys.
AMP_DISTRIBUTED_EXPORT c10::intrusive_ptr<c10d::ProcessGroup> init_gloo_from_torchrun(
    const GroupOptions& options = {});

/// Whether this amp was built with NCCL process groups (AMP_WITH_CUDA and the wheel's NCCL).
AMP_DISTRIBUTED_EXPORT bool built_with_nccl();
/// A process group with an NCCL backend for CUDA tensors (one GPU per rank: cuda:LOCAL_RANK
/// must be the current device). Throws when built_with_nccl() is false or CUDA is unavailable.
AMP_DISTRIBUTED_EXPORT c10::intrusive_ptr<c10d::ProcessGroup> new_nccl_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const GroupOptions& options = {});

/// new_nccl_group over torchrun_store(torchrun_env()), after making cuda:LOCAL_RANK the current
/// device (one GPU per rank): the CUDA process group of a program started by torchrun.
AMP_DISTRIBUTED_EXPORT c10::intrusive_ptr<c10d::ProcessGroup> init_nccl_from_torchrun(
    const GroupOptions& options = {});

/// A GradScalerOptions::found_inf_sync over `group`: the scaler's inf/NaN flag is all-reduced
/// (MAX) before every skip decision and scale update, so every rank skips together and holds the
/// same scale. One 4-byte collective per GradScaler::step (plus one in update() for flags
/// recorded by unscale_ without a step), issued on the device with no host read: on the fused
/// optimizers' path a step stays free of host syncs with NCCL. The scaler's constructor compares
/// its device type and options across the ranks (one collective) and throws on every rank,
/// naming the option and the ranks, when they differ; and throws when `group` has no backend for
/// the scaler's device type.
/// Contract: every rank constructs its scaler and calls step/update for the same optimizers in
/// the same order (SPMD).
AMP_DISTRIBUTED_EXPORT std::shared_ptr<FoundInfSync> found_inf_sync(
    c10::intrusive_ptr<c10d::ProcessGroup> group);

/// An amp::fp8::AmaxReduction over `group` for DelayedScalingOptions::amax_reduction: each
/// delayed-scaling amax is all-reduced (MAX) before it enters the history, so every rank keeps the
/// same histories and scales and casts with the same scale. Batched: the casts' amaxes wait and
/// one collective of 4 bytes per cast reduces them all at the end of each backward pass
/// (amp::fp8::flush_delayed_scaling), instead of one per cast (three per layer and step); issued
/// on the amaxes' device without a host read on NCCL.
/// Contract: every rank runs the same float8 layers in the same order (SPMD). Throws c10::Error
/// when `group` is null, and at the first cast when it has no backend for the amax's device.
AMP_DISTRIBUTED_EXPORT std::function<void(const at::Tensor& amax)> amax_all_reduce(
    c10::intrusive_ptr<c10d::ProcessGroup> group);

/// What DistributedDataParallel sends for each bucket of gradients.
enum class CommHook {
  /// The gradients' own dtype, averaged: each bucket is multiplied by 1 / world size and summed
  /// (the arithmetic of PyTorch's DDP without a hook).
  kAllReduce,
  /// float16 (Python's fp16_compress_hook): the bucket is converted to float16, divided by the
  /// world size, summed in float16 and copied back. Half the bytes; a scaled gradient beyond
  /// 65504 arrives as inf on every rank, so GradScaler skips the step everywhere and backs off.
  kFp16Compress,
  /// bfloat16 (Python's bf16_compress_hook, which has no C++ counterpart in c10d): the same
  /// arithmetic in bfloat16, float32's range at 8 bits of mantissa.
  kBf16Compress,
};

/// Options of DistributedDataParallel, named as in torch.nn.parallel.DistributedDataParallel.
struct AMP_DISTRIBUTED_EXPORT DistributedDataParallelOptions {
  /// Largest bucket (one all-reduce) in MiB of gradients; unset means DDP's 25 MiB. > 0.
  TORCH_ARG(std::optional<double>, bucket_cap_mb) = std::nullopt;
  /// Cap of the first bucket reduced (the last layers' gradients, ready first), so that
  /// communication starts early; unset means 1 MiB when bucket_cap_mb is unset and bucket_cap_mb
  /// otherwise, as in DDP. > 0.
  TORCH_ARG(std::optional<double>, first_bucket_cap_mb) = std::nullopt;
  /// Find the parameters that the forward's outputs do not reach, on every iteration, and leave
  /// their gradients as they are (undefined when unused on every rank), instead of waiting for
  /// them. Costs a graph traversal per iteration and one all-reduce of a used-map.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Make each parameter's .grad() a view into its bucket, saving one copy and the memory of the
  /// gradients. Clear gradients with DistributedDataParallel::zero_grad(): LibTorch's
  /// Optimizer::zero_grad() calls detach_() on every gradient, which a view refuses.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// Broadcast the module's buffers from rank 0 before every synced forward (e.g. BatchNorm's
  /// running statistics), as DDP does; except the buffers a module declares rank-local
  /// (amp::fp8::Float8Linear's delayed-scaling histories and scales, each rank's own as in
  /// Transformer Engine), which are never broadcast.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// The set of used parameters and the order of their gradients is the same in every iteration:
  /// the first iteration finds it (all-reduce after backward), the later ones reuse it.
  TORCH_ARG(bool, static_graph) = false;
  /// What each bucket sends; see CommHook. A hook of your own: register_comm_hook.
  TORCH_ARG(CommHook, comm_hook) = CommHook::kAllReduce;
};

/// Data-parallel training on c10d's Reducer, the engine of PyTorch's DistributedDataParallel:
/// each bucket of gradients is all-reduced from autograd hooks as soon as backward has produced
/// it, so communication overlaps the rest of backward; when backward() returns, every gradient
/// is the average over the ranks.
///
/// Construction does what Python's wrapper does: checks that every rank holds the same
/// parameters (count, shapes, dtypes), broadcasts the parameters and buffers of rank 0, plans the
/// buckets and makes the Reducer. The wrapped module is found through the module API (its
/// parameters that require gradients, shared ones once, in registration order).
///
/// C++ modules have forward() signatures of their own, so the forward is passed as a callable
/// that runs the module and returns its output: an at::Tensor, a std::vector<at::Tensor>, or a
/// `std::tuple` or `std::pair` of tensors.
///
///     dist::DistributedDataParallel ddp(model, group);
///     at::Tensor loss = loss_fn(ddp.forward([&] { return model->forward(x); }), y);
///     scaler.scale(loss).backward();   // buckets all-reduced during this call
///     scaler.step(optimizer);
///
/// Contract (SPMD): every rank runs the same forwards and backwards in the same order; a forward
/// that is run without ddp.forward on one rank is not synchronised.
class AMP_DISTRIBUTED_EXPORT DistributedDataParallel {
 public:
  /// Wraps `module`. Throws c10::Error, on every rank, when the ranks' parameters differ, a
  /// parameter is sparse or not on one device, the options are invalid, the group does not serve
  /// the parameters' device, or another DistributedDataParallel already wraps one of the
  /// parameters.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          c10::intrusive_ptr<c10d::ProcessGroup> group,
                          DistributedDataParallelOptions options = {});
  /// The same for a module holder (torch::nn::Linear, a TORCH_MODULE type, ...).
  template <typename ModuleType>
  DistributedDataParallel(const torch::nn::ModuleHolder<ModuleType>& module,
                          c10::intrusive_ptr<c10d::ProcessGroup> group,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                                std::move(group), std::move(options)) {}
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Runs `run()` (the wrapped module's forward) the way DDP runs a forward: buffers broadcast,
  /// buckets rebuilt in the order gradients arrived (after the first iteration), and the Reducer
  /// armed for the next backward, unless inside no_sync(). Returns what `run` returned.
  template <typename Forward>
  auto forward(Forward&& run) -> std::invoke_result_t<Forward&&> {
    using Output = std::invoke_result_t<Forward&&>;
    static_assert(detail::kIsForwardOutput<Output>,
                  "DistributedDataParallel::forward: the callable must return an at::Tensor, a "
                  "std::vector<at::Tensor>, or a std::tuple/std::pair of at::Tensor");
    begin_forward();
    Output output = std::forward<Forward>(run)();
    std::vector<at::Tensor*> slots;
    detail::collect_tensors(output, slots);
    std::vector<at::Tensor> tensors;
    tensors.reserve(slots.size());
    for (at::Tensor* slot : slots) tensors.push_back(*slot);
    tensors = end_forward(std::move(tensors));
    for (size_t i = 0; i < slots.size(); ++i) *slots[i] = std::move(tensors[i]);
    return output;
  }

  /// While the returned guard lives, forwards (and their backwards) accumulate gradients locally
  /// without communication; the first synced forward + backward after it reduces the
  /// accumulated gradients. The forward must run inside the guard. Guards nest.
  class AMP_DISTRIBUTED_EXPORT NoSync {
   public:
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    ~NoSync();

   private:
    friend class DistributedDataParallel;
    explicit NoSync(DistributedDataParallel& ddp);
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  /// A guard under which forwards and backwards accumulate gradients without communication (see
  /// NoSync): `{ auto guard = ddp.no_sync(); ... }`. A synced forward whose backward never ran
  /// and no longer can (its outputs and everything computed from them are gone: an evaluation
  /// forward with grad mode on, a batch dropped after a non-finite loss) is given up, so the
  /// guard's backwards stay local. Throws c10::Error when that backward can still run (its
  /// outputs or loss are alive), because it would all-reduce even inside the guard.
  [[nodiscard]] NoSync no_sync();

  /// Replaces the options' comm_hook by `hook` (a c10d::CppCommHookInterface of yours; include
  /// <torch/csrc/distributed/c10d/comm.hpp>). Its future must hold the bucket's averaged
  /// gradients. Throws c10::Error when called after the first forward that prepared a backward
  /// (grad mode on, outside no_sync) or a second time.
  void register_comm_hook(std::unique_ptr<c10d::CommHookInterface> hook);

  /// Clears the gradients of parameters(), as Python's Module.zero_grad: set_to_none resets them
  /// (the next backward makes them again, as bucket views with gradient_as_bucket_view); otherwise
  /// they are zeroed in place. Works with gradient_as_bucket_view, unlike LibTorch's
  /// Optimizer::zero_grad().
  void zero_grad(bool set_to_none = true);

  /// The wrapped module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  /// The parameters whose gradients are reduced, in the Reducer's order.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// The indices into parameters() of each bucket, in the order the buckets are reduced. One
  /// bucket per dtype before the first iteration (as in DDP, unless find_unused_parameters);
  /// rebuilt from the order gradients arrived in during the first backward.
  std::vector<std::vector<size_t>> buckets() const;
  /// The options in use.
  const DistributedDataParallelOptions& options() const { return options_; }
  /// The process group.
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }

 private:
  // Construction after the parameters are claimed (released again if this throws).
  void initialize(std::unordered_map<size_t, std::string> names);
  void release_parameters() noexcept;
  void begin_forward();
  std::vector<at::Tensor> end_forward(std::vector<at::Tensor> outputs);
  // When the Reducer still expects the backward of a synced forward: gives it up and returns
  // false if its graph is gone, returns true if that backward can still run.
  bool abandon_dead_backward();

  std::shared_ptr<torch::nn::Module> module_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<c10d::Reducer> reducer_;
  std::shared_ptr<c10d::Logger> logger_;
  bool hook_registered_ = false;
  bool forwarded_ = false;
  bool require_backward_grad_sync_ = true;
  bool require_forward_param_sync_ = true;
  // Whether the last synced forward's graph is still alive, one check per output.
  std::vector<std::function<bool()>> pending_graph_;
  // Set by the first static_graph backward (when its delayed all-reduce is queued), as Python's
  // _static_graph_delay_allreduce_enqueued.
  std::shared_ptr<std::atomic<bool>> static_graph_delay_queued_ =
      std::make_shared<std::atomic<bool>>(false);
};

}  // namespace amp::distributed
