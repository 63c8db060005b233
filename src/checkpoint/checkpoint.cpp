// amp::checkpoint's engine (amp/checkpoint.h): a frame per checkpointed call, whose saved-tensor
// hooks keep no tensor in the forward and rebuild them all in backward by running the function
// again under the forward's autocast, float8 and RNG state; then the frame hands each tensor to
// the autograd node that asks for it, once per backward. The structure follows Python's
// non-reentrant torch.utils.checkpoint: holders in the forward, a recomputation per graph task,
// early stop, and the determinism check.
#include <amp/checkpoint.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <amp/autocast.h>

#include "checkpoint/recompute_context.h"
#include "checkpoint/saved_tensor_hooks.h"

namespace amp {
namespace detail {
namespace {

// Thrown by the recomputation's pack hook once every tensor backward needs exists (early stop).
struct StopRecomputation {};

// What a saved tensor looked like in the forward (the default determinism check).
struct TensorMetadata {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  c10::Device device;

  explicit TensorMetadata(const at::Tensor& t)
      : sizes(t.sizes().vec()), dtype(t.scalar_type()), device(t.device()) {}
  bool operator==(const TensorMetadata&) const = default;
};

std::ostream& operator<<(std::ostream& out, const TensorMetadata& m) {
  return out << "shape " << c10::IntArrayRef(m.sizes) << ", dtype " << m.dtype << ", device "
             << m.device;
}

// One tensor the forward saved for backward: its place in the forward's order, and per graph
// task whether the node that saved it has taken it back already.
struct Holder {
  size_t index = 0;
  std::unordered_map<int64_t, bool> taken;
};

// The RNG states a recomputation starts from: the CPU generator's and those of the CUDA devices
// of the tensor arguments.
struct RngStates {
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> devices;
};

// A Generator is a shared handle: the copy locks and reads the generator itself.
at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngStates capture_rng(const std::vector<c10::Device>& devices) {
  RngStates states;
  states.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  for (const c10::Device& device : devices) {
    states.devices.emplace_back(device,
                                generator_state(at::globalContext().defaultGenerator(device)));
  }
  return states;
}

void restore_rng(const RngStates& states) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), states.cpu);
  for (const auto& [device, state] : states.devices) {
    set_generator_state(at::globalContext().defaultGenerator(device), state);
  }
}

// One device type's autocast state, as torch.utils.checkpoint captures it.
struct AutocastState {
  c10::DeviceType device;
  bool enabled;
  c10::ScalarType dtype;
};

// Counts the ids of unpacks outside any backward (a user reading saved tensors): each is a
// recomputation of its own, as Python's fresh uuid.
std::atomic<int64_t> next_outside_id{-2};

class Frame;
thread_local std::vector<std::pair<Frame*, bool /*recomputing*/>> active_frames;

// register_recomputed_state's list: filled by static initializers before any checkpoint runs.
std::vector<CaptureState>& recomputed_states() {
  static std::vector<CaptureState> states;
  return states;
}

// What autograd saves while a frame's function runs: in the forward, a holder and no tensor; in
// the recomputation, the tensor itself, handed to the holder of the same position.
class Frame : public std::enable_shared_from_this<Frame> {
 public:
  Frame(const CheckpointOptions& options, std::function<void(const std::vector<at::Tensor>&)> fn)
      : options_(options), recompute_(std::move(fn)) {}

  void capture(const std::vector<at::Tensor>& tensor_args,
               const std::vector<c10::Device>& rng_devices) {
    for (const at::Tensor& t : tensor_args) {
      // Saved as any tensor saved for backward: an enclosing checkpoint's hooks drop it too.
      inputs_.emplace_back(t, /*is_output=*/false);
    }
    if (options_.preserve_rng_state()) {
      // The CPU's generator always; of the others, those with a default generator here (CUDA).
      std::vector<c10::Device> devices;
      for (const c10::Device& d : rng_devices) {
        if (d.is_cuda()) devices.push_back(d);
      }
      rng_ = capture_rng(devices);
    }
    for (c10::DeviceType device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
      autocast_.push_back({device, at::autocast::is_autocast_enabled(device),
                           at::autocast::get_autocast_dtype(device)});
    }
    cache_enabled_ = at::autocast::is_autocast_cache_enabled();
    for (const CaptureState& capture : recomputed_states()) reenter_.push_back(capture());
  }

  // The forward's pack hook: a holder, no tensor.
  std::shared_ptr<Holder> hold(const at::Tensor& tensor) {
    auto holder = std::make_shared<Holder>();
    holder->index = holders_.size();
    holders_.push_back(holder);
    if (options_.determinism_check() == DeterminismCheck::kDefault) {
      metadata_.emplace_back(tensor);
    }
    return holder;
  }

