// The worker's ZeroRedundancyOptimizer scenarios: zero_parity, the C++ side of
// parity/zero_parity.py (its docstring is the protocol).
#include "zero_worker.h"

#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <amp/autocast.h>
#include <amp/distributed/zero_redundancy_optimizer.h>
#include <amp/grad_scaler.h>
#include <amp/low_precision.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include "support/bits.h"

namespace amp_worker {

namespace {

using torch::optim::OptimizerParamGroup;

// zero_parity.py's Net, registered in the same order: fc1 -> relu -> fc2 -> relu, then fc3 plus a
// side head.
struct ZeroNet : torch::nn::Module {
  ZeroNet(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))),
        side(register_module("side", torch::nn::Linear(hidden, out))) {}
  // at::linear, as Python's F.linear (see worker.cpp's ParityNet).
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = at::relu(
        at::linear(at::relu(at::linear(x, fc1->weight, fc1->bias)), fc2->weight, fc2->bias));
    // In Python's order (C++ leaves the operands' order open): autograd's sequence numbers, and
    // with them the order DDP's buckets are rebuilt in, follow it.
    const at::Tensor main = at::linear(h, fc3->weight, fc3->bias);
    return main + at::linear(h, side->weight, side->bias);
  }
  torch::nn::Linear fc1, fc2, fc3, side;
};

// Python's repr() of a float: the shortest text that reads back, positional for exponents in
// [-4, 16), scientific otherwise, "1e-08" with at least two exponent digits, ".0" on integers.
std::string python_repr(double value) {
  char buffer[64];
  const auto sci =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string scientific(buffer, sci.ptr);
  const int exponent = std::atoi(scientific.c_str() + scientific.find('e') + 1);
  if (value != 0.0 && (exponent < -4 || exponent >= 16)) {
    const size_t e = scientific.find('e');
    std::string mantissa = scientific.substr(0, e);
    std::string digits = std::to_string(std::abs(exponent));
    if (digits.size() < 2) digits = "0" + digits;
    return mantissa + "e" + (exponent < 0 ? "-" : "+") + digits;
  }
  const auto fixed = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed);
  std::string text(buffer, fixed.ptr);
  if (text.find('.') == std::string::npos) text += ".0";
  return text;
}

// A group's FusedAdamW options, stating lr and (when given) weight_decay as Python's dict does.
std::unique_ptr<torch::optim::OptimizerOptions> adamw_group_options(
    double lr, std::optional<double> weight_decay) {
  amp::optim::FusedAdamWOptions options(lr);
  if (weight_decay) options.weight_decay(*weight_decay);
  return std::make_unique<amp::optim::FusedAdamWOptions>(options);
}

