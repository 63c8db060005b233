// Fault-injection soak of GradScaler with LibTorch's SGD and amp's FusedAdamW: inf/NaN injected
// into random gradients, random update(new_scale) calls, extension options switched per segment,
// fp16 autocast in two segment kinds (whose gradients overflow on their own once the scale has
// grown), and checkpoints written by a forked child that is SIGKILLed at random points of the save.
// Invariants checked every step, and every surviving checkpoint resumed bit for bit.
//
// Usage: amp_scaler_soak [--steps N] [--segment N] [--checkpoint-every N] [--seed S] [--dir D]
// Prints one summary line per segment and a total; exit code 0 only when no invariant failed.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/remove_tree.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  int64_t steps = 100000;
  int64_t segment = 10000;
  int64_t checkpoint_every = 500;
  uint64_t seed = 1;
  fs::path dir = fs::temp_directory_path() / ("amp_soak_" + std::to_string(::getpid()));
};

// One segment's configuration: the optimizer, the scaler's extension options, and whether the
// forward pass runs under fp16 autocast.
struct Config {
  const char* name;
  bool fused;
  amp::GradScalerOptions options;
  bool fp16 = false;
};

std::vector<Config> configs() {
  const auto base = amp::GradScalerOptions().init_scale(1024.0).growth_interval(7);
  return {
      {"SGD, torch.amp's rule, fp16 autocast", false, base, true},
      {"FusedAdamW, torch.amp's rule", true, base},
      {"SGD, hysteresis 3", false, amp::GradScalerOptions(base).hysteresis(3)},
      {"FusedAdamW, hysteresis 2 consecutive, fp16 autocast", true,
       amp::GradScalerOptions(base).hysteresis(2).consecutive_hysteresis(true), true},
      {"SGD, bounds [1, 2^16] and counters", false,
       amp::GradScalerOptions(base).min_scale(1.0).max_scale(65536.0).track_counters(true)},
      {"FusedAdamW, bounds [2^-4, 2^20], hysteresis 2, counters", true,
       amp::GradScalerOptions(base)
           .min_scale(0.0625)
           .max_scale(1048576.0)
           .hysteresis(2)
           .track_counters(true)},
  };
}

// What happens at one step, decided from (seed, step) alone, so that a run resumed from a
// checkpoint meets exactly the same faults as the uninterrupted one.
struct StepPlan {
  bool inject = false;
  int64_t param = 0;
  double fraction = 0;  // position of the poisoned element within the gradient
  float value = 0;
  bool set_scale = false;
  double new_scale = 0;
};

StepPlan plan_for(uint64_t seed, int64_t step, const amp::GradScalerOptions& options) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  StepPlan plan;
  plan.inject = u(rng) < 0.05;
  plan.param = static_cast<int64_t>(rng() % 4);
  plan.fraction = u(rng);
  const double kind = u(rng);
  plan.value = kind < 0.4 ? INFINITY : kind < 0.7 ? -INFINITY : NAN;
  plan.set_scale = u(rng) < 0.01;
  const double lo = std::max(std::log2(std::max(options.min_scale(), 1e-6)), -10.0);
  const double hi = std::min(std::log2(options.max_scale()), 30.0);
  plan.new_scale = std::exp2(std::floor(lo + u(rng) * (hi - lo)));
  return plan;
}

// A model, its optimizer and its scaler.
struct Trainer {
  torch::nn::Linear first{nullptr};
  torch::nn::Linear second{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<amp::GradScaler> scaler;

  explicit Trainer(const Config& config, uint64_t seed) {
    torch::manual_seed(seed);
    first = torch::nn::Linear(16, 8);
    second = torch::nn::Linear(8, 4);
    std::vector<torch::Tensor> params = parameters();
    if (config.fused) {
      optimizer = std::make_unique<amp::optim::FusedAdamW>(
          params, amp::optim::FusedAdamWOptions(1e-3).amsgrad(true));
    } else {
      optimizer = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(1e-4));
    }
    scaler = std::make_unique<amp::GradScaler>(c10::DeviceType::CPU, config.options);
  }

  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> all = first->parameters();
    for (const auto& p : second->parameters()) all.push_back(p);
    return all;
  }
};

