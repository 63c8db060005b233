// amp::distributed::GradientAllReduce: data-parallel gradient averaging in flat buckets, with
// optional float16/bfloat16 transfer.
#include <amp/distributed.h>

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "distributed/collective.h"

namespace amp::distributed {

namespace {

constexpr const char* kWho = "amp::distributed::GradientAllReduce";

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

}  // namespace

GradientAllReduce::GradientAllReduce(std::vector<at::Tensor> parameters,
                                     c10::intrusive_ptr<c10d::ProcessGroup> group,
                                     GradientAllReduceOptions options)
    : parameters_(std::move(parameters)), group_(std::move(group)), options_(std::move(options)) {
  TORCH_CHECK(options_.bucket_bytes() > 0, kWho, ": bucket_bytes must be > 0; got ",
              options_.bucket_bytes(), ". DDP's default is 25 MiB (25 * 1024 * 1024).");
  if (options_.comm_dtype()) {
    const at::ScalarType dtype = *options_.comm_dtype();
    TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, kWho,
                ": comm_dtype must be at::kHalf or at::kBFloat16 (or unset for the gradients' own "
                "dtype); got ",
                dtype, ".");
  }
  detail::check_group(group_, kWho);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& p = parameters_[i];
    TORCH_CHECK(p.defined(), kWho, ": parameter ", i,
                " is undefined; pass the model's "
                "parameters (module->parameters()).");
    TORCH_CHECK(p.layout() == at::kStrided, kWho, ": parameter ", i, " has layout ", p.layout(),
                "; only dense (strided) parameters are supported.");
    TORCH_CHECK(at::isFloatingType(p.scalar_type()), kWho, ": parameter ", i, " has dtype ",
                p.scalar_type(), "; only floating-point parameters have gradients to average.");
    detail::check_group_serves(group_, p.device().type(), kWho,
                               "parameter " + std::to_string(i) + "'s gradients");
  }

  // Buckets per (device, dtype), filled in reverse order of the parameters: backward produces
  // the last layers' gradients first, which is the order DDP reduces them in.
  std::map<std::pair<std::string, int>, size_t> open;  // key -> index into bucket_params_
  std::vector<int64_t> bucket_bytes_used;
  for (size_t k = parameters_.size(); k-- > 0;) {
    const at::Tensor& p = parameters_[k];
    const auto key = std::make_pair(p.device().str(), static_cast<int>(p.scalar_type()));
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    auto it = open.find(key);
    if (it != open.end() && bucket_bytes_used[it->second] + bytes > options_.bucket_bytes()) {
      open.erase(it);
      it = open.end();
    }
    if (it == open.end()) {
      it = open.emplace(key, bucket_params_.size()).first;
      bucket_params_.emplace_back();
      bucket_bytes_used.push_back(0);
    }
    bucket_params_[it->second].push_back(k);
    bucket_bytes_used[it->second] += bytes;
  }
  for (const auto& bucket : bucket_params_) {
    const at::Tensor& first = parameters_[bucket.front()];
    int64_t numel = 0;
    for (const size_t k : bucket) numel += parameters_[k].numel();
    bucket_buffers_.push_back(
        at::empty({numel}, first.options()
                               .dtype(options_.comm_dtype().value_or(first.scalar_type()))
                               .requires_grad(false)));
  }

  if (group_->getSize() > 1) {
    const c10::DeviceType on =
        parameters_.empty() ? c10::DeviceType::CPU : parameters_.front().device().type();
    const auto rows =
        detail::exchange_values(*group_, detail::check_device(group_, on, kWho),
                                model_signature(parameters_), "the GradientAllReduce model check");
    const auto differences = detail::describe_differences(
        rows, {"the parameter count", "the element count", "the hash of shapes and dtypes"},
        &format_signature);
    if (!differences.empty()) {
      std::ostringstream message;
      message << kWho << ": the ranks' parameters differ: ";
      for (size_t i = 0; i < differences.size(); ++i)
        message << (i > 0 ? "; " : "") << differences[i];
      message << ". Every rank must pass the same model's parameters in the same order.";
      TORCH_CHECK(false, message.str());
    }
  }
}

void GradientAllReduce::all_reduce_() {
  at::NoGradGuard no_grad;
  const int world = group_->getSize();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(bucket_params_.size());
  const auto what = [&](size_t b) {
    return "the gradient all-reduce of bucket " + std::to_string(b + 1) + " of " +
           std::to_string(bucket_params_.size());
  };
  for (size_t b = 0; b < bucket_params_.size(); ++b) {
    at::Tensor& flat = bucket_buffers_[b];
    int64_t offset = 0;
    for (const size_t k : bucket_params_[b]) {
      const at::Tensor& p = parameters_[k];
      at::Tensor slice = flat.narrow(0, offset, p.numel());
      const at::Tensor& grad = p.grad();
      if (grad.defined()) {
        TORCH_CHECK(!grad.is_sparse(), kWho, ": parameter ", k,
                    " has a sparse gradient; "
                    "only dense gradients are supported.");
        // Converts to the transfer dtype here: a value beyond float16's range becomes inf.
        slice.copy_(grad.reshape({-1}));
      } else {
        slice.zero_();
      }
      offset += p.numel();
    }
    // Divided before the sum (in the transfer dtype, as DDP's hooks do), so the sum cannot
    // overflow where the average would not.
    if (world > 1) flat.div_(world);
    std::vector<at::Tensor> tensors{flat};
    works.push_back(detail::start_all_reduce(*group_, tensors, c10d::ReduceOp::SUM, what(b)));
  }
  for (size_t b = 0; b < works.size(); ++b) detail::wait_for(works[b], *group_, what(b));
  for (size_t b = 0; b < bucket_params_.size(); ++b) {
    const at::Tensor& flat = bucket_buffers_[b];
    int64_t offset = 0;
    for (const size_t k : bucket_params_[b]) {
      at::Tensor& p = parameters_[k];
      const at::Tensor slice = flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slice);
      } else {
        p.mutable_grad() = slice.to(p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
      offset += p.numel();
    }
  }
}

}  // namespace amp::distributed
