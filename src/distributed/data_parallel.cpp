// amp::distributed::DistributedDataParallel: Python's DDP wrapper around c10d::Reducer, in C++:
// the construction-time checks and broadcast, and the per-forward protocol (the comm hooks are in
// ddp_comm_hooks.cpp, the outputs' sink in ddp_sink.cpp).
#include <amp/distributed.h>

#include <amp/detail/buffer_roles.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/embedding.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "distributed/collective.h"
#include "distributed/ddp_parts.h"

namespace amp::distributed {

namespace {

// The buffers below `module` that rank 0 broadcasts: all but those their module declares
// rank-local (a float8 layer's delayed-scaling histories and scales, each rank's own as in
// Transformer Engine). Each buffer once, in module order.
std::vector<at::Tensor> broadcast_buffers(torch::nn::Module& module) {
  std::vector<at::Tensor> buffers;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& named : module.named_modules()) {
    const torch::nn::Module& owner = *named.value();
    for (const auto& buffer : owner.named_buffers(/*recurse=*/false)) {
      if (amp::detail::rank_local_buffer(owner, buffer.key())) continue;
      if (seen.insert(buffer.value().unsafeGetTensorImpl()).second) {
        buffers.push_back(buffer.value());
      }
    }
  }
  return buffers;
}

constexpr const char* kWho = detail::kDdpName;
// Python's DDP broadcasts the initial state in chunks of this many bytes.
constexpr size_t kBroadcastBucketBytes = 250 * 1024 * 1024;
constexpr double kBytesPerMiB = 1024.0 * 1024.0;

// What the ranks must agree on: the parameter count, the element count and a hash of the
// shapes and dtypes (kept below 2^52 to survive the exchange as a double exactly).
std::vector<double> model_signature(const std::vector<at::Tensor>& parameters) {
  int64_t elements = 0;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over (dtype, rank, sizes...)
  const auto mix = [&hash](int64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= static_cast<uint64_t>(value >> (8 * byte)) & 0xffu;
      hash *= 1099511628211ull;
    }
  };
  for (const auto& p : parameters) {
    elements += p.numel();
    mix(static_cast<int64_t>(p.scalar_type()));
    mix(p.dim());
    for (const int64_t size : p.sizes()) mix(size);
  }
  return {static_cast<double>(parameters.size()), static_cast<double>(elements),
          static_cast<double>(hash & ((uint64_t{1} << 52) - 1))};
}

std::string format_signature(size_t index, double value) {
  std::ostringstream out;
  if (index == 2) {
    out << std::hex << "0x" << static_cast<uint64_t>(value);
  } else {
    out << static_cast<int64_t>(value);
  }
  return out.str();
}

// The parameters wrapped by a live DistributedDataParallel: a second wrapper over any of them
// would add a second set of Reducer hooks and reduce each gradient twice.
std::mutex wrapped_mutex;
std::unordered_set<const c10::TensorImpl*>& wrapped_parameters() {
  static std::unordered_set<const c10::TensorImpl*> wrapped;
  return wrapped;
}

// The Reducer's own errors (PyTorch's sentences, which speak of Python's keyword arguments),
// prefixed with the rank and, for the unused-parameter error without find_unused_parameters, the
// C++ spelling of the fix.
[[noreturn]] void rethrow_reducer_error(const c10::Error& error, const c10d::ProcessGroup& group,
                                        bool finding_unused) {
  const std::string text = error.what_without_backtrace();
  const bool unfinished =
      !finding_unused && text.find("Expected to have finished reduction") != std::string::npos;
  TORCH_CHECK(false, kWho, " on rank ", group.getRank(), " of ", group.getSize(), ": ", text,
              unfinished ? "\nWith amp: DistributedDataParallelOptions().find_unused_parameters("
                           "true), and return every output of the model from the callable passed "
                           "to forward()."
                         : "");
}