amp::distributed::ShardOptimizerFactory optimizer_factory(const ParityConfig& config) {
  const double lr = config.real("lr"), weight_decay = config.real("weight_decay");
  if (config.at("optim") == "adamw") {
    if (config.at("fused") != "1") {
      // Python's AdamW(foreach=False) arithmetic; LibTorch's own AdamW rounds differently.
      return amp::distributed::shard_optimizer<amp::optim::AdamW>(
          torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
    }
    return amp::distributed::shard_optimizer<amp::optim::FusedAdamW>(
        amp::optim::FusedAdamWOptions(lr).weight_decay(weight_decay));
  }
  if (config.at("fused") == "1") {
    return amp::distributed::shard_optimizer<amp::optim::FusedSGD>(
        amp::optim::FusedSGDOptions(lr)
            .momentum(config.real("momentum"))
            .weight_decay(weight_decay));
  }
  return amp::distributed::shard_optimizer<torch::optim::SGD>(
      torch::optim::SGDOptions(lr).momentum(config.real("momentum")).weight_decay(weight_decay));
}

std::string partition_line(const amp::distributed::ZeroRedundancyOptimizer& zero) {
  std::string line;
  for (const int64_t owner : zero.partition())
    line += (line.empty() ? "" : ",") + std::to_string(owner);
  return line;
}

// The consolidated state as zero_parity.py's state_lines prints it, by global index.
void print_consolidated(const torch::optim::Optimizer& whole, const ParityConfig& config) {
  int64_t index = 0;
  const auto print_tensor = [&](const std::string& key, const at::Tensor& t) {
    if (t.defined()) print("state." + std::to_string(index) + "." + key, hex(t));
  };
  for (size_t g = 0; g < whole.param_groups().size(); ++g) {
    const auto& group = whole.param_groups()[g];
    std::string line;
    for (size_t k = 0; k < group.params().size(); ++k) {
      line += (k ? "," : "") + std::to_string(index + static_cast<int64_t>(k));
    }
    // amp's FusedAdamWOptions and LibTorch's AdamWOptions (amp::optim::AdamW) alike.
    const auto adamw_line = [](const auto& adamw) {
      const auto [beta1, beta2] = adamw.betas();
      return ";lr=" + python_repr(adamw.lr()) +
             ";weight_decay=" + python_repr(adamw.weight_decay()) + ";beta1=" + python_repr(beta1) +
             ";beta2=" + python_repr(beta2) + ";eps=" + python_repr(adamw.eps());
    };
    if (const auto* adamw = dynamic_cast<const amp::optim::FusedAdamWOptions*>(&group.options())) {
      line += adamw_line(*adamw);
    } else if (const auto* unfused =
                   dynamic_cast<const torch::optim::AdamWOptions*>(&group.options())) {
      line += adamw_line(*unfused);
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&group.options())) {
      line += ";lr=" + python_repr(sgd->lr()) +
              ";weight_decay=" + python_repr(sgd->weight_decay()) +
              ";momentum=" + python_repr(sgd->momentum()) +
              ";dampening=" + python_repr(sgd->dampening());
    } else if (const auto* fused_sgd =
                   dynamic_cast<const amp::optim::FusedSGDOptions*>(&group.options())) {
      line += ";lr=" + python_repr(fused_sgd->lr()) +
              ";weight_decay=" + python_repr(fused_sgd->weight_decay()) +
              ";momentum=" + python_repr(fused_sgd->momentum()) +
              ";dampening=" + python_repr(fused_sgd->dampening());
    }
    print("group" + std::to_string(g), line);
    for (const auto& p : group.params()) {
      const auto found = whole.state().find(p.unsafeGetTensorImpl());
      if (found != whole.state().end()) {
        const auto* state = found->second.get();
        if (const auto* adam = dynamic_cast<const amp::optim::FusedAdamParamState*>(state)) {
          print_tensor("step", adam->step());
          print_tensor("exp_avg", adam->exp_avg());
          print_tensor("exp_avg_sq", adam->exp_avg_sq());
        } else if (const auto* unfused =
                       dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
          // LibTorch counts in an int64; Python's step is a float32 tensor.
          print_tensor("step", at::scalar_tensor(static_cast<double>(unfused->step()), at::kFloat));
          print_tensor("exp_avg", unfused->exp_avg());
          print_tensor("exp_avg_sq", unfused->exp_avg_sq());
        } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
          print_tensor("momentum_buffer", sgd->momentum_buffer());
        } else if (const auto* fsgd = dynamic_cast<const amp::optim::FusedSGDParamState*>(state)) {
          print_tensor("momentum_buffer", fsgd->momentum_buffer());
        }
      }
      ++index;
    }
  }
}

}  // namespace