  // The recomputation's pack hook: hands `tensor` to its holder, and returns what the
  // recomputation's own graph keeps of it (a backward inside the checkpointed function runs
  // through that graph).
  at::Tensor rebuilt(const at::Tensor& tensor) {
    at::Tensor kept = tensor.requires_grad() ? tensor.detach() : tensor;
    const size_t index = counter_[gid_]++;
    if (index >= holders_.size()) {
      if (!forward_completed_) {
        // A backward inside the checkpointed function, during its forward: the recomputation
        // that serves it runs past what the forward has saved so far (Python's rule 6).
        ignore_mismatch_ = true;
        return kept;
      }
      TORCH_CHECK(false,
                  "amp::checkpoint: the recomputation saved more tensors for backward than the "
                  "forward did (",
                  holders_.size(),
                  "); the checkpointed function must run the same operations both times (no "
                  "branch on state that changes between forward and backward).");
    }
    // A holder already freed (a backward inside the function, without retain_graph, released it)
    // needs nothing.
    if (auto holder = holders_[index].lock()) {
      holder->taken[gid_] = false;
      recomputed_[gid_][index] = kept;
    }
    if (options_.early_stop() && counter_[gid_] == holders_.size()) throw StopRecomputation{};
    return kept;
  }

  // The forward's unpack hook: the tensor of `holder` for the running backward.
  at::Tensor take(Holder& holder) {
    int64_t gid = torch::autograd::get_current_graph_task_id();
    if (gid == -1) gid = next_outside_id.fetch_sub(1);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recomputed_gids_.count(gid)) {
      recompute(gid);
      recomputed_gids_.insert(gid);
      check_recomputed(gid);
    }
    const auto taken = holder.taken.find(gid);
    TORCH_CHECK(taken != holder.taken.end(), "amp::checkpoint: tensor ", holder.index, " of the ",
                holders_.size(),
                " the forward saved for backward was not rebuilt by the recomputation; the "
                "checkpointed function must run the same operations both times.");
    TORCH_CHECK(!taken->second,
                "amp::checkpoint: a tensor the checkpointed function saved for backward was "
                "unpacked a second time in one backward. A custom autograd function's backward "
                "must read its saved variables once.");
    taken->second = true;
    auto& tensors = recomputed_[gid];
    at::Tensor tensor = std::move(tensors.at(holder.index));
    tensors.erase(holder.index);
    return tensor;
  }

  void forward_completed() { forward_completed_ = true; }
  std::optional<at::Tensor> replay(const char* what) {
    TORCH_CHECK(replay_cursor_ < recorded_.size(), "amp::checkpoint: the recomputation makes more ",
                what, " (", recorded_.size() + 1,
                " so far) than the forward did; the checkpointed function must run the same "
                "layers both times.");
    return recorded_[replay_cursor_++];
  }
  void record(const at::Tensor& value) { recorded_.push_back(value); }

 private:
  void recompute(int64_t gid) {
    std::vector<at::Tensor> inputs;
    inputs.reserve(inputs_.size());
    // LibTorch's version check: an argument modified in place since the forward is an error.
    for (const auto& saved : inputs_) inputs.push_back(saved.unpack());
    std::optional<RngStates> after;
    if (rng_) {
      std::vector<c10::Device> devices;
      for (const auto& [device, state] : rng_->devices) devices.push_back(device);
      after = capture_rng(devices);
      restore_rng(*rng_);
    }
    gid_ = gid;
    replay_cursor_ = 0;
    try {
      std::vector<std::unique_ptr<AutocastGuard>> autocast;
      for (const AutocastState& state : autocast_) {
        // A CUDA region only where the forward's or the current state needs one (a disabled
        // region on a machine without CUDA would only warn).
        if (state.device == c10::DeviceType::CUDA && !state.enabled &&
            !at::autocast::is_autocast_enabled(state.device)) {
          continue;
        }
        autocast.push_back(std::make_unique<AutocastGuard>(AutocastOptions(state.device)
                                                               .dtype(state.dtype)
                                                               .enabled(state.enabled)
                                                               .cache_enabled(cache_enabled_)));
      }
      std::vector<std::shared_ptr<void>> reentered;
      for (const ReenterState& reenter : reenter_) reentered.push_back(reenter());
      at::AutoGradMode grad(true);
      RecomputeProvider provider(*this);
      SavedTensorHooksScope hooks(provider);
      active_frames.emplace_back(this, true);
      try {
        recompute_(inputs);
      } catch (const StopRecomputation&) {
      } catch (...) {
        active_frames.pop_back();
        throw;
      }
      active_frames.pop_back();
    } catch (...) {
      if (after) restore_rng(*after);
      throw;
    }
    if (after) restore_rng(*after);
  }

  // Python's check_recomputed_tensors_match: the count always (its "none" only skips the
  // metadata), the shape, dtype and device of each tensor under kDefault.
  void check_recomputed(int64_t gid) {
    if (ignore_mismatch_) return;
    TORCH_CHECK(counter_[gid] == holders_.size(), "amp::checkpoint: the forward saved ",
                holders_.size(), " tensors for backward and the recomputation ", counter_[gid],
                "; the checkpointed function must run the same operations both times (no branch "
                "on state that changes between forward and backward). determinism_check does "
                "not relax this: kNone skips only the comparison of shapes, dtypes and devices.");
    if (options_.determinism_check() == DeterminismCheck::kNone) return;
    std::ostringstream different;
    for (size_t index = 0; index < holders_.size(); ++index) {
      if (holders_[index].expired()) continue;
      const TensorMetadata recomputed(recomputed_[gid].at(index));
      if (!(recomputed == metadata_[index])) {
        different << "\n  tensor " << index << ": " << metadata_[index] << " in the forward, "
                  << recomputed << " in the recomputation";
      }
    }
    TORCH_CHECK(different.str().empty(),
                "amp::checkpoint: tensors saved for backward differ between the forward and the "
                "recomputation:",
                different.str(),
                "\nThe checkpointed function must compute the same thing both times (or pass "
                "CheckpointOptions().determinism_check(amp::DeterminismCheck::kNone)).");
  }

  // The recomputation's hooks: each saved tensor goes to the frame, and the recomputation's own
  // graph keeps it too, for a backward inside the checkpointed function; that graph, and with it
  // the tensor, dies when the recomputation returns.
  class RecomputeHooks final : public torch::autograd::SavedVariableHooks {
   public:
    explicit RecomputeHooks(Frame& frame) : frame_(frame) {}
    void call_pack_hook(const at::Tensor& tensor) override { kept_ = frame_.rebuilt(tensor); }
    // A backward through the recomputation's own graph: a backward inside the checkpointed
    // function (Python's rule 6). The graph dies with the recomputation.
    at::Tensor call_unpack_hook() override { return kept_; }

   private:
    Frame& frame_;
    at::Tensor kept_;
  };

  class RecomputeProvider final : public SavedTensorHooksProvider {
   public:
    explicit RecomputeProvider(Frame& frame) : frame_(frame) {}
    std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
      return std::make_unique<RecomputeHooks>(frame_);
    }

   private:
    Frame& frame_;
  };

  const CheckpointOptions options_;
  const std::function<void(const std::vector<at::Tensor>&)> recompute_;
  std::vector<torch::autograd::SavedVariable> inputs_;
  std::optional<RngStates> rng_;
  std::vector<AutocastState> autocast_;
  bool cache_enabled_ = true;
  // The registered states of the layers above (recompute_context.h), as the forward saw them.
  std::vector<ReenterState> reenter_;
  std::vector<std::weak_ptr<Holder>> holders_;
  std::vector<TensorMetadata> metadata_;
  bool forward_completed_ = false;
  bool ignore_mismatch_ = false;
  // Per graph task: the recomputed tensors by holder index, and how many the recomputation saved.
  std::unordered_map<int64_t, std::unordered_map<size_t, at::Tensor>> recomputed_;
  std::unordered_map<int64_t, size_t> counter_;
  std::unordered_set<int64_t> recomputed_gids_;
  int64_t gid_ = 0;                   // of the recomputation running
  std::vector<at::Tensor> recorded_;  // record_for_recomputation's values, in order
  size_t replay_cursor_ = 0;
  std::mutex mutex_;
};