// Every tensor of the optimizer's state, in parameter order (LibTorch's SGD and amp's Adam).
std::vector<torch::Tensor> optimizer_state(const Trainer& t) {
  std::vector<torch::Tensor> tensors;
  for (const auto& p : t.parameters()) {
    const auto it = t.optimizer->state().find(p.unsafeGetTensorImpl());
    if (it == t.optimizer->state().end()) continue;
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
      tensors.push_back(sgd->momentum_buffer());
    } else if (const auto* adam =
                   dynamic_cast<const amp::optim::FusedAdamParamState*>(it->second.get())) {
      for (const auto& s :
           {adam->step(), adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()}) {
        if (s.defined()) tensors.push_back(s);
      }
    }
  }
  return tensors;
}

std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const auto& t : tensors) copies.push_back(t.detach().clone());
  return copies;
}

// Bitwise equality (NaN payloads included), which torch::equal does not give for NaN.
bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].detach().contiguous();
    const auto y = b[i].detach().contiguous();
    if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) return false;
    if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

std::string scaler_fingerprint(const amp::GradScaler& scaler) {
  std::string out;
  for (const auto& entry : scaler.state_dict())
    out += entry.key() + "=" + c10::str(entry.value()) + ";";
  return out;
}

struct Counts {
  int64_t steps = 0, injected = 0, skipped = 0, natural_skips = 0, set_scale = 0;
  int64_t checkpoints = 0, killed = 0, killed_mid_write = 0, survived = 0, resumes_verified = 0;
  int64_t failures = 0;

  void add(const Counts& c) {
    steps += c.steps, injected += c.injected, skipped += c.skipped;
    natural_skips += c.natural_skips, set_scale += c.set_scale, checkpoints += c.checkpoints;
    killed += c.killed, killed_mid_write += c.killed_mid_write, survived += c.survived;
    resumes_verified += c.resumes_verified, failures += c.failures;
  }
};

void print_counts(const char* label, const Counts& c) {
  const auto n = [](int64_t v) { return static_cast<long long>(v); };
  std::printf(
      "%s: %lld steps, %lld with an injected inf/NaN, %lld skipped (%lld without an injection), "
      "%lld update(new_scale); %lld checkpoints: %lld killed (%lld of them mid-write), %lld "
      "left alone; %lld resumes verified; %lld failures\n",
      label, n(c.steps), n(c.injected), n(c.skipped), n(c.natural_skips), n(c.set_scale),
      n(c.checkpoints), n(c.killed), n(c.killed_mid_write), n(c.survived), n(c.resumes_verified),
      n(c.failures));
}

class Soak {
 public:
  Soak(const Args& args, Counts& counts) : args_(args), counts_(counts) {}

  void fail(int64_t step, const std::string& what) {
    ++counts_.failures;
    if (counts_.failures <= 20)
      std::fprintf(stderr, "FAILED at step %lld: %s\n", static_cast<long long>(step), what.c_str());
  }