void zero_parity(const amp::distributed::TorchrunEnv& env, const std::string& dir,
                 const ParityConfig& config) {
  namespace dist = amp::distributed;
  const int64_t steps = config.integer("steps"), batch = config.integer("batch"),
                in = config.integer("in"), hidden = config.integer("hidden"),
                out = config.integer("out");
  const std::string phase = config.at("phase");
  const int64_t start = phase == "second" ? steps : 0;
  const std::string checkpoint = dir + "/ckpt";
  // ckpt=swapped: phase second resumes from the other language's file (Python's torch.save dict
  // of model, consolidated optimizer and scaler state_dict()s), and phase first also writes amp's
  // twin of it for Python.
  const bool swapped = config.at("ckpt") == "swapped";
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto model = std::make_shared<ZeroNet>(in, hidden, out);
  c10::impl::GenericDict python_checkpoint(c10::StringType::get(), c10::AnyType::get());
  {
    at::NoGradGuard no_grad;
    if (phase == "second" && swapped) {
      // Every rank reads the whole file, as every Python rank does.
      python_checkpoint = amp::load_pickled(dir + "/torch_ckpt.pt").toGenericDict();
      amp::load_state_dict(*model, python_checkpoint.at("model"));
    } else if (phase == "second") {
      std::vector<at::Tensor> saved;
      torch::load(saved, checkpoint + "/model.pt");
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved.at(i));
    } else {
      const std::string mine = dir + "/rank" + std::to_string(env.rank) + "_";
      for (auto& named : model->named_parameters()) {
        named.value().copy_(
            read_raw(mine + named.key() + ".bin", named.value().sizes().vec(), at::kFloat));
      }
    }
  }
  if (config.at("frozen") != "none")
    model->named_parameters()[config.at("frozen")].requires_grad_(false);
  dist::DistributedDataParallel ddp(
      model, group,
      dist::DistributedDataParallelOptions().bucket_cap_mb(config.real("bucket_cap_mb")));
  std::vector<OptimizerParamGroup> groups;
  if (config.at("groups") == "1") {
    groups.emplace_back(std::vector<at::Tensor>{model->fc1->weight, model->fc1->bias,
                                                model->fc2->weight, model->fc2->bias});
    groups.emplace_back(
        std::vector<at::Tensor>{model->fc3->weight, model->fc3->bias},
        adamw_group_options(config.real("group1_lr"), config.real("group1_weight_decay")));
  } else {
    groups.emplace_back(model->parameters());
  }
  dist::ZeroRedundancyOptimizer zero(
      std::move(groups), optimizer_factory(config), group,
      dist::ZeroRedundancyOptimizerOptions().parameters_as_bucket_view(config.at("bucket_view") ==
                                                                       "1"));
  print("partition", partition_line(zero));
  // AMP_ZERO_UNSHARDED=1: the same optimizer unsharded, for comparing the two.
  const bool unsharded = std::getenv("AMP_ZERO_UNSHARDED") != nullptr;
  std::unique_ptr<torch::optim::Optimizer> plain;
  if (unsharded) {
    std::vector<OptimizerParamGroup> copies;
    for (const auto& g : zero.param_groups()) copies.emplace_back(g.params(), g.options().clone());
    plain = optimizer_factory(config)(std::move(copies));
  }
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions()
                             .init_scale(config.real("init_scale"))
                             .growth_interval(config.integer("growth_interval")));
  if (phase == "second" && swapped) {
    // The consolidated state of all parameters; each rank keeps its part, as Python's
    // ZeroRedundancyOptimizer.load_state_dict does.
    amp::load_optimizer_state_dict(zero, python_checkpoint.at("optim"));
    scaler.load_state_dict(python_checkpoint.at("scaler").toGenericDict());
  } else if (phase == "second") {
    zero.load_sharded(checkpoint);
    scaler.load_state_dict(checkpoint + "/scaler.pt");
  }
  const std::string prefix =
      dir + "/" + (phase == "second" ? "second_" : "") + "rank" + std::to_string(env.rank);
  const at::Tensor xs = read_raw(prefix + "_x.bin", {steps, batch, in}, at::kFloat);
  const at::Tensor ys = read_raw(prefix + "_y.bin", {steps, batch}, at::kLong);
  const bool bf16 = config.at("autocast") == "bf16";
  const bool flip = std::getenv("AMP_TEST_FLIP_BIT") != nullptr;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t k = start + i;
    if (config.at("add_group_at") != "none" && k == config.integer("add_group_at")) {
      zero.add_param_group(
          OptimizerParamGroup(std::vector<at::Tensor>{model->side->weight, model->side->bias},
                              adamw_group_options(config.real("side_lr"), std::nullopt)));
      print("partition.after_add", partition_line(zero));
    }
    model->zero_grad(/*set_to_none=*/true);
    at::Tensor output = ddp.forward([&] {
      std::optional<amp::AutocastGuard> autocast;
      if (bf16) autocast.emplace(c10::DeviceType::CPU, at::kBFloat16);
      return model->forward(xs[i]);
    });
    const at::Tensor loss = at::cross_entropy_loss(output.to(at::kFloat), ys[i]);
    scaler.scale(loss).backward();
    if (unsharded) {
      scaler.step(*plain);
    } else {
      scaler.step(zero);
    }
    scaler.update();
    if (flip && k == 2 && env.rank == 0) {
      at::NoGradGuard no_grad;
      model->fc1->weight.view(at::kInt).view({-1})[0].bitwise_xor_(1);
    }
    print("step" + std::to_string(k) + ".scale", hex(scaler.scale_tensor()));
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
    print("step" + std::to_string(k) + ".params", hex(at::cat(flat)));
  }
  // DDP's buckets (after its rebuild), in bytes, as zero_parity.py reports PyTorch's.
  std::string buckets, order;
  const auto params = model->parameters();
  for (const auto& bucket : ddp.buckets()) {
    int64_t bytes = 0;
    order += order.empty() ? "" : ", ";
    for (size_t k = 0; k < bucket.size(); ++k) {
      bytes += params[bucket[k]].numel() * params[bucket[k]].element_size();
      order += (k ? " " : "") + std::to_string(bucket[k]);
    }
    buckets += (buckets.empty() ? "" : ", ") + std::to_string(bytes);
  }
  print("ddp_buckets", buckets + " (params " + order + ")");
  zero.consolidate_state_dict(0);
  if (env.rank == 0) print_consolidated(zero.state_dict(), config);
  if (phase == "first") {
    zero.save_sharded(checkpoint);
    if (env.rank == 0) {
      std::vector<at::Tensor> params;
      for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
      torch::save(params, checkpoint + "/model.pt");
      scaler.save_state_dict(checkpoint + "/scaler.pt");
      if (swapped) {
        // The consolidated state; its groups name the inner optimizer's implementation, which
        // Python needs to continue with the same arithmetic.
        c10::impl::GenericDict file(c10::StringType::get(), c10::AnyType::get());
        file.insert("model", amp::state_dict(*model));
        file.insert("optim", amp::optimizer_state_dict(zero));
        file.insert("scaler", scaler.state_dict());
        amp::save_pickled(file, dir + "/amp_python_ckpt.pt");
      }
    }
    // The second phase starts once rank 0's files exist.
    group->barrier()->wait();
  }
}