// The forward's hooks of one saved tensor: the frame (kept alive by every tensor it dropped)
// and the tensor's holder.
class CheckpointHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit CheckpointHooks(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  void call_pack_hook(const at::Tensor& tensor) override { holder_ = frame_->hold(tensor); }
  at::Tensor call_unpack_hook() override { return frame_->take(*holder_); }

 private:
  std::shared_ptr<Frame> frame_;
  std::shared_ptr<Holder> holder_;
};

class ForwardProvider final : public SavedTensorHooksProvider {
 public:
  explicit ForwardProvider(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<CheckpointHooks>(frame_);
  }

 private:
  std::shared_ptr<Frame> frame_;
};

}  // namespace

bool register_recomputed_state(CaptureState capture) {
  recomputed_states().push_back(std::move(capture));
  return true;
}

std::optional<at::Tensor> replayed_in_recomputation(const char* what) {
  // The innermost recomputation replays, whatever checkpoints its function opens again.
  for (auto it = active_frames.rbegin(); it != active_frames.rend(); ++it) {
    if (it->second) return it->first->replay(what);
  }
  return std::nullopt;
}

void record_for_recomputation(const at::Tensor& value) {
  // Every enclosing checkpointed forward records it: each replays its whole function's values.
  for (auto& [frame, recomputing] : active_frames) {
    if (!recomputing) frame->record(value);
  }
}

