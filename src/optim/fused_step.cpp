// Checks, buckets, per-device scaling tensors, option merging and archive reading shared by
// amp's fused optimizers.
#include "optim/fused_step.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace amp::optim::detail {

namespace {

std::string param_name(size_t group_index, size_t index) {
  return "parameter " + std::to_string(index) + " of group " + std::to_string(group_index);
}

void check_param(const at::Tensor& param, size_t group_index, size_t index, const char* optimizer,
                 bool capturable) {
  TORCH_CHECK(param.defined(), optimizer, ": ", param_name(group_index, index),
              " is an undefined tensor; pass the model's parameters.");
  TORCH_CHECK(at::isFloatingType(param.scalar_type()), optimizer, ": ",
              param_name(group_index, index), " has dtype ", param.scalar_type(),
              ", but ATen's fused optimizer kernels update floating-point parameters only "
              "(float32, float64, float16, bfloat16); leave it out of the optimizer.");
  const auto type = param.device().type();
  TORCH_CHECK(type == c10::kCPU || type == c10::kCUDA, optimizer, ": ",
              param_name(group_index, index), " is on ", param.device(),
              ", but amp's fused optimizers run on CPU and CUDA; use LibTorch's optimizers "
              "for other devices.");
  TORCH_CHECK(!capturable || type == c10::kCUDA, optimizer, ": ", param_name(group_index, index),
              " is on ", param.device(),
              ", but capturable(true) keeps the step state on the "
              "device for CUDA graph capture and needs CUDA parameters; use capturable(false) "
              "on the CPU.");
}

void check_finite_at_least(double value, double low, const char* name, const std::string& where,
                           const char* advice) {
  TORCH_CHECK(std::isfinite(value) && value >= low, where, ": ", name,
              " must be finite and >= ", low, ". Got ", name, "=", value, "; ", advice);
}

template <typename AdamOptions>
void check_adam(const AdamOptions& options, const std::string& where) {
  check_finite_at_least(options.lr(), 0.0, "lr", where, "pass a learning rate such as 1e-3.");
  check_finite_at_least(options.eps(), 0.0, "eps", where, "the default is 1e-8.");
  check_finite_at_least(options.weight_decay(), 0.0, "weight_decay", where,
                        "pass 0 for no weight decay.");
  const auto [beta1, beta2] = options.betas();
  TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, where,
              ": betas[0] must be in [0, 1). Got betas[0]=", beta1, "; the default is 0.9.");
  TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, where,
              ": betas[1] must be in [0, 1). Got betas[1]=", beta2, "; the default is 0.999.");
}

template <typename T>
T pick(const T& group, const T& constructor_default, const T& optimizer_default) {
  return group == constructor_default ? optimizer_default : group;
}

template <typename AdamOptions>
std::unique_ptr<torch::optim::OptimizerOptions> merge_adam(const AdamOptions& group,
                                                           const AdamOptions& defaults) {
  const AdamOptions fresh;
  auto merged = std::make_unique<AdamOptions>(group);
  merged->lr(pick(group.lr(), fresh.lr(), defaults.lr()))
      .betas(pick(group.betas(), fresh.betas(), defaults.betas()))
      .eps(pick(group.eps(), fresh.eps(), defaults.eps()))
      .weight_decay(pick(group.weight_decay(), fresh.weight_decay(), defaults.weight_decay()))
      .amsgrad(pick(group.amsgrad(), fresh.amsgrad(), defaults.amsgrad()))
      .maximize(pick(group.maximize(), fresh.maximize(), defaults.maximize()))
      .capturable(pick(group.capturable(), fresh.capturable(), defaults.capturable()));
  return merged;
}