namespace {

namespace dist = amp::distributed;

// Linear -> LayerNorm -> Linear (tiny: one Linear with two parameters).
struct SmallNet : torch::nn::Module {
  explicit SmallNet(bool tiny) {
    if (tiny) {
      fc1 = register_module("fc1", torch::nn::Linear(16, 1));
      return;
    }
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    fc2 = register_module("fc2", torch::nn::Linear(32, 8));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::linear(x.to(fc1->weight.scalar_type()), fc1->weight, fc1->bias);
    if (!norm) return h.to(at::kFloat);
    h = norm->forward(h.to(at::kFloat));
    return at::linear(h.to(fc2->weight.scalar_type()), fc2->weight, fc2->bias).to(at::kFloat);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

std::shared_ptr<SmallNet> small_net(const std::string& model) {
  at::manual_seed(11);
  auto net = std::make_shared<SmallNet>(model == "tiny");
  if (model == "mixed") amp::to_low_precision(*net, at::kBFloat16);
  if (model == "half") amp::to_low_precision(*net, at::kHalf);
  return net;
}

template <typename Options>
Options with_extra(Options options, const std::string& extra) {
  if (extra == "master" || extra == "master_unscale") options.master_weights(true);
  if (extra == "kahan") options.kahan_summation(true);
  if (extra == "sr") options.stochastic_rounding(true).rounding_seed(7);
  return options;
}

dist::ShardOptimizerFactory factory_for(const std::string& optimizer, const std::string& extra) {
  if (optimizer == "fused_adamw") {
    return dist::shard_optimizer<amp::optim::FusedAdamW>(
        with_extra(amp::optim::FusedAdamWOptions(1e-2).weight_decay(0.1), extra));
  }
  if (optimizer == "lion") {
    return dist::shard_optimizer<amp::optim::FusedLion>(
        with_extra(amp::optim::FusedLionOptions(1e-3).weight_decay(0.1), extra));
  }
  if (optimizer == "fused_sgd") {
    return dist::shard_optimizer<amp::optim::FusedSGD>(
        with_extra(amp::optim::FusedSGDOptions(0.1).momentum(0.9), extra));
  }
  if (optimizer == "torch_adamw") {
    return dist::shard_optimizer<torch::optim::AdamW>(
        torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  }
  if (optimizer == "torch_sgd") {
    return dist::shard_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  throw std::runtime_error("unknown optimizer " + optimizer);
}

bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!amp_test::same_bytes(a[i], b[i])) return false;
  }
  return true;
}

std::string fingerprint(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.detach().to(at::kFloat).reshape({-1}));
  return hex(at::cat(flat));
}

// The rank-r batch of step k: the same on every rank unless `per_rank`.
at::Tensor batch(int64_t step, int rank, bool per_rank) {
  at::manual_seed(1000 + step * 10 + (per_rank ? rank : 0));
  return at::randn({8, 16});
}

// Each entry of a state serialized, key by key.
std::map<std::string, c10::IValue> entries(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::stringstream buffer;
  out.save_to(buffer);
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  std::map<std::string, c10::IValue> values;
  for (const auto& key : in.keys()) in.try_read(key, values[key]);
  return values;
}

// Whether `a` and `b` (over parameters in the same order) hold the same state, bit for bit.
bool same_state(const torch::optim::Optimizer& a, const torch::optim::Optimizer& b) {
  std::vector<at::Tensor> pa, pb;
  for (const auto& g : a.param_groups()) pa.insert(pa.end(), g.params().begin(), g.params().end());
  for (const auto& g : b.param_groups()) pb.insert(pb.end(), g.params().begin(), g.params().end());
  if (pa.size() != pb.size() || a.state().size() != b.state().size()) return false;
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto fa = a.state().find(pa[i].unsafeGetTensorImpl());
    const auto fb = b.state().find(pb[i].unsafeGetTensorImpl());
    if ((fa == a.state().end()) != (fb == b.state().end())) return false;
    if (fa == a.state().end()) continue;
    const auto ea = entries(*fa->second), eb = entries(*fb->second);
    if (ea.size() != eb.size()) return false;
    for (const auto& [key, value] : ea) {
      const auto other = eb.find(key);
      if (other == eb.end()) return false;
      if (value.isTensor() != other->second.isTensor()) return false;
      if (value.isTensor() ? !same_bits({value.toTensor()}, {other->second.toTensor()})
                           : !(value == other->second)) {
        return false;
      }
    }
  }
  return true;
}

