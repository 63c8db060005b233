// One rank of a multi-process amp::distributed test, started like a torchrun rank by
// distributed.tests.cpp and parity/ddp_parity.py: runs the scenario named on its command line and
// prints what it saw as "key value" lines (float values as hex bit patterns, compared exactly by
// the test).
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <sys/prctl.h>
#include <unistd.h>

#include <amp/autocast.h>
#include <amp/distributed.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include "fp8/amax_batch.h"
#include "support/host_reads.h"
#include "worker_support.h"
#include "zero_worker.h"

namespace {

namespace dist = amp::distributed;
using amp_worker::group_options;
using amp_worker::hex;
using amp_worker::ParityConfig;
using amp_worker::print;
using amp_worker::read_raw;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, at::Tensor w) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w}, 0.5);
  if (kind == "fused_sgd") {
    return std::make_unique<amp::optim::FusedSGD>(std::vector<at::Tensor>{w},
                                                  amp::optim::FusedSGDOptions(0.5));
  }
  if (kind == "fused_adamw") {
    return std::make_unique<amp::optim::FusedAdamW>(std::vector<at::Tensor>{w},
                                                    amp::optim::FusedAdamWOptions(0.01));
  }
  throw std::runtime_error("unknown optimizer " + kind);
}

// Four steps of a one-parameter model, the same data on every rank; rank 1's gradient holds an
// inf in step 2. With the flag synced every rank skips step 2.
void skip_together(const dist::TorchrunEnv& env, const std::string& optimizer, bool sync,
                   c10::DeviceType device) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScalerOptions options;
  if (sync) options.found_inf_sync(dist::found_inf_sync(group));
  amp::GradScaler scaler(device, options);
  at::Tensor w = at::ones({4}, at::TensorOptions(device)).requires_grad_();
  const at::Tensor x = at::tensor({0.25f, 0.5f, -0.75f, 1.0f}).to(device);
  auto opt = make_optimizer(optimizer, w);
  int64_t host_reads = 0;
  for (int step = 1; step <= 4; ++step) {
    opt->zero_grad();
    scaler.scale((w * x).sum()).backward();
    if (step == 2 && env.rank == 1)
      w.mutable_grad()[1].fill_(std::numeric_limits<float>::infinity());
    amp::StepResult result;
    {
      amp_test::HostReadRecorder recorder;
      result = scaler.step(*opt);
      scaler.update();
      host_reads += static_cast<int64_t>(recorder.reads().size());
    }
    const std::string key = "step" + std::to_string(step);
    print(key + ".found_inf", hex(result.found_inf));
    print(key + ".scale", hex(scaler.scale_tensor()));
    print(key + ".params", hex(w));
  }
  print("host_reads", std::to_string(host_reads));
}

// Six parameters (one empty) whose gradients are known integers, reduced by DistributedDataParallel
// with the hook `comm` and buckets of `bucket_cap_mb`; with "unused", parameter 4 is used only
// on the ranks other than 0 and parameter 5 nowhere (find_unused_parameters). Two iterations:
// the second runs on the buckets rebuilt from the first backward. Printed for the test to
// compare with the average it computes itself.
struct KnownGradients : torch::nn::Module {
  explicit KnownGradients(const std::vector<std::vector<int64_t>>& shapes) {
    for (size_t j = 0; j < shapes.size(); ++j)
      params.push_back(register_parameter("p" + std::to_string(j), at::zeros(shapes[j])));
  }
  std::vector<at::Tensor> params;
};

dist::CommHook comm_hook(const std::string& comm) {
  if (comm == "fp16") return dist::CommHook::kFp16Compress;
  if (comm == "bf16") return dist::CommHook::kBf16Compress;
  return dist::CommHook::kAllReduce;
}

