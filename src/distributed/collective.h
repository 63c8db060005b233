// Helpers shared by amp::distributed: argument checks of groups, waiting with errors as
// sentences, and an exchange of a few numbers per rank for the cross-rank consistency checks.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <amp/distributed.h>

namespace amp::distributed::detail {

/// Throws c10::Error naming `who` when `group` is null.
void check_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& who);

/// The checks of new_gloo_group's and new_nccl_group's arguments (store, rank, world size,
/// timeout); throws c10::Error naming `who`.
void check_group_arguments(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                           const GroupOptions& options, const std::string& who);

/// The store prefix of the next group of `backend` made by this process. Every rank makes its
/// groups in the same order, so the prefixes agree.
std::string next_group_prefix(const char* backend);

/// Throws c10::Error naming `who` when `group` is null or has no backend for `device_type`.
void check_group_serves(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                        c10::DeviceType device_type, const std::string& who,
                        const std::string& what);

/// Waits for `work`; a failure (a rank that died, never came, or a timeout) is rethrown as one
/// c10::Error saying which collective (`what`) failed on which rank, followed by c10d's text.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, c10d::ProcessGroup& group,
              const std::string& what);

/// Starts `what` as an all-reduce of `tensors` with `op`, with start-up errors rethrown as by
/// wait_for.
c10::intrusive_ptr<c10d::Work> start_all_reduce(c10d::ProcessGroup& group,
                                                std::vector<at::Tensor>& tensors,
                                                c10d::ReduceOp::RedOpType op,
                                                const std::string& what);

/// Every rank's `values` (the same count on every rank): row r holds rank r's. One collective
/// on `device`.
std::vector<std::vector<double>> exchange_values(c10d::ProcessGroup& group,
                                                 const c10::Device& device,
                                                 const std::vector<double>& values,
                                                 const std::string& what);

/// "0, 1 and 3".
std::string rank_list(const std::vector<int>& ranks);

/// For each position where the ranks' rows differ, a phrase "<name> is <v> on ranks a, b and
/// <w> on rank c"; empty when all rows are equal. `format` renders one value.
std::vector<std::string> describe_differences(const std::vector<std::vector<double>>& rows,
                                              const std::vector<std::string>& names,
                                              std::string (*format)(size_t index, double value));

/// The device a consistency check communicates on: `preferred` (its current device) when the
/// group serves it, else the CPU.
c10::Device check_device(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                         c10::DeviceType preferred, const std::string& who);

}  // namespace amp::distributed::detail