std::string partition_text(const dist::ZeroRedundancyOptimizer& zero) {
  std::string line;
  for (const int64_t owner : zero.partition())
    line += (line.empty() ? "" : ",") + std::to_string(owner);
  return line;
}

}  // namespace

void zero_equal(const dist::TorchrunEnv& env, const std::string& optimizer,
                const std::string& model, const std::string& extra, c10::DeviceType device) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto sharded = small_net(model);
  auto reference = small_net(model);
  sharded->to(device);
  reference->to(device);
  const auto factory = factory_for(optimizer, extra);
  dist::ZeroRedundancyOptimizer zero(sharded->parameters(), factory, group);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(reference->parameters());
  auto unsharded = factory(std::move(groups));
  print("partition", partition_text(zero));
  amp::GradScaler scaler_a(device, amp::GradScalerOptions().init_scale(256.0));
  amp::GradScaler scaler_b(device, amp::GradScalerOptions().init_scale(256.0));
  for (int64_t step = 0; step < 4; ++step) {
    if (step == 2) {
      // An lr schedule writes the whole model's groups; the shards step with the new lr.
      for (auto* optimizer : std::vector<torch::optim::Optimizer*>{&zero, unsharded.get()}) {
        auto& options = optimizer->param_groups()[0].options();
        options.set_lr(options.get_lr() * 0.25);
      }
    }
    const at::Tensor x = batch(step, env.rank, false).to(device);
    sharded->zero_grad();
    reference->zero_grad();
    scaler_a.scale(sharded->forward(x).pow(2).mean()).backward();
    scaler_b.scale(reference->forward(x).pow(2).mean()).backward();
    if (extra == "master_unscale") {
      // float16 gradients unscaled into float32 copies before the step.
      scaler_a.unscale_(zero);
      scaler_b.unscale_(*unsharded);
    }
    scaler_a.step(zero);
    scaler_b.step(*unsharded);
    scaler_a.update();
    scaler_b.update();
    print("step" + std::to_string(step) + ".equal",
          same_bits(sharded->parameters(), reference->parameters()) ? "1" : "0");
  }
  auto initial = small_net(model);
  initial->to(device);
  print("changed", same_bits(sharded->parameters(), initial->parameters()) ? "0" : "1");
  print("state_bytes", std::to_string(zero.state_bytes()));
  print("unsharded_state_bytes", std::to_string(dist::optimizer_state_bytes(*unsharded)));
  // The consolidated state is the unsharded optimizer's, entry for entry.
  zero.consolidate_state_dict(0);
  if (env.rank == 0) {
    const bool same = same_state(zero.state_dict(), *unsharded);
    print("consolidated_equal", same ? "1" : "0");
  }
}