std::unique_ptr<torch::optim::OptimizerOptions> merge_sgd(const FusedSGDOptions& group,
                                                          const FusedSGDOptions& defaults) {
  // lr has no constructor default in SGDOptions: a group always states its own.
  const FusedSGDOptions fresh(group.lr());
  auto merged = std::make_unique<FusedSGDOptions>(group);
  merged->momentum(pick(group.momentum(), fresh.momentum(), defaults.momentum()))
      .dampening(pick(group.dampening(), fresh.dampening(), defaults.dampening()))
      .weight_decay(pick(group.weight_decay(), fresh.weight_decay(), defaults.weight_decay()))
      .nesterov(pick(group.nesterov(), fresh.nesterov(), defaults.nesterov()))
      .maximize(pick(group.maximize(), fresh.maximize(), defaults.maximize()))
      .capturable(pick(group.capturable(), fresh.capturable(), defaults.capturable()));
  return merged;
}

}  // namespace

GroupWork collect_group(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                        const char* optimizer, bool capturable) {
  GroupWork work;
  std::optional<size_t> first;
  const auto& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& param = params[i];
    check_param(param, group_index, i, optimizer, capturable);
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    TORCH_CHECK(grad.layout() == c10::kStrided, optimizer, ": the gradient of ",
                param_name(group_index, i),
                " is sparse, and ATen's fused optimizer kernels "
                "take dense gradients only; use a dense gradient (e.g. torch::nn::Embedding "
                "with sparse(false)) or LibTorch's non-fused optimizer for this parameter.");
    TORCH_CHECK(grad.scalar_type() == param.scalar_type() && grad.device() == param.device() &&
                    grad.sizes() == param.sizes(),
                optimizer, ": the gradient of ", param_name(group_index, i), " is ",
                grad.scalar_type(), " ", grad.sizes(), " on ", grad.device(),
                " but the parameter is ", param.scalar_type(), " ", param.sizes(), " on ",
                param.device(), "; a gradient must match its parameter.");
    if (!first) {
      first = i;
      work.device = param.device();
    }
    TORCH_CHECK(param.device() == work.device, optimizer, ": ", param_name(group_index, i),
                " is on ", param.device(), " but ", param_name(group_index, *first), " is on ",
                work.device,
                "; the parameters of one group must share a device (make one "
                "param group per device).");
    auto bucket = std::find_if(work.params_by_dtype.begin(), work.params_by_dtype.end(),
                               [&](const auto& b) { return b.first == param.scalar_type(); });
    if (bucket == work.params_by_dtype.end()) {
      bucket = work.params_by_dtype.insert(work.params_by_dtype.end(), {param.scalar_type(), {}});
    }
    bucket->second.push_back(param);
  }
  return work;
}

void check_params(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                  const char* optimizer, bool capturable) {
  const auto& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    check_param(params[i], group_index, i, optimizer, capturable);
  }
}

void adopt_groups(torch::optim::Optimizer& optimizer,
                  std::vector<torch::optim::OptimizerParamGroup> groups) {
  for (auto& group : groups) {
    optimizer.add_param_group(group);
    optimizer.param_groups().back().set_options(group.options().clone());
  }
}

StepScaling::StepScaling(const SupportsAmpScaling& optimizer)
    : grad_scale_(optimizer.grad_scale()), found_inf_(optimizer.found_inf()) {}

std::optional<at::Tensor> StepScaling::on(const at::Tensor& source,
                                          std::vector<std::pair<c10::Device, at::Tensor>>& copies,
                                          const c10::Device& device) {
  if (!source.defined()) return std::nullopt;
  if (source.device() == device) return source;
  for (const auto& [dev, copy] : copies) {
    if (dev == device) return copy;
  }
  copies.emplace_back(device, source.to(device, /*non_blocking=*/true));
  return copies.back().second;
}

std::optional<at::Tensor> StepScaling::grad_scale(const c10::Device& device) {
  return on(grad_scale_, grad_scale_copies_, device);
}

std::optional<at::Tensor> StepScaling::found_inf(const c10::Device& device) {
  return on(found_inf_, found_inf_copies_, device);
}