  // One training step of `t` at `step`; checks the invariants when `check` is set.
  void train_step(Trainer& t, const Config& config, int64_t step, bool check) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(args_.seed * 1000003 + step);
    const auto x = torch::randn({8, 16}, gen);
    const auto y = torch::randn({8, 4}, gen);
    const StepPlan plan = plan_for(args_.seed, step, config.options);
    t.optimizer->zero_grad();
    torch::Tensor loss;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (config.fp16) autocast.emplace(c10::DeviceType::CPU, at::kHalf);
      loss = torch::nn::functional::mse_loss(t.second(torch::relu(t.first(x))), y);
    }
    t.scaler->scale(loss).backward();
    std::vector<torch::Tensor> params = t.parameters();
    if (plan.inject) {
      auto grad = params[plan.param].mutable_grad().view({-1});
      const auto index = static_cast<int64_t>(plan.fraction * static_cast<double>(grad.numel()));
      grad[std::min(index, grad.numel() - 1)].fill_(plan.value);
    }
    std::vector<torch::Tensor> params_before, state_before;
    if (check) {
      params_before = snapshot(params);
      state_before = snapshot(optimizer_state(t));
    }
    const amp::StepResult result = t.scaler->step(*t.optimizer);
    const bool taken = result.read_taken();
    if (plan.set_scale) {
      t.scaler->update(plan.new_scale);
    } else {
      t.scaler->update();
    }
    if (!check) return;
    ++counts_.steps;
    counts_.injected += plan.inject;
    counts_.set_scale += plan.set_scale;
    if (!taken) {
      ++counts_.skipped;
      counts_.natural_skips += !plan.inject;
      if (!same_bits(params_before, params)) fail(step, "a skipped step changed a parameter");
      // A first step skipped before any state exists creates none.
      const auto state_after = optimizer_state(t);
      if (!state_before.empty() && !same_bits(state_before, state_after)) {
        fail(step, "a skipped step changed the optimizer's state");
      }
    } else if (plan.inject) {
      fail(step, "a step with an injected inf/NaN was taken");
    }
    for (const auto& p : params) {
      if (!torch::isfinite(p).all().item<bool>()) fail(step, "a parameter is not finite");
    }
    const double scale = t.scaler->get_scale();
    const auto& o = config.options;
    if (!(std::isfinite(scale) && scale > 0.0 && scale >= o.min_scale() &&
          scale <= o.max_scale())) {
      fail(step, "the scale " + std::to_string(scale) + " left [min_scale, max_scale]");
    }
  }

  // Writes a checkpoint of `t` after `step` from a forked child, which is killed at a random
  // moment half of the time. Returns whether the checkpoint file now holds `step`.
  bool checkpoint(Trainer& t, int64_t step, const fs::path& path, std::mt19937_64& rng) {
    ++counts_.checkpoints;
    std::fflush(nullptr);
    // The child reports the end of its save through a pipe, so the parent learns how long the
    // save itself takes (waitpid also waits for the child's teardown).
    int done[2];
    if (::pipe(done) != 0) {
      fail(step, "pipe failed");
      return false;
    }
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(done[0]);
      torch::serialize::OutputArchive archive;
      torch::serialize::OutputArchive model, optimizer, scaler;
      t.first->save(model);
      torch::serialize::OutputArchive second;
      t.second->save(second);
      model.write("second", second);
      t.optimizer->save(optimizer);
      t.scaler->save(scaler);
      archive.write("model", model);
      archive.write("optimizer", optimizer);
      archive.write("scaler", scaler);
      archive.write("step", c10::IValue(step));
      fs::path partial = path;
      partial += ".partial";
      archive.save_to(partial.string());
      std::error_code ec;
      fs::rename(partial, path, ec);
      const char byte = 1;
      (void)!::write(done[1], &byte, 1);
      ::_exit(ec ? 3 : 0);
    }
    ::close(done[1]);
    if (child < 0) {
      ::close(done[0]);
      fail(step, "fork failed");
      return false;
    }
    // Half of the saves are killed at a uniform moment within the time a whole save takes
    // (measured on the saves left alone), so kills land before, during and after the write.
    const auto started = std::chrono::steady_clock::now();
    const bool kill = rng() % 2 == 0;
    if (kill) {
      const auto window = std::max<int64_t>(save_micros_, 100);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<uint64_t>(window)));
      ::kill(child, SIGKILL);
    }
    if (!kill) {
      char byte = 0;
      if (::read(done[0], &byte, 1) == 1) {
        save_micros_ = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - started)
                           .count();
      }
    }
    ::close(done[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    if (WIFSIGNALED(status)) {
      ++counts_.killed;
      // A partial file left behind means the kill landed during the write.
      fs::path partial = path;
      partial += ".partial";
      std::error_code ec;
      if (fs::remove(partial, ec)) ++counts_.killed_mid_write;
      return false;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fail(step, "the checkpoint child failed");
      return false;
    }
    ++counts_.survived;
    return true;
  }

  // The step a checkpoint file holds (-1 when it cannot be read).
  int64_t saved_step(const fs::path& path, int64_t now) {
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path.string());
      c10::IValue step;
      archive.read("step", step);
      return step.toInt();
    } catch (const std::exception& e) {
      fail(now, std::string("a checkpoint file left by a save does not load: ") + e.what());
      return -1;
    }
  }

  // Loads the checkpoint at `path` into a fresh trainer; checks the step it holds.
  std::unique_ptr<Trainer> load(const Config& config, const fs::path& path, int64_t expected_step,
                                int64_t now) {
    auto t = std::make_unique<Trainer>(config, args_.seed + 7);  // other initial values
    try {
      torch::serialize::InputArchive archive, model, second, optimizer, scaler;
      archive.load_from(path.string());
      c10::IValue step;
      archive.read("step", step);
      if (step.toInt() != expected_step) {
        fail(now, "the checkpoint holds step " + std::to_string(step.toInt()) + ", not " +
                      std::to_string(expected_step));
      }
      archive.read("model", model);
      t->first->load(model);
      model.read("second", second);
      t->second->load(second);
      archive.read("optimizer", optimizer);
      t->optimizer->load(optimizer);
      archive.read("scaler", scaler);
      t->scaler->load(scaler);
    } catch (const std::exception& e) {
      fail(now, std::string("a surviving checkpoint does not load: ") + e.what());
      return nullptr;
    }
    return t;
  }

  void run_segment(const Config& config, int64_t first_step, int64_t last_step) {
    const fs::path path = args_.dir / ("segment_" + std::to_string(first_step) + ".pt");
    std::mt19937_64 rng(args_.seed + static_cast<uint64_t>(first_step));
    Trainer main(config, args_.seed);
    std::unique_ptr<Trainer> twin;  // resumed from the last surviving checkpoint, in lockstep
    int64_t twin_until = 0;
    int64_t last_saved = -1;
    constexpr int64_t kLockstep = 25;
    for (int64_t step = first_step; step < last_step; ++step) {
      train_step(main, config, step, /*check=*/true);
      if (twin) {
        train_step(*twin, config, step, /*check=*/false);
        if (step == twin_until) {
          if (!same_bits(main.parameters(), twin->parameters()) ||
              !same_bits(optimizer_state(main), optimizer_state(*twin)) ||
              scaler_fingerprint(*main.scaler) != scaler_fingerprint(*twin->scaler)) {
            fail(step, "a run resumed from a checkpoint differs from the uninterrupted one");
          }
          ++counts_.resumes_verified;
          twin.reset();
        }
      }
      if ((step + 1 - first_step) % args_.checkpoint_every == 0 && step + 1 < last_step) {
        const bool survived = checkpoint(main, step, path, rng);
        // A killed save leaves the previous checkpoint whole (or none, before the first), unless
        // the child was killed after its rename: then the file is this step's, complete.
        std::error_code ec;
        if (!fs::exists(path, ec)) {
          if (survived || last_saved >= 0) fail(step, "the checkpoint file is gone");
          continue;
        }
        const int64_t held = saved_step(path, step);
        if (held != step && (survived || held != last_saved)) {
          fail(step, "the checkpoint file holds step " + std::to_string(held) + "; expected " +
                         (survived ? std::to_string(step) : std::to_string(last_saved)));
          continue;
        }
        if (held == step) last_saved = step;
        auto loaded = load(config, path, held, step);  // every surviving file loads whole
        if (loaded && held == step && !twin) {
          twin = std::move(loaded);
          twin_until = step + kLockstep;
        }
      }
    }
  }

 private:
  const Args& args_;
  Counts& counts_;
  int64_t save_micros_ = 3000;  // how long the last save left alone took
};