void zero_skip_unsynced(const dist::TorchrunEnv& env, const std::string& optimizer) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto net = small_net("fp32");
  dist::ZeroRedundancyOptimizer zero(net->parameters(), factory_for(optimizer, "none"), group);
  // The stock scaler: no found_inf_sync.
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(256.0));
  for (int64_t step = 0; step < 3; ++step) {
    at::Tensor x = batch(step, env.rank, true);
    if (step == 1 && env.rank == 1) x[0][0] = std::numeric_limits<float>::infinity();
    net->zero_grad();
    scaler.scale(net->forward(x).pow(2).mean()).backward();
    scaler.step(zero);
    scaler.update();
    print("step" + std::to_string(step) + ".scale", hex(scaler.scale_tensor()));
    print("step" + std::to_string(step) + ".params", fingerprint(net->parameters()));
  }
}

void zero_errors(const dist::TorchrunEnv& env, const std::string& dir) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto net = small_net("fp32");
  dist::ZeroRedundancyOptimizer zero(net->parameters(), factory_for("fused_adamw", "none"), group);
  const auto attempt = [&](const std::string& name, const std::function<void()>& call) {
    try {
      call();
      print("error." + name, "none");
    } catch (const c10::Error& e) {
      print("error." + name, std::string(e.what_without_backtrace()).substr(0, 400));
    }
  };
  const auto shard_state = [&] {
    std::vector<at::Tensor> tensors;
    for (const auto& p : net->parameters()) {
      const auto found = zero.shard().state().find(p.unsafeGetTensorImpl());
      if (found == zero.shard().state().end()) continue;
      const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(*found->second);
      tensors.insert(tensors.end(), {s.step(), s.exp_avg(), s.exp_avg_sq()});
    }
    return fingerprint(tensors);
  };
  attempt("before_consolidating", [&] { zero.state_dict(); });
  for (int64_t step = 0; step < 2; ++step) {
    net->zero_grad();
    net->forward(batch(step, env.rank, false)).pow(2).mean().backward();
    zero.step();
  }
  zero.consolidate_state_dict(0);
  if (env.rank == 1) attempt("not_target", [&] { zero.state_dict(); });
  attempt("bad_to", [&] { zero.consolidate_state_dict(5); });
  const std::string good = dir + "/good";
  zero.save_sharded(good);
  const std::string before = shard_state();
  // Python's format: rank 0 writes the consolidated state as Python's optimizer.state_dict().
  // Its groups name the inner optimizer's implementation (WrapsOptimizer), and a group that
  // optimizer would not compute is refused on every rank, the shards unchanged.
  const std::string python_file = dir + "/python.pt";
  if (env.rank == 0) amp::save_optimizer_state_dict(zero, python_file);
  group->barrier()->wait();
  const c10::IValue python_state = amp::load_pickled(python_file);
  auto first_group =
      python_state.toGenericDict().at("param_groups").toList().get(0).toGenericDict();
  const auto flag = [&](const char* key) {
    return first_group.contains(key) && first_group.at(key).toBool() ? "1" : "0";
  };
  print("python.fused", flag("fused"));
  print("python.decoupled", flag("decoupled_weight_decay"));
  // One more step, so that a load that changes nothing would be seen.
  net->zero_grad();
  net->forward(batch(2, env.rank, false)).pow(2).mean().backward();
  zero.step();
  const std::string stepped = shard_state();
  print("python.stepped_differs", stepped != before ? "1" : "0");
  first_group.insert_or_assign("decoupled_weight_decay", false);  // Python's Adam
  attempt("python_adam_group", [&] { amp::load_optimizer_state_dict(zero, python_state); });
  print("unchanged.python_adam_group", shard_state() == stepped ? "1" : "0");
  first_group.insert_or_assign("decoupled_weight_decay", true);
  amp::load_optimizer_state_dict(zero, python_state);
  print("loaded_python", shard_state() == before ? "1" : "0");
  // A damaged shard: rank 1 cuts its own file in half.
  const std::string damaged = dir + "/damaged";
  zero.save_sharded(damaged);
  if (env.rank == 1) {
    const std::string path = damaged + "/zero-shard-1-of-2.pt";
    const auto size = std::filesystem::file_size(path);
    std::filesystem::resize_file(path, size / 2);
  }
  group->barrier()->wait();
  attempt("damaged_shard", [&] { zero.load_sharded(damaged); });
  print("unchanged.damaged_shard", shard_state() == before ? "1" : "0");
  // A damaged index (rank 0 overwrites it with text).
  const std::string bad_index = dir + "/bad_index";
  zero.save_sharded(bad_index);
  if (env.rank == 0) std::ofstream(bad_index + "/zero-index.pt", std::ios::trunc) << "not a file";
  group->barrier()->wait();
  attempt("damaged_index", [&] { zero.load_sharded(bad_index); });
  // Another model: its second Linear is 9 wide.
  at::manual_seed(3);
  auto other = std::make_shared<SmallNet>(false);
  other->fc2 = other->replace_module("fc2", torch::nn::Linear(32, 9));
  dist::ZeroRedundancyOptimizer other_zero(other->parameters(), factory_for("fused_adamw", "none"),
                                           group);
  other_zero.save_sharded(dir + "/other");
  attempt("other_model", [&] { zero.load_sharded(dir + "/other"); });
  attempt("missing", [&] { zero.load_sharded(dir + "/nothing_here"); });
  print("unchanged.after_all", shard_state() == before ? "1" : "0");
  // The good checkpoint still loads.
  zero.load_sharded(good);
  print("loaded_good", shard_state() == before ? "1" : "0");
}