const at::Tensor& capturable_lr(std::vector<std::pair<double, at::Tensor>>& cache,
                                size_t group_index, double lr, const c10::Device& device) {
  if (cache.size() <= group_index) cache.resize(group_index + 1);
  auto& [value, tensor] = cache[group_index];
  if (!tensor.defined() || tensor.device() != device) {
    tensor = at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(device));
    value = lr;
  } else if (value != lr) {
    tensor.fill_(lr);  // in place: a captured graph reads this address
    value = lr;
  }
  return tensor;
}

void sync_capturable_lrs(std::vector<std::pair<double, at::Tensor>>& cache,
                         const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (size_t g = 0; g < cache.size() && g < groups.size(); ++g) {
    if (cache[g].second.defined()) {
      capturable_lr(cache, g, groups[g].options().get_lr(), cache[g].second.device());
    }
  }
}

void check_adam_options(const FusedAdamOptions& options, const std::string& where) {
  check_adam(options, where);
}

void check_adam_options(const FusedAdamWOptions& options, const std::string& where) {
  check_adam(options, where);
}

void check_sgd_options(const FusedSGDOptions& options, const std::string& where) {
  check_finite_at_least(options.lr(), 0.0, "lr", where, "pass a learning rate such as 0.01.");
  check_finite_at_least(options.momentum(), 0.0, "momentum", where, "pass 0 for no momentum.");
  check_finite_at_least(options.weight_decay(), 0.0, "weight_decay", where,
                        "pass 0 for no weight decay.");
  TORCH_CHECK(std::isfinite(options.dampening()), where,
              ": dampening must be finite. Got dampening=", options.dampening(),
              "; the default is 0.");
  TORCH_CHECK(!options.nesterov() || (options.momentum() > 0.0 && options.dampening() == 0.0),
              where, ": Nesterov momentum requires a momentum and zero dampening. Got momentum=",
              options.momentum(), " and dampening=", options.dampening(),
              "; set momentum > 0 and dampening 0, or nesterov(false).");
}

std::unique_ptr<torch::optim::OptimizerOptions> merge_group_options(
    const torch::optim::OptimizerOptions& group, const torch::optim::OptimizerOptions& defaults) {
  if (const auto* g = dynamic_cast<const FusedAdamOptions*>(&group)) {
    if (const auto* d = dynamic_cast<const FusedAdamOptions*>(&defaults)) return merge_adam(*g, *d);
  }
  if (const auto* g = dynamic_cast<const FusedAdamWOptions*>(&group)) {
    if (const auto* d = dynamic_cast<const FusedAdamWOptions*>(&defaults))
      return merge_adam(*g, *d);
  }
  if (const auto* g = dynamic_cast<const FusedSGDOptions*>(&group)) {
    if (const auto* d = dynamic_cast<const FusedSGDOptions*>(&defaults)) return merge_sgd(*g, *d);
  }
  TORCH_CHECK(false, "a param group's options must be of the optimizer's own options type (",
              "FusedAdamOptions for FusedAdam, FusedAdamWOptions for FusedAdamW, FusedSGDOptions "
              "for FusedSGD); pass that type or leave the group's options out.");
}

double read_double(torch::serialize::InputArchive& archive, const char* key, bool required,
                   double fallback) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    TORCH_CHECK(!required, "the entry \"", key, "\" is missing");
    return fallback;
  }
  TORCH_CHECK(value.isDouble() || value.isInt(), "the entry \"", key, "\" is a ", value.tagKind(),
              ", not a number");
  return value.isDouble() ? value.toDouble() : static_cast<double>(value.toInt());
}

bool read_bool(torch::serialize::InputArchive& archive, const char* key, bool required,
               bool fallback) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    TORCH_CHECK(!required, "the entry \"", key, "\" is missing");
    return fallback;
  }
  TORCH_CHECK(value.isBool(), "the entry \"", key, "\" is a ", value.tagKind(), ", not a bool");
  return value.toBool();
}

at::Tensor read_tensor(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value;
  if (!archive.try_read(key, value)) return at::Tensor();
  TORCH_CHECK(value.isTensor(), "the entry \"", key, "\" is a ", value.tagKind(), ", not a tensor");
  return value.toTensor();
}

}  // namespace amp::optim::detail
