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
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <amp/autocast.h>
#include <amp/distributed.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/host_reads.h"

namespace {

namespace dist = amp::distributed;

std::string hex(const at::Tensor& values) {
  const at::Tensor host = values.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  std::string text;
  char word[16];
  for (int64_t i = 0; i < host.numel(); ++i) {
    uint32_t bits = 0;
    const float value = host.data_ptr<float>()[i];
    std::memcpy(&bits, &value, sizeof bits);
    std::snprintf(word, sizeof word, "%s%08" PRIx32, i > 0 ? "," : "", bits);
    text += word;
  }
  return text;
}

void print(const std::string& key, const std::string& value) {
  std::printf("%s %s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
}

dist::GroupOptions group_options() {
  const char* timeout = std::getenv("AMP_TEST_TIMEOUT_MS");
  return dist::GroupOptions()
      .timeout(std::chrono::milliseconds(timeout ? std::atoll(timeout) : 60000))
      .gloo_hostname("127.0.0.1");
}

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

// Gradients of known values through GradientAllReduce; printed for the test to compare with the
// average it computes itself.
void all_reduce(const dist::TorchrunEnv& env, const std::string& comm, int64_t bucket_bytes) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  dist::GradientAllReduceOptions options;
  options.bucket_bytes(bucket_bytes);
  if (comm == "fp16") options.comm_dtype(at::kHalf);
  if (comm == "bf16") options.comm_dtype(at::kBFloat16);
  const std::vector<std::vector<int64_t>> shapes{{0}, {1}, {7}, {3, 5}, {33}, {2}};
  std::vector<at::Tensor> params;
  for (size_t j = 0; j < shapes.size(); ++j) {
    at::Tensor p = at::zeros(shapes[j]).requires_grad_();
    // Parameter 4 has no gradient on rank 0, parameter 5 on no rank.
    const bool has_grad = j != 5 && !(j == 4 && env.rank == 0);
    if (has_grad) {
      at::Tensor grad = at::empty(shapes[j]);
      auto flat = grad.view({-1});
      for (int64_t i = 0; i < flat.numel(); ++i) {
        flat[i].fill_(static_cast<double>(env.world_size * (env.rank + 1) *
                                          ((i + static_cast<int64_t>(j)) % 5 + 1)));
      }
      p.mutable_grad() = grad;
    }
    params.push_back(p);
  }
  dist::GradientAllReduce reducer(params, group, options);
  print("buckets", std::to_string(reducer.buckets().size()));
  reducer.all_reduce_();
  for (size_t j = 0; j < params.size(); ++j) {
    const at::Tensor& grad = params[j].grad();
    print("grad" + std::to_string(j),
          grad.defined() ? (grad.numel() ? hex(grad) : "empty") : "undefined");
    print("dtype" + std::to_string(j),
          grad.defined() ? std::string(c10::toString(grad.scalar_type())) : "-");
  }
}

// Rank 1 has one gradient element beyond float16's range: with fp16 transfer it becomes inf on
// every rank and every rank skips; with bf16 it is an ordinary value.
void overflow(const dist::TorchrunEnv& env, const std::string& comm, const std::string& optimizer) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  at::Tensor w = at::zeros({4}).requires_grad_();
  auto opt_owner = make_optimizer(optimizer, w);
  torch::optim::Optimizer& opt = *opt_owner;
  dist::GradientAllReduce reducer(
      {w}, group,
      dist::GradientAllReduceOptions().comm_dtype(comm == "fp16" ? at::kHalf : at::kBFloat16));
  scaler.scale((w * at::tensor({0.25f, 0.125f, 0.0625f, 0.03125f})).sum()).backward();
  if (env.rank == 1) w.mutable_grad()[0].fill_(7e4);
  reducer.all_reduce_();
  const amp::StepResult result = scaler.step(opt);
  scaler.update();
  print("found_inf", hex(result.found_inf));
  print("taken", result.outcome == amp::StepOutcome::kTaken ? "1" : "0");
  print("scale", hex(scaler.scale_tensor()));
  print("params", hex(w));
}

