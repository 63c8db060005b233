// The worker's ZeroRedundancyOptimizer scenarios (zero_worker.cpp).
#pragma once

#include <string>

#include <amp/distributed.h>

#include "worker_support.h"

namespace amp_worker {

/// The twin of parity/zero_parity.py's PyTorch ranks: DDP, ZeroRedundancyOptimizer and GradScaler
/// on the same model, weights and data, printing the same lines (see zero_parity.py's protocol).
void zero_parity(const amp::distributed::TorchrunEnv& env, const std::string& dir,
                 const ParityConfig& config);

/// ZeroRedundancyOptimizer against the same optimizer unsharded, in one process on every rank:
/// `optimizer` (fused_adamw, fused_sgd, lion, torch_adamw, torch_sgd) on `model` (fp32; mixed or
/// half: bfloat16 or float16 weights beside a float32 LayerNorm; tiny: two parameters, fewer than
/// the ranks), with `extra` (none, master, kahan, sr; master_unscale: master weights and unscale_
/// before the step), the lr quartered from step 2 on, on `device` (CUDA: Gloo carries CUDA tensors,
/// so ranks can share one GPU). Prints "step{k}.equal 0|1", the partition and the state bytes of
/// both.
void zero_equal(const amp::distributed::TorchrunEnv& env, const std::string& optimizer,
                const std::string& model, const std::string& extra, c10::DeviceType device);

/// Each rank its own gradients and a GradScaler without found_inf_sync; rank 1's hold an inf at
/// step 1. Prints the scale and a parameter fingerprint after every step.
void zero_skip_unsynced(const amp::distributed::TorchrunEnv& env, const std::string& optimizer);

/// The refusals: state_dict() before consolidating and on a non-target rank, a bad `to`, a
/// damaged shard, another model's checkpoint. Prints "error.<case> <message>" and whether the
/// state stayed as it was.
void zero_errors(const amp::distributed::TorchrunEnv& env, const std::string& dir);

/// Trains 2 steps with FusedAdamW under ZeroRedundancyOptimizer, saves sharded (DIR/sharded, the
/// model in DIR/model.pt) and consolidated (DIR/consolidated.pt), trains 2 more ("after{k}"
/// lines); an unsharded FusedAdamW and a new ZeroRedundancyOptimizer loading the consolidated file
/// must continue with the same bits ("unsharded.equal", "reloaded.equal").
void zero_roundtrip(const amp::distributed::TorchrunEnv& env, const std::string& dir);

/// Continues zero_roundtrip's run at this job's world size from DIR/sharded: "after{k}" lines.
void zero_resume(const amp::distributed::TorchrunEnv& env, const std::string& dir);

/// consolidate_state_dict reached by rank 0 only: prints rank 0's error.
void zero_partial_consolidate(const amp::distributed::TorchrunEnv& env);

}  // namespace amp_worker