// c10d's Reducer, plus whether a synced forward is still waiting for its backward (the flag
// prepare_for_backward sets and finalize_backward clears) and a way to give that backward up.
class ObservedReducer final : public c10d::Reducer {
 public:
  using c10d::Reducer::Reducer;
  bool backward_pending() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return expect_autograd_hooks_;
  }
  // The synced forward's backward can no longer run (its graph is gone): its gradients' hooks
  // stop counting, as if it had never been prepared. The next prepare_for_backward resets the
  // rest, as after any iteration.
  void abandon_pending_backward() {
    std::lock_guard<std::mutex> lock(mutex_);
    expect_autograd_hooks_ = false;
  }
};

ObservedReducer& observed(const std::shared_ptr<c10d::Reducer>& reducer) {
  return static_cast<ObservedReducer&>(*reducer);
}

// A weak reference to an autograd node, for LibTorch versions whose nodes are shared_ptr (2.11)
// and those whose nodes are intrusive_ptr (2.14).
template <typename T>
std::function<bool()> alive_while(const std::shared_ptr<T>& node) {
  return [weak = std::weak_ptr<T>(node)] { return !weak.expired(); };
}
template <typename T>
std::function<bool()> alive_while(const c10::intrusive_ptr<T>& node) {
  return [weak = c10::weak_intrusive_ptr<T>(node)] { return !weak.expired(); };
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 DistributedDataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  TORCH_CHECK(module_ != nullptr, kWho, ": module is null; pass the model to train.");
  detail::check_group(group_, kWho);
  for (const auto& [name, cap] :
       {std::pair{"bucket_cap_mb", options_.bucket_cap_mb()},
        std::pair{"first_bucket_cap_mb", options_.first_bucket_cap_mb()}}) {
    TORCH_CHECK(!cap || (*cap > 0 && *cap * kBytesPerMiB < 9.0e18), kWho, ": ", name,
                " must be > 0 (MiB) and below 8e12; got ", cap.value_or(0),
                ". DDP's defaults are 25 and 1.");
  }

  // The parameters DDP reduces: those that require gradients, module by module in preorder,
  // each module's own in registration order, shared ones once.
  std::unordered_map<size_t, std::string> names;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module_->named_modules()) {
    const std::string& prefix = item.key();
    const auto& submodule = item.value();
    const auto* embedding = dynamic_cast<const torch::nn::EmbeddingImpl*>(submodule.get());
    const auto* embedding_bag = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(submodule.get());
    for (const auto& param : submodule->named_parameters(/*recurse=*/false)) {
      const at::Tensor& p = param.value();
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      const std::string name = prefix.empty() ? param.key() : prefix + "." + param.key();
      TORCH_CHECK((embedding == nullptr || !embedding->options.sparse()) &&
                      (embedding_bag == nullptr || !embedding_bag->options.sparse()),
                  kWho, ": '", name,
                  "' belongs to an Embedding or EmbeddingBag with sparse=true; sparse gradients "
                  "are not supported. Use sparse(false) in its options.");
      TORCH_CHECK(p.layout() == at::kStrided, kWho, ": parameter '", name, "' has layout ",
                  p.layout(), "; only dense (strided) parameters are supported.");
      TORCH_CHECK(at::isFloatingType(p.scalar_type()), kWho, ": parameter '", name, "' has dtype ",
                  p.scalar_type(), "; only floating-point parameters have gradients to average.");
      if (!parameters_.empty()) {
        TORCH_CHECK(p.device() == parameters_.front().device(), kWho, ": parameter '", name,
                    "' is on ", p.device(), " but '", names.at(0), "' is on ",
                    parameters_.front().device(),
                    "; DistributedDataParallel reduces a module on one device per process.");
      }
      names.emplace(parameters_.size(), name);
      parameters_.push_back(p);
    }
  }
  TORCH_CHECK(!parameters_.empty(), kWho,
              ": the module has no parameters that require gradients, so there is nothing to "
              "reduce. Wrap the module you train (with requires_grad parameters).");
  const c10::DeviceType device_type = parameters_.front().device().type();
  detail::check_group_serves(group_, device_type, kWho, "the module's parameters");
  {
    // Checked and claimed under one lock; released again if the rest of construction throws.
    std::lock_guard<std::mutex> lock(wrapped_mutex);
    for (size_t i = 0; i < parameters_.size(); ++i) {
      TORCH_CHECK(!wrapped_parameters().count(parameters_[i].unsafeGetTensorImpl()), kWho,
                  ": parameter '", names.at(i),
                  "' is already wrapped by another DistributedDataParallel, which would reduce "
                  "its gradient twice. Wrap a module once (destroy the first wrapper before "
                  "making another).");
    }
    for (const auto& p : parameters_) wrapped_parameters().insert(p.unsafeGetTensorImpl());
  }
  try {
    initialize(std::move(names));
  } catch (...) {
    release_parameters();
    throw;
  }
}