void ddp_grads(const dist::TorchrunEnv& env, const std::string& comm, double bucket_cap_mb,
               bool unused, c10::DeviceType device) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  const std::vector<std::vector<int64_t>> shapes{{0}, {1}, {7}, {3, 5}, {33}, {2}};
  auto module = std::make_shared<KnownGradients>(shapes);
  module->to(device);  // in place (set_data): module->params stay the registered tensors
  dist::DistributedDataParallel ddp(module, group,
                                    dist::DistributedDataParallelOptions()
                                        .bucket_cap_mb(bucket_cap_mb)
                                        .find_unused_parameters(unused)
                                        .comm_hook(comm_hook(comm)));
  for (int iteration = 1; iteration <= 2; ++iteration) {
    for (auto& p : module->params) p.mutable_grad() = at::Tensor();
    const at::Tensor loss = ddp.forward([&] {
      at::Tensor total = at::zeros({}, at::TensorOptions(device));
      for (size_t j = 0; j < shapes.size(); ++j) {
        const bool used = !unused || (j != 5 && !(j == 4 && env.rank == 0));
        if (!used) continue;
        // d total / d p_j[i] = world * (rank + 1) * ((i + j) % 5 + 1)
        const at::Tensor weights =
            (at::arange(module->params[j].numel(), at::TensorOptions(device)) +
             static_cast<int64_t>(j))
                .remainder(5) +
            1;
        total = total + (module->params[j].reshape({-1}) * weights).sum() *
                            static_cast<double>(env.world_size * (env.rank + 1));
      }
      return total;
    });
    loss.backward();
    print("iteration" + std::to_string(iteration) + ".buckets",
          std::to_string(ddp.buckets().size()));
  }
  for (size_t j = 0; j < shapes.size(); ++j) {
    const at::Tensor& grad = module->params[j].grad();
    print("grad" + std::to_string(j),
          grad.defined() ? (grad.numel() ? hex(grad) : "empty") : "undefined");
    print("dtype" + std::to_string(j),
          grad.defined() ? std::string(c10::toString(grad.scalar_type())) : "-");
  }
}

// One parameter w, DistributedDataParallel with the fp16 or bf16 hook: every rank's scaled gradient
// has an element beyond float16's range (2^16 * 2 = 2^17), so with fp16 transfer it becomes inf
// on every rank, each rank's flag is 1, and every rank must skip (MAX of the flags, not SUM);
// with bf16 it is an ordinary value.
struct OneParameter : torch::nn::Module {
  OneParameter() { w = register_parameter("w", at::zeros({4})); }
  at::Tensor w;
};

void overflow(const dist::TorchrunEnv& env, const std::string& comm, const std::string& optimizer) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  auto module = std::make_shared<OneParameter>();
  auto opt_owner = make_optimizer(optimizer, module->w);
  torch::optim::Optimizer& opt = *opt_owner;
  dist::DistributedDataParallel ddp(
      module, group, dist::DistributedDataParallelOptions().comm_hook(comm_hook(comm)));
  const at::Tensor c = at::tensor({2.0f + env.rank, 0.125f, 0.0625f, 0.03125f});
  const at::Tensor loss = ddp.forward([&] { return (module->w * c).sum(); });
  scaler.scale(loss).backward();
  const amp::StepResult result = scaler.step(opt);
  scaler.update();
  print("found_inf", hex(result.found_inf));
  print("taken", result.outcome == amp::StepOutcome::kTaken ? "1" : "0");
  print("scale", hex(scaler.scale_tensor()));
  print("params", hex(module->w));
}

