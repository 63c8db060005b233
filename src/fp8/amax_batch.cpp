// Batched amax reductions for delayed scaling (amax_batch.h): the process-wide list of casts whose
// amax waits for its all-reduce (fed by one training thread: a second is refused), and the flush
// that reduces them per process group and applies the per-cast update to each.
#include "fp8/amax_batch.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include "fp8/delayed_state.h"

namespace amp::fp8::detail {
namespace {

// The callable inside a batched AmaxReduction: recognised by its type (std::function::target),
// which only this file names.
struct BatchedReduction {
  const void* ranks;
  AmaxesReduction reduce;
  void operator()(const at::Tensor& amax) const {
    reduce(amax.dim() == 0 ? amax.reshape({1}) : amax);
  }
};

struct WaitingCast {
  DelayedState state;
  c10::ScalarType fp8_dtype;
  DelayedScalingOptions options;
  // The thread of a forward's cast (outside any backward); unset for a backward's cast, which
  // autograd may run on its own device threads.
  std::optional<std::thread::id> forward_thread;
  const BatchedReduction& reduction() const {
    return *options.amax_reduction().target<BatchedReduction>();
  }
};

// Casts are recorded from the forward's thread and from autograd's device threads.
std::mutex mutex;
std::vector<WaitingCast> waiting;    // a few per layer: scanned, not indexed
int64_t flush_queued_for_pass = -1;  // the graph task whose final callback will flush
std::atomic<int64_t> reductions_issued{0};

// The thread of a cast in a forward (outside any backward); nullopt inside a backward, which
// autograd may run on its own device threads for the thread that started it.
std::optional<std::thread::id> forward_cast_thread() {
  if (torch::autograd::get_current_graph_task_id() != -1) return std::nullopt;
  return std::this_thread::get_id();
}

// The waiting amaxes are the process's: a flush at the end of one thread's backward (or before
// one thread's cast) would reduce another thread's on their groups, and the collectives could
// reach the ranks in different orders and hang. Refused before anything changes. Call with the
// mutex held.
void check_one_training_thread(const std::optional<std::thread::id>& forward_thread) {
  if (!forward_thread) return;
  for (const auto& cast : waiting) {
    TORCH_CHECK(!cast.forward_thread || *cast.forward_thread == *forward_thread,
                "amp::fp8: two threads cast with a batched amax reduction "
                "(amp::distributed::amax_all_reduce) while amaxes of the other wait for theirs. "
                "The waiting amaxes are per process, so one thread's flush would carry the "
                "other's and the ranks' collectives could go out of order and hang. Train from "
                "one thread per process, or give the other thread's layers an amax_reduction of "
                "your own (reduced at every cast).");
  }
}

void flush() {
  std::vector<WaitingCast> batch;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch.swap(waiting);
  }
  // One reduction per process group and device, in the order the groups first cast (the same on
  // every rank, since every rank runs the same layers in the same order).
  std::vector<bool> done(batch.size(), false);
  for (size_t first = 0; first < batch.size(); ++first) {
    if (done[first]) continue;
    std::vector<size_t> members;
    for (size_t i = first; i < batch.size(); ++i) {
      if (!done[i] && batch[i].reduction().ranks == batch[first].reduction().ranks &&
          batch[i].state.amax_history.device() == batch[first].state.amax_history.device()) {
        members.push_back(i);
        done[i] = true;
      }
    }
    std::vector<at::Tensor> amaxes;
    amaxes.reserve(members.size());
    for (size_t i : members) amaxes.push_back(batch[i].state.amax_history[0]);
    auto reduced = at::stack(amaxes);
    batch[first].reduction().reduce(reduced);
    ++reductions_issued;
    for (size_t k = 0; k < members.size(); ++k) amaxes[k].copy_(reduced[k]);
  }
  for (auto& cast : batch) update_delayed_scale(cast.state, cast.fp8_dtype, cast.options);
}

}  // namespace

AmaxReduction batched_amax_reduction(const void* ranks, AmaxesReduction reduce) {
  return BatchedReduction{ranks, std::move(reduce)};
}

bool defer_delayed_amax(DelayedState& state, const at::Tensor& amax, c10::ScalarType fp8_dtype,
                        const DelayedScalingOptions& options) {
  const auto* reduction =
      options.amax_reduction() ? options.amax_reduction().target<BatchedReduction>() : nullptr;
  if (!reduction) return false;
  const std::optional<std::thread::id> forward_thread = forward_cast_thread();
  std::lock_guard<std::mutex> lock(mutex);
  check_one_training_thread(forward_thread);
  // The cast flushed its predecessor's amax before reading its scale (flush_if_waiting).
  state.amax_history[0].copy_(amax);
  waiting.push_back(WaitingCast{state, fp8_dtype, options, forward_thread});
  return true;
}

void flush_if_waiting(const DelayedState& state) {
  const std::optional<std::thread::id> forward_thread = forward_cast_thread();
  bool waits = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& cast : waiting)
      waits = waits || cast.state.amax_history.is_same(state.amax_history);
    // The flush this cast needs would carry every waiting amax.
    if (waits) check_one_training_thread(forward_thread);
  }
  if (waits) flush();
}

void flush_delayed_amaxes_when_backward_ends() {
  const int64_t pass = torch::autograd::get_current_graph_task_id();
  if (pass < 0) return;  // not inside autograd's engine: the next cast or flush applies them
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (waiting.empty() || flush_queued_for_pass == pass) return;
    flush_queued_for_pass = pass;
  }
  torch::autograd::Engine::get_default_engine().queue_callback([] { flush(); });
}

int64_t batched_amax_reductions_issued() { return reductions_issued.load(); }

}  // namespace amp::fp8::detail

namespace amp::fp8 {

void flush_delayed_scaling() { detail::flush(); }

}  // namespace amp::fp8