void zero_partial_consolidate(const dist::TorchrunEnv& env) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto net = small_net("fp32");
  dist::ZeroRedundancyOptimizer zero(net->parameters(), factory_for("torch_sgd", "none"), group);
  if (env.rank == 0) {
    try {
      zero.consolidate_state_dict(0);
      print("error.partial", "none");
    } catch (const c10::Error& e) {
      print("error.partial", std::string(e.what_without_backtrace()).substr(0, 600));
    }
  } else {
    // Never calls it; stays until rank 0 has given up.
    std::this_thread::sleep_for(std::chrono::seconds(8));
  }
}

namespace {

// The two steps after the checkpoint, the same batches at every world size.
std::vector<std::string> continue_two_steps(SmallNet& net, torch::optim::Optimizer& optimizer) {
  std::vector<std::string> after;
  for (int64_t step = 2; step < 4; ++step) {
    net.zero_grad();
    net.forward(batch(step, 0, false)).pow(2).mean().backward();
    optimizer.step();
    after.push_back(fingerprint(net.parameters()));
  }
  return after;
}

std::shared_ptr<SmallNet> net_from(const std::vector<at::Tensor>& values) {
  auto net = small_net("fp32");
  at::NoGradGuard no_grad;
  const auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values.at(i));
  return net;
}

}  // namespace