// bf16 parameters trained by FusedAdamW in a low-precision mode (master, kahan or sr) on each
// rank's own data: DistributedDataParallel averages the bf16 gradients in their dtype, and in step
// 3 rank 1 alone sees an inf after the all-reduce, so the synced flag must make every rank skip.
void low_precision(const dist::TorchrunEnv& env, const std::string& mode) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  at::manual_seed(3);
  auto module = std::make_shared<torch::nn::Module>();
  std::vector<at::Tensor> params{
      module->register_parameter("a", at::randn({64}).to(at::kBFloat16)),
      module->register_parameter("b", at::randn({8, 8}).to(at::kBFloat16))};
  amp::optim::FusedAdamW opt(params, amp::optim::FusedAdamWOptions(1e-2)
                                         .weight_decay(0.01)
                                         .master_weights(mode == "master")
                                         .kahan_summation(mode == "kahan")
                                         .stochastic_rounding(mode == "sr")
                                         .rounding_seed(5));
  dist::DistributedDataParallel ddp(module, group);
  int64_t host_reads = 0;
  for (int step = 1; step <= 4; ++step) {
    opt.zero_grad();
    at::manual_seed(100 + 10 * step + env.rank);  // each rank its own data
    std::vector<at::Tensor> data;
    for (const auto& p : params) data.push_back(at::randn(p.sizes()));
    amp::StepResult result;
    {
      // The whole iteration, DDP's forward and backward included, reads nothing on the host.
      amp_test::HostReadRecorder recorder;
      const at::Tensor loss = ddp.forward([&] {
        at::Tensor total = at::zeros({}, at::kFloat);
        for (size_t k = 0; k < params.size(); ++k)
          total = total + (params[k].to(at::kFloat) * data[k]).sum();
        return total;
      });
      scaler.scale(loss).backward();
      if (step == 3 && env.rank == 1) params[1].mutable_grad()[2][5].fill_(NAN);
      result = scaler.step(opt);
      scaler.update();
      host_reads += static_cast<int64_t>(recorder.reads().size());
    }
    const std::string key = "step" + std::to_string(step);
    print(key + ".found_inf", hex(result.found_inf));
    print(key + ".params", hex(params[0]) + ";" + hex(params[1]));
  }
  print("grad_dtype", std::string(c10::toString(params[0].grad().scalar_type())));
  print("param_dtype", std::string(c10::toString(params[0].scalar_type())));
  std::string state;
  for (const auto& p : params) {
    const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(
        *opt.state().at(p.unsafeGetTensorImpl()));
    state += hex(s.exp_avg()) + ";" + hex(s.step()) + ";";
    if (s.master_weight().defined()) state += hex(s.master_weight()) + ";";
    if (s.kahan_comp().defined()) state += hex(s.kahan_comp()) + ";";
  }
  print("state", state);
  print("host_reads", std::to_string(host_reads));
}

// A delayed-scaling Float8Linear trained on each rank's own data (rank r's inputs scaled by r + 1)
// for three steps; with "sync" the amaxes are all-reduced (MAX), with "local" each rank keeps its
// own. Prints the layer's histories and scales, each step's local input amax and how many
// batched amax reductions ran.
void fp8_delayed(const dist::TorchrunEnv& env, const std::string& mode) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto options = amp::fp8::DelayedScalingOptions().amax_history_len(4);
  if (mode == "sync") options.amax_reduction(dist::amax_all_reduce(group));
  at::manual_seed(11);
  amp::fp8::Float8Linear layer(
      amp::fp8::Float8LinearOptions(32, 16).recipe(amp::fp8::Recipe::delayed(options)));
  torch::optim::SGD opt(layer->parameters(), 0.1);
  amp::fp8::Float8AutocastGuard float8;
  for (int step = 1; step <= 3; ++step) {
    opt.zero_grad();
    at::manual_seed(200 + 10 * step + env.rank);
    const auto x = at::randn({8, 32}) * (env.rank + 1);
    print("step" + std::to_string(step) + ".input_amax", hex(x.abs().max()));
    layer->forward(x).square().mean().backward();
    opt.step();
  }
  for (const auto& buffer : layer->named_buffers()) print(buffer.key(), hex(buffer.value()));
  print("amax_reductions", std::to_string(amp::fp8::detail::batched_amax_reductions_issued()));
}

// Two delayed-scaling Float8Linear layers inside DistributedDataParallel (one bucket per
// parameter). "sync": their amaxes all-reduced in batches, the batch's collective at the end of
// each backward, beside the reducer's. "local": no reduction, so each rank's histories are its
// own (DDP's buffer broadcast must leave them alone). Prints the buffers, the parameters, each
// step's local input amax and the reductions issued.
void fp8_delayed_ddp(const dist::TorchrunEnv& env, const std::string& mode) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto options = amp::fp8::DelayedScalingOptions().amax_history_len(4);
  if (mode == "sync") options.amax_reduction(dist::amax_all_reduce(group));
  const auto recipe = amp::fp8::Recipe::delayed(options);
  at::manual_seed(12);
  auto model = std::make_shared<torch::nn::SequentialImpl>(
      amp::fp8::Float8Linear(amp::fp8::Float8LinearOptions(32, 32).recipe(recipe)),
      amp::fp8::Float8Linear(amp::fp8::Float8LinearOptions(32, 16).recipe(recipe)));
  dist::DistributedDataParallel ddp(model, group,
                                    dist::DistributedDataParallelOptions().bucket_cap_mb(0.001));
  torch::optim::SGD opt(model->parameters(), 0.1);
  amp::fp8::Float8AutocastGuard float8;
  for (int step = 1; step <= 3; ++step) {
    opt.zero_grad();
    at::manual_seed(400 + 10 * step + env.rank);
    const auto x = at::randn({8, 32}) * (env.rank + 1);
    print("step" + std::to_string(step) + ".input_amax", hex(x.abs().max()));
    ddp.forward([&] { return model->forward(x); }).square().mean().backward();
    opt.step();
  }
  for (const auto& buffer : model->named_buffers()) print(buffer.key(), hex(buffer.value()));
  for (const auto& p : model->named_parameters()) print(p.key(), hex(p.value()));
  print("amax_reductions", std::to_string(amp::fp8::detail::batched_amax_reductions_issued()));
}