int64_t parse_int(const char* flag, const char* value) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || v <= 0) {
    std::fprintf(stderr, "amp_scaler_soak: %s needs a positive integer, got '%s'\n", flag, value);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps")
      args.steps = parse_int(argv[i], argv[i + 1]);
    else if (flag == "--segment")
      args.segment = parse_int(argv[i], argv[i + 1]);
    else if (flag == "--checkpoint-every")
      args.checkpoint_every = parse_int(argv[i], argv[i + 1]);
    else if (flag == "--seed")
      args.seed = static_cast<uint64_t>(parse_int(argv[i], argv[i + 1]));
    else if (flag == "--dir")
      args.dir = argv[i + 1];
    else {
      std::fprintf(stderr, "amp_scaler_soak: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "amp_scaler_soak: option %s needs a value\n", argv[argc - 1]);
    return 2;
  }
  // One thread: deterministic CPU kernels, and nothing running in other threads at fork().
  at::set_num_threads(1);
  fs::create_directories(args.dir);
  const auto kinds = configs();
  Counts total;
  const auto start = std::chrono::steady_clock::now();
  int64_t index = 0;
  for (int64_t first = 0; first < args.steps; first += args.segment, ++index) {
    const Config& config = kinds[static_cast<size_t>(index) % kinds.size()];
    Counts counts;
    Soak soak(args, counts);
    soak.run_segment(config, first, std::min(first + args.segment, args.steps));
    print_counts(("segment " + std::to_string(index) + " (" + config.name + ")").c_str(), counts);
    std::fflush(stdout);
    total.add(counts);
  }
  amp_test::remove_tree(args.dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  print_counts("total", total);
  std::printf("%.1f s\n", seconds);
  return total.failures == 0 ? 0 : 1;
}