void DistributedDataParallel::initialize(std::unordered_map<size_t, std::string> names) {
  const c10::DeviceType device_type = parameters_.front().device().type();

  // Every rank holds the same parameters: a sentence naming what differs, on every rank.
  if (group_->getSize() > 1) {
    const auto rows = detail::exchange_values(
        *group_, detail::check_device(group_, device_type, kWho), model_signature(parameters_),
        "the DistributedDataParallel model check");
    const auto differences =
        detail::describe_differences(rows,
                                     {"the count of parameters that require gradients",
                                      "the element count", "the hash of shapes and dtypes"},
                                     &format_signature);
    if (!differences.empty()) {
      std::ostringstream message;
      message << kWho << ": the ranks' modules differ: ";
      for (size_t i = 0; i < differences.size(); ++i)
        message << (i > 0 ? "; " : "") << differences[i];
      message << ". Every rank must wrap the same model (same parameters, shapes, dtypes and "
                 "requires_grad flags, registered in the same order).";
      TORCH_CHECK(false, message.str());
    }
    // c10d's own check, parameter by parameter (names the first index that differs).
    c10d::verify_params_across_processes(group_, parameters_, std::nullopt);

    // Rank 0's state everywhere: every parameter (also those without requires_grad) and, with
    // broadcast_buffers, every buffer but the rank-local ones.
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> state;
    for (const auto& p : module_->parameters()) state.push_back(p.detach());
    if (options_.broadcast_buffers()) {
      for (const auto& b : broadcast_buffers(*module_)) state.push_back(b.detach());
    }
    if (!state.empty()) c10d::broadcast_coalesced(group_, state, kBroadcastBucketBytes, 0);
  }

  // Buckets as Python's wrapper plans them: one bucket for the first iteration unless unused
  // parameters are searched for (the Reducer then rebuilds them in the order gradients arrived),
  // handed over in reverse, the order backward produces them.
  const bool using_default_cap = !options_.bucket_cap_mb().has_value();
  const auto bucket_bytes =
      static_cast<int64_t>(options_.bucket_cap_mb().value_or(25.0) * kBytesPerMiB);
  const auto first_bucket_bytes = static_cast<int64_t>(
      options_.first_bucket_cap_mb() ? *options_.first_bucket_cap_mb() * kBytesPerMiB
                                     : (using_default_cap ? double{c10d::kDefaultFirstBucketBytes}
                                                          : static_cast<double>(bucket_bytes)));
  std::vector<size_t> limits;
  if (options_.static_graph() || !options_.find_unused_parameters()) {
    limits = {static_cast<size_t>(std::numeric_limits<int64_t>::max())};
  } else if (first_bucket_bytes < bucket_bytes) {
    limits = {static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)};
  } else {
    limits = {static_cast<size_t>(bucket_bytes)};
  }
  const std::vector<bool> expect_sparse(parameters_.size(), false);
  auto assignment =
      std::get<0>(c10d::compute_bucket_assignment_by_size(parameters_, limits, expect_sparse));
  std::reverse(assignment.begin(), assignment.end());
  reducer_ = std::make_shared<ObservedReducer>(
      parameters_, std::move(assignment), group_, expect_sparse, bucket_bytes,
      options_.find_unused_parameters(), options_.gradient_as_bucket_view(), std::move(names),
      first_bucket_bytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  logger_ = std::make_shared<c10d::Logger>(reducer_);
  reducer_->set_logger(logger_);
  if (options_.static_graph()) {
    reducer_->set_static_graph();
    logger_->set_static_graph();
  }
}