// Data-parallel training resumed from a checkpoint: a two-layer model with FusedAdamW and a
// synced GradScaler (an inf on rank 1 at step 2) trains six steps in one go, and again three
// steps, after which rank 0 saves model, optimizer and scaler to `dir`, every rank loads rank 0's
// files into fresh objects, wraps the model in DDP again and trains the last three. Prints both
// runs' parameters, scale and optimizer state. `find_unused`: DDP's find_unused_parameters, whose
// buckets keep their first layout (without it the first iteration after construction reduces
// one bucket and later ones the rebuilt buckets).
void ddp_resume(const dist::TorchrunEnv& env, const std::string& dir, bool find_unused) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  struct Run {
    std::shared_ptr<torch::nn::SequentialImpl> model;
    std::unique_ptr<amp::optim::FusedAdamW> optimizer;
    std::unique_ptr<amp::GradScaler> scaler;
    std::unique_ptr<dist::DistributedDataParallel> ddp;
  };
  const auto fresh = [&] {
    Run run;
    at::manual_seed(70 + env.rank);  // each rank its own initial weights: DDP broadcasts rank 0's
    run.model = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(8, 16),
        torch::nn::Functional([](const at::Tensor& t) { return at::gelu(t); }),
        torch::nn::Linear(16, 4));
    run.optimizer = std::make_unique<amp::optim::FusedAdamW>(run.model->parameters(),
                                                             amp::optim::FusedAdamWOptions(1e-2));
    run.scaler = std::make_unique<amp::GradScaler>(
        c10::DeviceType::CPU,
        amp::GradScalerOptions().init_scale(256.0).growth_interval(2).found_inf_sync(
            dist::found_inf_sync(group)));
    return run;
  };
  const auto wrap = [&](Run& run) {
    run.ddp = std::make_unique<dist::DistributedDataParallel>(
        run.model, group,
        dist::DistributedDataParallelOptions().find_unused_parameters(find_unused));
  };
  const auto train = [&](Run& run, int from, int to) {
    for (int step = from; step < to; ++step) {
      run.optimizer->zero_grad();
      at::manual_seed(800 + 10 * step + env.rank);
      const at::Tensor x = at::randn({4, 8});
      at::Tensor loss;
      {
        amp::AutocastGuard autocast(c10::DeviceType::CPU, at::kBFloat16);
        loss =
            run.ddp->forward([&] { return run.model->forward(x); }).to(at::kFloat).square().mean();
      }
      run.scaler->scale(loss).backward();
      if (step == 2 && env.rank == 1)
        run.model->parameters()[0].mutable_grad()[0][0].fill_(INFINITY);
      run.scaler->step(*run.optimizer);
      run.scaler->update();
    }
  };
  const auto report = [&](const std::string& name, Run& run) {
    std::string params;
    for (const auto& p : run.model->parameters()) params += hex(p) + ";";
    print(name + ".params", params);
    print(name + ".scale", hex(run.scaler->scale_tensor()));
    std::string state;
    for (const auto& p : run.model->parameters()) {
      const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(
          *run.optimizer->state().at(p.unsafeGetTensorImpl()));
      state += hex(s.exp_avg()) + ";" + hex(s.exp_avg_sq()) + ";" + hex(s.step()) + ";";
    }
    print(name + ".state", state);
  };

  Run whole = fresh();
  wrap(whole);
  train(whole, 0, 6);
  report("whole", whole);

  Run first = fresh();
  wrap(first);
  train(first, 0, 3);
  if (env.rank == 0) {
    torch::save(first.model, dir + "/model.pt");
    torch::save(*first.optimizer, dir + "/optimizer.pt");
    first.scaler->save_state_dict(dir + "/scaler.pt");
  }
  group->barrier()->wait();
  Run resumed = fresh();
  torch::load(resumed.model, dir + "/model.pt");
  torch::load(*resumed.optimizer, dir + "/optimizer.pt");
  resumed.scaler->load_state_dict(dir + "/scaler.pt");
  wrap(resumed);
  train(resumed, 3, 6);
  report("resumed", resumed);
}