void zero_roundtrip(const dist::TorchrunEnv& env, const std::string& dir) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  const auto factory = factory_for("fused_adamw", "none");
  auto net = small_net("fp32");
  dist::ZeroRedundancyOptimizer zero(net->parameters(), factory, group);
  for (int64_t step = 0; step < 2; ++step) {
    net->zero_grad();
    net->forward(batch(step, 0, false)).pow(2).mean().backward();
    zero.step();
  }
  std::vector<at::Tensor> snapshot;
  for (const auto& p : net->parameters()) snapshot.push_back(p.detach().clone());
  zero.save_sharded(dir + "/sharded");
  zero.consolidate_state_dict(0);
  if (env.rank == 0) {
    torch::save(snapshot, dir + "/model.pt");
    torch::save(zero, dir + "/consolidated.pt");
  }
  group->barrier()->wait();
  const auto expected = continue_two_steps(*net, zero);
  for (size_t k = 0; k < expected.size(); ++k) print("after" + std::to_string(k), expected[k]);
  // The consolidated file is the unsharded optimizer's own.
  auto plain_net = net_from(snapshot);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(plain_net->parameters());
  auto unsharded = factory(std::move(groups));
  torch::load(*unsharded, dir + "/consolidated.pt");
  print("unsharded.equal", continue_two_steps(*plain_net, *unsharded) == expected ? "1" : "0");
  // And it loads back into a ZeroRedundancyOptimizer.
  auto again_net = net_from(snapshot);
  dist::ZeroRedundancyOptimizer again(again_net->parameters(), factory, group);
  torch::load(again, dir + "/consolidated.pt");
  print("reloaded.equal", continue_two_steps(*again_net, again) == expected ? "1" : "0");
}

void zero_resume(const dist::TorchrunEnv& env, const std::string& dir) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  std::vector<at::Tensor> snapshot;
  torch::load(snapshot, dir + "/model.pt");
  auto net = net_from(snapshot);
  dist::ZeroRedundancyOptimizer zero(net->parameters(), factory_for("fused_adamw", "none"), group);
  zero.load_sharded(dir + "/sharded");
  const auto after = continue_two_steps(*net, zero);
  for (size_t k = 0; k < after.size(); ++k) print("after" + std::to_string(k), after[k]);
}

}  // namespace amp_worker