void run_checkpointed(const CheckpointOptions& options, const std::vector<at::Tensor>& tensor_args,
                      const std::vector<c10::Device>& rng_devices,
                      std::function<void(const std::vector<at::Tensor>&)> recompute,
                      const std::function<void()>& forward) {
  if (!at::GradMode::is_enabled()) {
    forward();  // nothing is saved for backward: nothing to drop
    return;
  }
  auto frame = std::make_shared<Frame>(options, std::move(recompute));
  frame->capture(tensor_args, rng_devices);
  {
    ForwardProvider provider(frame);
    SavedTensorHooksScope hooks(provider);
    active_frames.emplace_back(frame.get(), false);
    try {
      forward();
    } catch (...) {
      active_frames.pop_back();
      throw;
    }
    active_frames.pop_back();
  }
  frame->forward_completed();
}

}  // namespace detail

at::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options) {
  const auto count = static_cast<int64_t>(sequential->size());
  TORCH_CHECK(segments >= 1 && segments <= count,
              "amp::checkpoint_sequential: segments must be in [1, ", count,
              "] (the number of modules of the Sequential). Got segments=", segments, ".");
  const int64_t size = count / segments;
  // Modules [begin, end] of the Sequential applied in turn; each segment keeps the Sequential
  // (a shared holder) for its recomputation, whatever happens to the caller's reference.
  const auto run = [&sequential](int64_t begin, int64_t end) {
    return [held = sequential, begin, end](at::Tensor x) mutable {
      for (int64_t i = begin; i <= end; ++i) x = held->begin()[i].forward(x);
      return x;
    };
  };
  at::Tensor x = input;
  int64_t end = -1;
  for (int64_t begin = 0; begin < size * (segments - 1); begin += size) {
    end = begin + size - 1;
    x = checkpoint(options, run(begin, end), x);
  }
  return run(end + 1, count - 1)(x);
}

CheckpointWrapperImpl::CheckpointWrapperImpl(torch::nn::AnyModule module, CheckpointOptions options)
    : module_(std::move(module)), options_(options) {
  TORCH_CHECK(!module_.is_empty(),
              "amp::CheckpointWrapper: the module to wrap is empty; pass a module holder.");
  register_module("module", module_.ptr());
}

at::Tensor CheckpointWrapperImpl::forward(const at::Tensor& input) {
  return checkpoint(
      options_, [module = module_](const at::Tensor& x) mutable { return module.forward(x); },
      input);
}

void CheckpointWrapperImpl::pretty_print(std::ostream& stream) const {
  stream << "amp::CheckpointWrapper(";
  module_.ptr()->pretty_print(stream);
  stream << ")";
}

std::shared_ptr<torch::nn::Module> CheckpointWrapperImpl::clone(
    const std::optional<torch::Device>& device) const {
  return std::make_shared<CheckpointWrapperImpl>(module_.clone(device), options_);
}

void CheckpointWrapperImpl::clone_(torch::nn::Module& other,
                                   const std::optional<torch::Device>& device) {
  auto* wrapper = dynamic_cast<CheckpointWrapperImpl*>(&other);
  TORCH_CHECK(wrapper != nullptr, "amp::CheckpointWrapper: cannot become a clone of a ",
              other.name(), "; a Cloneable module's reset() must build the same submodules.");
  *this = static_cast<const CheckpointWrapperImpl&>(*wrapper->clone(device));
}

void CheckpointWrapperImpl::save(torch::serialize::OutputArchive& archive) const {
  module_.ptr()->save(archive);
}

void CheckpointWrapperImpl::load(torch::serialize::InputArchive& archive) {
  const auto& wrapped = *module_.ptr();
  // amp 0.1 wrote the wrapped module one level down, under "module" (a name the wrapped module
  // may also use for a child of its own, which then takes precedence).
  if (!wrapped.named_children().contains("module") &&
      !wrapped.named_parameters(false).contains("module") &&
      !wrapped.named_buffers(false).contains("module")) {
    torch::serialize::InputArchive nested;
    if (archive.try_read("module", nested)) {
      module_.ptr()->load(nested);
      return;
    }
  }
  module_.ptr()->load(archive);
}

}  // namespace amp