// The last rank's scaler has another growth_interval.
void options_differ(const dist::TorchrunEnv& env) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScalerOptions options;
  options.found_inf_sync(dist::found_inf_sync(group));
  if (env.rank == env.world_size - 1) options.growth_interval(1000).backoff_factor(0.25);
  amp::GradScaler scaler(c10::DeviceType::CPU, options);
  print("constructed", "1");
}

// The last rank exits right after joining; the others go on training.
void dies(const dist::TorchrunEnv& env) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  print("joined", "1");
  if (env.rank == env.world_size - 1) std::_Exit(3);
  at::Tensor w = at::ones({4}).requires_grad_();
  torch::optim::SGD opt({w}, 0.5);
  for (int step = 0; step < 1000; ++step) {
    opt.zero_grad();
    scaler.scale(w.sum()).backward();
    scaler.step(opt);
    scaler.update();
  }
  print("finished", "1");
}

// The last rank stops taking part (sleeps) right after joining; the others go on training.
void stalls(const dist::TorchrunEnv& env) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  auto module = std::make_shared<OneParameter>();
  dist::DistributedDataParallel ddp(module, group);
  print("joined", "1");
  if (env.rank == env.world_size - 1) {
    ::sleep(12);
    return;
  }
  scaler.scale(ddp.forward([&] { return module->w.sum(); })).backward();
  print("finished", "1");
}

// fc1 -> relu -> fc2, plus a side head added on even steps only when the scenario has unused
// parameters: the model of ddp_parity.py, registered in the same order.
struct ParityNet : torch::nn::Module {
  ParityNet(int64_t in, int64_t hidden, int64_t out, bool batch_norm = false)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))),
        side(register_module("side", torch::nn::Linear(hidden, out))) {
    if (batch_norm) bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
  }
  // at::linear, as Python's F.linear: the C++ frontend's Linear::forward calls addmm(bias, x,
  // weight.t()) for 2-d inputs, whose autocast casts (bias first) order backward differently.
  at::Tensor forward(const at::Tensor& x, bool use_side) {
    at::Tensor h = at::linear(x, fc1->weight, fc1->bias);
    h = at::relu(bn ? bn->forward(h) : h);
    at::Tensor y = at::linear(h, fc2->weight, fc2->bias);
    return use_side ? y + at::linear(h, side->weight, side->bias) : y;
  }
  torch::nn::Linear fc1, fc2, side;
  torch::nn::BatchNorm1d bn{nullptr};
};