// bf16 parameters trained by FusedAdamW in a low-precision mode (master, kahan or sr) on each
// rank's own data: GradientAllReduce averages the bf16 gradients in their dtype, and in step 3
// rank 1 alone sees an inf after the all-reduce, so the synced flag must make every rank skip.
void low_precision(const dist::TorchrunEnv& env, const std::string& mode) {
  auto group = dist::init_gloo_from_torchrun(group_options());
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  at::manual_seed(3);
  std::vector<at::Tensor> params{at::randn({64}).to(at::kBFloat16).requires_grad_(),
                                 at::randn({8, 8}).to(at::kBFloat16).requires_grad_()};
  amp::optim::FusedAdamW opt(params, amp::optim::FusedAdamWOptions(1e-2)
                                         .weight_decay(0.01)
                                         .master_weights(mode == "master")
                                         .kahan_summation(mode == "kahan")
                                         .stochastic_rounding(mode == "sr")
                                         .rounding_seed(5));
  dist::GradientAllReduce reducer(params, group);
  int64_t host_reads = 0;
  for (int step = 1; step <= 4; ++step) {
    opt.zero_grad();
    at::manual_seed(100 + 10 * step + env.rank);  // each rank its own data
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (const auto& p : params) loss = loss + (p.to(at::kFloat) * at::randn(p.sizes())).sum();
    scaler.scale(loss).backward();
    reducer.all_reduce_();
    if (step == 3 && env.rank == 1) params[1].mutable_grad()[2][5].fill_(NAN);
    amp::StepResult result;
    {
      amp_test::HostReadRecorder recorder;
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
// own. Prints the layer's histories and scales and each step's local input amax.
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
  at::Tensor w = at::ones({4}).requires_grad_();
  torch::optim::SGD opt({w}, 0.5);
  dist::GradientAllReduce reducer({w}, group);
  print("joined", "1");
  if (env.rank == env.world_size - 1) {
    ::sleep(12);
    return;
  }
  opt.zero_grad();
  scaler.scale(w.sum()).backward();
  reducer.all_reduce_();
  print("finished", "1");
}

// Reads `count` float32 (or int64) values written raw by ddp_parity.py.
at::Tensor read_raw(const std::string& path, std::vector<int64_t> shape, at::ScalarType dtype) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  const size_t got = std::fread(t.data_ptr(), 1, bytes, file);
  std::fclose(file);
  if (got != bytes) throw std::runtime_error("short read of " + path);
  return t;
}

// The twin of tests/parity/ddp_parity.py's DistributedDataParallel run: Linear(in, out) under
// fp16 autocast, GradScaler, SGD, each rank on its own batches, gradients averaged by
// GradientAllReduce (in `comm`); prints the scale and the parameters after every step.
void ddp_parity(const dist::TorchrunEnv& env, const std::string& dir, const std::string& comm) {
  const int64_t steps = 8, batch = 16, in = 32, out = 10;
  auto group = dist::init_gloo_from_torchrun(group_options());
  at::Tensor weight = read_raw(dir + "/weight.bin", {out, in}, at::kFloat).requires_grad_();
  at::Tensor bias = read_raw(dir + "/bias.bin", {out}, at::kFloat).requires_grad_();
  const std::string mine = dir + "/rank" + std::to_string(env.rank);
  const at::Tensor xs = read_raw(mine + "_x.bin", {steps, batch, in}, at::kFloat);
  const at::Tensor ys = read_raw(mine + "_y.bin", {steps, batch}, at::kLong);
  torch::optim::SGD optimizer({weight, bias}, 0.1);
  amp::GradScaler scaler(
      c10::DeviceType::CPU,
      amp::GradScalerOptions().init_scale(1048576.0).growth_interval(2).found_inf_sync(
          dist::found_inf_sync(group)));
  dist::GradientAllReduceOptions options;
  if (comm == "fp16") options.comm_dtype(at::kHalf);
  if (comm == "bf16") options.comm_dtype(at::kBFloat16);
  dist::GradientAllReduce reducer({weight, bias}, group, options);
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    at::Tensor loss;
    {
      amp::AutocastGuard autocast(c10::DeviceType::CPU, at::kHalf);
      loss = at::cross_entropy_loss(at::linear(xs[step], weight, bias), ys[step]);
    }
    scaler.scale(loss).backward();
    reducer.all_reduce_();
    scaler.step(optimizer);
    scaler.update();
    const std::string key = "step" + std::to_string(step);
    print(key + ".scale", hex(scaler.scale_tensor()));
    print(key + ".params", hex(at::cat({weight.detach().reshape({-1}), bias.detach()})));
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
    } else if (scenario == "all_reduce" && args.size() == 3) {
      all_reduce(env, args[1], std::atoll(args[2].c_str()));
    } else if (scenario == "overflow" && (args.size() == 2 || args.size() == 3)) {
      overflow(env, args[1], args.size() == 3 ? args[2] : "sgd");
    } else if (scenario == "options_differ") {
      options_differ(env);
    } else if (scenario == "dies") {
      dies(env);
    } else if (scenario == "stalls") {
      stalls(env);
    } else if (scenario == "ddp_parity" && args.size() == 3) {
      ddp_parity(env, args[1], args[2]);
    } else if (scenario == "low_precision" && args.size() == 2) {
      low_precision(env, args[1]);
    } else if (scenario == "fp8_delayed" && args.size() == 2) {
      fp8_delayed(env, args[1]);
    } else if (scenario == "join") {
      join();
    } else {
      std::fprintf(stderr,
                   "usage: amp_distributed_worker "
                   "skip|all_reduce|overflow|options_differ|dies|stalls|ddp_parity|low_precision|fp8_delayed|join "
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