void DistributedDataParallel::release_parameters() noexcept {
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const auto& p : parameters_) wrapped_parameters().erase(p.unsafeGetTensorImpl());
}

DistributedDataParallel::~DistributedDataParallel() { release_parameters(); }

void DistributedDataParallel::register_comm_hook(std::unique_ptr<c10d::CommHookInterface> hook) {
  TORCH_CHECK(hook != nullptr, kWho, ": register_comm_hook got a null hook.");
  TORCH_CHECK(!forwarded_, kWho,
              ": register_comm_hook must be called before the first forward that prepared a "
              "backward; that backward's buckets were already given to the options' hook.");
  TORCH_CHECK(!hook_registered_, kWho,
              ": a comm hook is already registered; register_comm_hook may be called once.");
  reducer_->register_comm_hook(std::move(hook));
  hook_registered_ = true;
}

void DistributedDataParallel::zero_grad(bool set_to_none) {
  for (auto& p : parameters_) {
    at::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad.reset();
    } else {
      if (grad.grad_fn()) {
        grad = grad.detach();
      } else {
        grad.requires_grad_(false);
      }
      grad.zero_();
    }
  }
}

std::vector<std::vector<size_t>> DistributedDataParallel::buckets() const {
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (size_t i = 0; i < parameters_.size(); ++i) index[parameters_[i].unsafeGetTensorImpl()] = i;
  std::vector<std::vector<size_t>> result;
  for (const auto& bucket : reducer_->get_grad_buckets(/*return_zero_tensors=*/false)) {
    std::vector<size_t> members;
    for (const auto& p : bucket.getParameters())
      members.push_back(index.at(p.unsafeGetTensorImpl()));
    result.push_back(std::move(members));
  }
  return result;
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.require_backward_grad_sync_) {
  // PyTorch's Reducer learns a static graph from the first backward and all-reduces it when it
  // ends; under no_sync that backward fails inside the Reducer (an internal assert in Python).
  TORCH_CHECK(!ddp_.options_.static_graph() || *ddp_.static_graph_delay_queued_, kWho,
              ": no_sync() was entered before the first backward of a static_graph model. "
              "static_graph learns the graph (and reduces the gradients) in the first synced "
              "iteration; run the first forward and backward outside no_sync(), then accumulate.");
  TORCH_CHECK(!ddp_.abandon_dead_backward(), kWho,
              ": no_sync() was entered while the backward of a synced forward can still run (its "
              "outputs, or a loss computed from them, are alive), and that backward would "
              "all-reduce even inside no_sync(). Run that backward before entering no_sync(), "
              "or release those tensors (for example loss = at::Tensor()) if it will never run; "
              "for accumulation, enter no_sync() before the forward: { auto guard = "
              "ddp.no_sync(); ddp.forward(...); backward(); }.");
  ddp_.require_backward_grad_sync_ = false;
}

bool DistributedDataParallel::abandon_dead_backward() {
  auto& reducer = observed(reducer_);
  if (!reducer.backward_pending()) return false;
  for (const auto& alive : pending_graph_) {
    if (alive()) return true;
  }
  // A synced forward whose backward never ran (an evaluation forward with grad mode on, a batch
  // dropped after a non-finite loss) and never can: Python's wrapper would let the next backward,
  // even one inside no_sync(), all-reduce for it; here that expectation is dropped.
  reducer.abandon_pending_backward();
  pending_graph_.clear();
  return false;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.require_backward_grad_sync_ = previous_; }

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(*this); }