// The twin of ddp_parity.py's PyTorch ranks: the same model (rank r starts from its own weights;
// DDP broadcasts rank 0's), data, GradScaler, SGD with momentum and DDP options, with amp's
// DistributedDataParallel; prints the scale and the parameters after every step. A run moved
// between the languages: with save=PATH, rank 0 writes the checkpoint a Python DDP loop writes
// ({"model", "optimizer", "scaler", "step"} as Python's state_dict()s) after move_step steps and
// every rank stops there; with resume=PATH, every rank reads such a file (a Python one names the
// model's entries "module.", as Python's ddp.state_dict() does) and runs the steps from move_step.
void ddp_parity(const dist::TorchrunEnv& env, const std::string& dir, const ParityConfig& config) {
  const int64_t steps = config.integer("steps"), accumulate = config.integer("accumulate"),
                batch = config.integer("batch"), in = config.integer("in"),
                hidden = config.integer("hidden"), out = config.integer("out");
  const bool unused = config.at("unused") == "1", fp16_autocast = config.at("autocast") == "fp16";
  auto group = dist::init_gloo_from_torchrun(group_options());
  auto model = std::make_shared<ParityNet>(in, hidden, out, config.at("batch_norm") == "1");
  {
    const std::string mine = dir + "/rank" + std::to_string(env.rank) + "_";
    at::NoGradGuard no_grad;
    for (auto& named : model->named_parameters()) {
      named.value().copy_(
          read_raw(mine + named.key() + ".bin", named.value().sizes().vec(), at::kFloat));
    }
  }
  const std::string& save = config.at("save");
  const std::string& resume = config.at("resume");
  const int64_t move_step = config.at("move_step") == "none" ? -1 : config.integer("move_step");
  c10::impl::GenericDict checkpoint(c10::StringType::get(), c10::AnyType::get());
  if (resume != "none") {
    // Loaded before the wrap, as a Python loop does; DDP's broadcast then changes nothing.
    checkpoint = amp::load_pickled(resume).toGenericDict();
    c10::IValue model_state = checkpoint.at("model");
    amp::consume_prefix_in_state_dict_if_present(model_state, "module.");
    amp::load_state_dict(*model, model_state);
  }
  const std::string data = dir + "/rank" + std::to_string(env.rank);
  const at::Tensor xs = read_raw(data + "_x.bin", {steps, accumulate, batch, in}, at::kFloat);
  const at::Tensor ys = read_raw(data + "_y.bin", {steps, accumulate, batch}, at::kLong);
  dist::DistributedDataParallelOptions options;
  options.find_unused_parameters(unused).comm_hook(comm_hook(config.at("hook")));
  if (config.at("bucket_cap_mb") != "default") options.bucket_cap_mb(config.real("bucket_cap_mb"));
  options.static_graph(config.at("static_graph") == "1")
      .gradient_as_bucket_view(config.at("bucket_view") == "1");
  dist::DistributedDataParallel ddp(model, group, options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  amp::GradScalerOptions scaler_options =
      amp::GradScalerOptions().init_scale(config.real("init_scale")).growth_interval(2);
  scaler_options.found_inf_sync(dist::found_inf_sync(group));
  amp::GradScaler scaler(c10::DeviceType::CPU, scaler_options);
  int64_t first = 0;
  if (resume != "none") {
    amp::load_optimizer_state_dict(optimizer, checkpoint.at("optimizer"));
    scaler.load_state_dict(checkpoint.at("scaler").toGenericDict());
    first = checkpoint.at("step").toInt();
    if (first != move_step) throw std::runtime_error("the checkpoint is not of move_step");
  }
  const bool flip = std::getenv("AMP_TEST_FLIP_BIT") != nullptr;
  for (int64_t step = first; step < steps; ++step) {
    ddp.zero_grad();  // Python's set_to_none; LibTorch's would detach_() bucket views
    for (int64_t micro = 0; micro < accumulate; ++micro) {
      const auto run = [&] {
        at::Tensor loss = ddp.forward([&] {
          std::optional<amp::AutocastGuard> autocast;
          if (fp16_autocast) autocast.emplace(c10::DeviceType::CPU, at::kHalf);
          return model->forward(xs[step][micro], !unused || step % 2 == 0);
        });
        loss = at::cross_entropy_loss(loss.to(at::kFloat), ys[step][micro]) / accumulate;
        scaler.scale(loss).backward();
      };
      if (micro + 1 < accumulate) {
        auto guard = ddp.no_sync();  // the micro-batches before the last accumulate locally
        run();
      } else {
        run();
      }
    }
    scaler.step(optimizer);
    scaler.update();
    if (flip && step == 2 && env.rank == 0) {
      // One wrong bit in one weight, to show that the comparison sees it.
      at::NoGradGuard no_grad;
      const at::Tensor w = model->fc2->weight.view(at::kInt);
      w.view({-1})[0].bitwise_xor_(1);
    }
    const std::string key = "step" + std::to_string(step);
    print(key + ".scale", hex(scaler.scale_tensor()));
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
    print(key + ".params", hex(at::cat(flat)));
    if (model->bn) {
      std::vector<at::Tensor> buffers;
      for (const auto& b : model->buffers()) buffers.push_back(b.detach().reshape({-1}));
      print(key + ".buffers", hex(at::cat(buffers)));
    }
    if (save != "none" && step + 1 == move_step) {
      if (env.rank == 0) {
        c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
        out.insert("model", amp::state_dict(*model));
        out.insert("optimizer", amp::optimizer_state_dict(optimizer));
        out.insert("scaler", scaler.state_dict());
        out.insert("step", move_step);
        amp::save_pickled(out, save);
      }
      return;
    }
  }
  print("side.weight.grad", model->side->weight.grad().defined() ? "defined" : "undefined");
  print("buckets", std::to_string(ddp.buckets().size()));
  std::string order;
  for (const auto& bucket : ddp.buckets()) {
    order += order.empty() ? "" : ";";
    for (size_t k = 0; k < bucket.size(); ++k) order += (k ? "," : "") + std::to_string(bucket[k]);
  }
  print("bucket_order", order);
}

// A comm hook of the user's (c10d::CppCommHookInterface) that records, when each bucket is sent,
// which of the model's gradients backward has produced so far, then all-reduces and averages.
struct Snapshot {
  std::vector<at::Tensor> params;
  std::vector<std::string> sent;  // per bucket sent: "<index>:<gradients defined>/<count>"
  bool first_layer_pending_at_first_send = false;
};

class RecordingHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  RecordingHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<Snapshot> snapshot)
      : CppCommHookInterface(std::move(group)), snapshot_(std::move(snapshot)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    int64_t defined = 0;
    for (const auto& p : snapshot_->params) defined += p.grad().defined() ? 1 : 0;
    if (snapshot_->sent.empty()) {
      snapshot_->first_layer_pending_at_first_send = !snapshot_->params.front().grad().defined();
    }
    snapshot_->sent.push_back(std::to_string(bucket.getIndex()) + ":" + std::to_string(defined) +
                              "/" + std::to_string(snapshot_->params.size()));
    std::vector<at::Tensor> tensors{bucket.getBufferRef().div_(state_->getSize())};
    return state_->allreduce(tensors)->getFuture();
  }

 private:
  std::shared_ptr<Snapshot> snapshot_;
};

