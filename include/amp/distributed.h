// amp::distributed: mixed precision across processes on c10d (Gloo on CPU, NCCL on CUDA), started
// by torchrun: process groups from torchrun's environment, a GradScaler flag sync so that every
// rank skips together, and a bucketed gradient all-reduce with optional half-precision transfer.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <amp/distributed_export.h>
#include <amp/grad_scaler.h>

namespace amp::distributed {

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
/// delayed-scaling amax is all-reduced (MAX) in place before it enters the history, so every rank
/// keeps the same histories and scales and casts with the same scale. One 4-byte collective per
/// cast (three per layer and step), issued on the amax's device without a host read on NCCL.
/// Contract: every rank runs the same float8 layers in the same order (SPMD). Throws c10::Error
/// when `group` is null, and at the first cast when it has no backend for the amax's device.
AMP_DISTRIBUTED_EXPORT std::function<void(const at::Tensor& amax)> amax_all_reduce(
    c10::intrusive_ptr<c10d::ProcessGroup> group);

/// Options of GradientAllReduce.
struct AMP_DISTRIBUTED_EXPORT GradientAllReduceOptions {
  /// Largest bucket (one collective) in bytes of gradients; DDP's default, 25 MiB. A parameter
  /// larger than this gets a bucket of its own. > 0.
  TORCH_ARG(int64_t, bucket_bytes) = 25 * 1024 * 1024;
  /// Transfer gradients in at::kHalf or at::kBFloat16 (DDP's fp16/bf16 compression hooks): half
  /// the bytes, at half precision's rounding. A value that overflows float16 (|x| > 65504, easily
  /// reached by scaled gradients) arrives as inf on every rank, so GradScaler skips the step and
  /// backs off, as it would for an overflow in backward. Unset: the gradients' own dtype.
  TORCH_ARG(std::optional<at::ScalarType>, comm_dtype) = std::nullopt;
};

/// Averages the gradients of `parameters` over the ranks of a process group, for data-parallel
/// training: call all_reduce_() after backward() and before GradScaler::unscale_/step. Gradients
/// are packed into flat buckets (per device and dtype, in reverse parameter order, as DDP
/// orders them), each bucket is divided by the world size (converted to comm_dtype first when
/// set) and summed with one all-reduce, all buckets in flight at once, then copied back.
///
/// What it is not: DDP. It does not overlap communication with backward, does not broadcast
/// parameters at start (start every rank from the same seed or load the same checkpoint), does not
/// find unused parameters (a parameter without a gradient is reduced as zeros and gets a zero
/// gradient), and does not handle sparse gradients. The constructor compares the parameters'
/// count, shapes and dtypes across ranks (one collective) and throws on every rank when they
/// differ.
class AMP_DISTRIBUTED_EXPORT GradientAllReduce {
 public:
  /// Plans the buckets for `parameters` (the same list, in the same order, on every rank).
  /// Throws c10::Error for an undefined or sparse parameter, bucket_bytes <= 0, a comm_dtype
  /// other than kHalf/kBFloat16, a group without a backend for a parameter's device type, and
  /// parameters that differ across ranks.
  GradientAllReduce(std::vector<at::Tensor> parameters,
                    c10::intrusive_ptr<c10d::ProcessGroup> group,
                    GradientAllReduceOptions options = {});

  /// Replaces every gradient by its average over the ranks (identical on every rank afterwards).
  /// Throws c10::Error naming the rank, the world size and the timeout when a rank does not take
  /// part in time.
  void all_reduce_();

  /// The parameter indices of each bucket, in the order the buckets are reduced.
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }
  /// The options in use.
  const GradientAllReduceOptions& options() const { return options_; }

 private:
  std::vector<at::Tensor> parameters_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  GradientAllReduceOptions options_;
  std::vector<std::vector<size_t>> bucket_params_;
  // One flat buffer per bucket, in the transfer dtype, reused by every call.
  std::vector<at::Tensor> bucket_buffers_;
};

}  // namespace amp::distributed