void DistributedDataParallel::begin_forward() {
  const bool grad = at::GradMode::is_enabled();
  // A synced forward whose backward can no longer run is given up before this forward prepares
  // (the buckets' rebuild refuses to run while a backward is expected).
  abandon_dead_backward();
  if (grad && require_backward_grad_sync_) {
    // The options' hook, unless the user registered one: at the first forward that prepares a
    // backward, so an evaluation forward first still allows register_comm_hook.
    if (!hook_registered_) {
      reducer_->register_comm_hook(detail::make_comm_hook(group_, options_.comm_hook()));
      hook_registered_ = true;
    }
    forwarded_ = true;
  }
  try {
    if (grad && require_backward_grad_sync_) reducer_->prepare_for_forward();
    // After the first iteration: buckets in the order the gradients arrived (one broadcast).
    if (grad) reducer_->rebuild_buckets();
  } catch (const c10::Error& error) {
    rethrow_reducer_error(error, *group_, options_.find_unused_parameters());
  }
  if (require_forward_param_sync_ && options_.broadcast_buffers() && group_->getSize() > 1) {
    std::vector<at::Tensor> buffers;
    std::vector<uint32_t> versions;
    for (const auto& b : broadcast_buffers(*module_)) {
      buffers.push_back(b.detach());
      versions.push_back(b._version());
    }
    if (!buffers.empty()) {
      at::NoGradGuard no_grad;
      c10d::broadcast_coalesced(group_, buffers, kBroadcastBucketBytes, 0);
      // As Python's _unsafe_preserve_version_counter: a buffer an earlier graph saved (say, in
      // eval mode) must not look modified in place to that graph's backward.
      for (size_t i = 0; i < buffers.size(); ++i) {
        c10::VariableVersion counter = torch::autograd::impl::version_counter(buffers[i]);
        counter.set_version(versions[i]);  // a copy shares the tensor's counter
      }
    }
  }
}

std::vector<at::Tensor> DistributedDataParallel::end_forward(std::vector<at::Tensor> outputs) {
  const bool grad = at::GradMode::is_enabled();
  if (grad && require_backward_grad_sync_) {
    require_forward_param_sync_ = true;
    try {
      // Outputs matter only when searching for unused parameters (a traversal of the graph);
      // undefined ones (an optional output left empty) are left out, as Python skips None.
      std::vector<at::Tensor> searched;
      if (options_.find_unused_parameters() && !options_.static_graph()) {
        for (const auto& output : outputs) {
          if (output.defined()) searched.push_back(output);
        }
      }
      reducer_->prepare_for_backward(searched);
    } catch (const c10::Error& error) {
      rethrow_reducer_error(error, *group_, options_.find_unused_parameters());
    }
  } else {
    require_forward_param_sync_ = false;
  }
  const bool static_first = options_.static_graph() && !*static_graph_delay_queued_;
  const bool finding_unused = options_.find_unused_parameters() && !options_.static_graph();
  if (grad && (static_first || finding_unused)) {
    std::vector<size_t> through;  // outputs with a graph; the others pass unchanged
    torch::autograd::variable_list graph_outputs;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad()) {
        through.push_back(i);
        graph_outputs.push_back(outputs[i]);
      }
    }
    if (!graph_outputs.empty()) {
      std::function<void()> on_backward;
      if (static_first) {
        // The first backward of a static graph reduces every bucket once it has finished.
        on_backward = [reducer = std::weak_ptr<c10d::Reducer>(reducer_),
                       queued = static_graph_delay_queued_] {
          if (queued->exchange(true)) return;
          torch::autograd::Engine::get_default_engine().queue_callback([reducer] {
            if (auto alive = reducer.lock()) alive->delay_all_reduce();
          });
        };
      }
      auto passed = detail::pass_through_sink(graph_outputs, std::move(on_backward));
      for (size_t k = 0; k < through.size(); ++k) outputs[through[k]] = passed[k];
    }
  }
  if (grad && require_backward_grad_sync_) {
    // What keeps this forward's backward possible: the outputs' graph nodes (a leaf output's
    // gradient accumulator), held by the outputs and anything computed from them.
    pending_graph_.clear();
    for (const auto& output : outputs) {
      if (!output.defined() || !output.requires_grad()) continue;
      if (output.grad_fn()) {
        pending_graph_.push_back(alive_while(output.grad_fn()));
      } else {
        pending_graph_.push_back(alive_while(torch::autograd::impl::grad_accumulator(output)));
      }
    }
  }
  return outputs;
}

}  // namespace amp::distributed