// Four Linear layers, one bucket each from the second iteration on; prints what the recording
// hook saw in the second backward.
void overlap(const dist::TorchrunEnv& env) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  at::manual_seed(5);
  const auto relu = [](const at::Tensor& t) { return at::relu(t); };
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::Functional(relu),
                              torch::nn::Linear(64, 64), torch::nn::Functional(relu),
                              torch::nn::Linear(64, 64), torch::nn::Functional(relu),
                              torch::nn::Linear(64, 10));
  dist::DistributedDataParallel ddp(model, group,
                                    dist::DistributedDataParallelOptions().bucket_cap_mb(0.01));
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->params = model->parameters();
  ddp.register_comm_hook(std::make_unique<RecordingHook>(group, snapshot));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  for (int iteration = 1; iteration <= 2; ++iteration) {
    optimizer.zero_grad();  // gradients undefined until backward produces them
    snapshot->sent.clear();
    at::manual_seed(50 + env.rank + 10 * iteration);
    const at::Tensor x = at::randn({32, 64});
    ddp.forward([&] { return model->forward(x); }).square().mean().backward();
    optimizer.step();
  }
  std::string sent;
  for (const auto& entry : snapshot->sent) sent += (sent.empty() ? "" : " ") + entry;
  print("buckets", std::to_string(ddp.buckets().size()));
  print("sent", sent);
  print("first_layer_pending_at_first_send",
        snapshot->first_layer_pending_at_first_send ? "1" : "0");
  std::vector<at::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
  print("params", hex(at::cat(flat)));
}

// Misuse and faults, each expected to end in a sentence on every rank.
void fault(const dist::TorchrunEnv& env, const std::string& kind) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  const bool last = env.rank == env.world_size - 1;
  auto model = std::make_shared<ParityNet>(8, last && kind == "shape" ? 12 : 16, 4);
  if (last && kind == "count") model->register_parameter("extra", at::zeros({3}));
  if (last && kind == "dtype") model->side->to(at::kDouble);
  if (last && kind == "requires_grad") model->side->bias.requires_grad_(false);
  if (kind == "twice") {
    dist::DistributedDataParallel first(model, group);
    print("first", "1");
    dist::DistributedDataParallel second(model, group);
    print("second", "1");
    return;
  }
  dist::DistributedDataParallel ddp(model, group);
  print("constructed", "1");
  const at::Tensor x = at::randn({4, 8});
  for (int iteration = 1; iteration <= 2; ++iteration) {
    // "unused": the side head never reaches the loss, and find_unused_parameters is off.
    at::Tensor loss =
        ddp.forward([&] { return model->forward(x, kind != "unused"); }).square().mean();
    if (kind == "no_sync") {
      auto guard = ddp.no_sync();  // too late: the forward above was synced
    }
    if (kind == "dies" && last) std::_Exit(3);  // between its forward and its backward
    loss.backward();
    print("iteration" + std::to_string(iteration), "1");
  }
}

void join() {
  auto group = dist::init_gloo_from_torchrun(group_options());
  print("joined", std::to_string(group->getSize()));
}

}  // namespace

int main(int argc, char** argv) {
  // Never outlive the test that started this rank, even when it is killed.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (const char* parent = std::getenv("AMP_TEST_PARENT_PID")) {
    if (::getppid() != static_cast<pid_t>(std::atoll(parent))) return 2;
  }
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    const dist::TorchrunEnv env = dist::torchrun_env();
    const std::string scenario = args.empty() ? "" : args[0];
    if (scenario == "skip" && (args.size() == 3 || args.size() == 4)) {
      // Gloo serves CUDA tensors too (through host memory): several ranks can share one GPU.
      skip_together(
          env, args[1], args[2] == "sync",
          args.size() == 4 && args[3] == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
    } else if (scenario == "ddp_grads" && (args.size() == 4 || args.size() == 5)) {
      ddp_grads(
          env, args[1], std::atof(args[2].c_str()), args[3] == "unused",
          args.size() == 5 && args[4] == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
    } else if (scenario == "overflow" && (args.size() == 2 || args.size() == 3)) {
      overflow(env, args[1], args.size() == 3 ? args[2] : "sgd");
    } else if (scenario == "options_differ") {
      options_differ(env);
    } else if (scenario == "dies") {
      dies(env);
    } else if (scenario == "stalls") {
      stalls(env);
    } else if (scenario == "ddp_parity" && args.size() >= 2) {
      ddp_parity(env, args[1], amp_worker::parse_config(args, 2));
    } else if (scenario == "low_precision" && args.size() == 2) {
      low_precision(env, args[1]);
    } else if (scenario == "fp8_delayed" && args.size() == 2) {
      fp8_delayed(env, args[1]);
    } else if (scenario == "fp8_delayed_ddp" && args.size() == 2) {
      fp8_delayed_ddp(env, args[1]);
    } else if (scenario == "ddp_resume" && args.size() == 3) {
      ddp_resume(env, args[1], args[2] == "find_unused");
    } else if (scenario == "overlap") {
      overlap(env);
    } else if (scenario == "fault" && args.size() == 2) {
      fault(env, args[1]);
    } else if (scenario == "join") {
      join();
    } else if (scenario == "zero_parity" && args.size() >= 2) {
      amp_worker::zero_parity(env, args[1], amp_worker::parse_config(args, 2));
    } else if (scenario == "zero_equal" && (args.size() == 4 || args.size() == 5)) {
      amp_worker::zero_equal(
          env, args[1], args[2], args[3],
          args.size() == 5 && args[4] == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
    } else if (scenario == "zero_skip_unsynced" && args.size() == 2) {
      amp_worker::zero_skip_unsynced(env, args[1]);
    } else if (scenario == "zero_errors" && args.size() == 2) {
      amp_worker::zero_errors(env, args[1]);
    } else if (scenario == "zero_roundtrip" && args.size() == 2) {
      amp_worker::zero_roundtrip(env, args[1]);
    } else if (scenario == "zero_resume" && args.size() == 2) {
      amp_worker::zero_resume(env, args[1]);
    } else if (scenario == "zero_partial_consolidate") {
      amp_worker::zero_partial_consolidate(env);
    } else {
      std::fprintf(
          stderr,
          "usage: amp_distributed_worker "
          "skip|ddp_grads|overflow|options_differ|dies|stalls|ddp_parity|low_precision|"
          "fp8_delayed|fp8_delayed_ddp|ddp_resume|overlap|fault|join|zero_parity|zero_equal|"
          "zero_skip_unsynced|zero_errors|zero_roundtrip|zero_resume|zero_partial_consolidate "
          "...\n");
      return 64;
    }
  } catch (const c10::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what_without_backtrace());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
