// GradScaler's thread contract: a call that overlaps another thread's call is refused with an
// error and leaves the scaler intact; calls that take turns, and re-entry from one thread, work.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <amp/grad_scaler.h>

#include "support/scaler_helpers.h"

namespace {

// SGD whose step() first runs `during`: a way to act while the scaler is inside step().
class SgdWithHook : public torch::optim::SGD {
 public:
  SgdWithHook(std::vector<torch::Tensor> params, std::function<void()> during)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.5)),
        during_(std::move(during)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    during_();
    return torch::optim::SGD::step(std::move(closure));
  }

 private:
  std::function<void()> during_;
};

// Runs `call` on another thread and returns the message it threw ("" when it returned).
std::string error_from_other_thread(const std::function<void()>& call) {
  std::string message;
  std::thread other([&] {
    try {
      call();
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    }
  });
  other.join();
  return message;
}

}  // namespace

TEST_CASE("A call from a second thread while the first is inside the scaler is refused",
          "[scaler][threads]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(8.0));
  auto param = make_param(2);
  std::vector<std::string> errors;
  SgdWithHook optimizer({param}, [&] {
    errors.push_back(error_from_other_thread([&] { scaler.update(); }));
    errors.push_back(error_from_other_thread([&] { scaler.update(4.0); }));
    errors.push_back(error_from_other_thread([&] { (void)scaler.get_scale(); }));
    errors.push_back(error_from_other_thread([&] { (void)scaler.state_dict(); }));
  });
  scaler.scale(torch::ones({}));
  set_grad(param, torch::full({2}, 16.0f));
  scaler.step(optimizer);

  REQUIRE(errors.size() == 4);
  CHECK_THAT(errors[0], Contains("GradScaler::update was called while another thread is inside "
                                 "GradScaler::step of the same scaler. A GradScaler is not "
                                 "thread-safe: call it from one thread at a time"));
  CHECK_THAT(errors[1], Contains("GradScaler::update was called while another thread"));
  CHECK_THAT(errors[2], Contains("GradScaler::get_scale was called while another thread"));
  CHECK_THAT(errors[3], Contains("GradScaler::state_dict was called while another thread"));
  // The refused calls changed nothing: the step was taken with grads 16 / 8 = 2, the scale is
  // still 8, and this iteration's update sees its step.
  CHECK(param.detach().equal(torch::full({2}, 1.0f - 0.5f * 2.0f)));
  CHECK(scaler.get_scale() == 8.0);
  REQUIRE_NOTHROW(scaler.update());
  CHECK(scaler.get_growth_tracker() == 1);
}

TEST_CASE("The thread inside the scaler may call it again, and threads may take turns",
          "[scaler][threads]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(8.0));
  auto param = make_param(2);
  double seen_inside = 0.0;
  SgdWithHook optimizer({param}, [&] { seen_inside = scaler.get_scale(); });
  const auto iteration = [&] {
    scaler.scale(torch::ones({}));
    set_grad(param, torch::full({2}, 8.0f));
    scaler.unscale_(optimizer);
    scaler.step(optimizer);
    scaler.update();
  };
  iteration();
  CHECK(seen_inside == 8.0);
  // Calls that do not overlap may come from any thread.
  std::thread other(iteration);
  other.join();
  iteration();
  CHECK(scaler.get_growth_tracker() == 3);
  CHECK(param.detach().equal(torch::full({2}, 1.0f - 3 * 0.5f)));
}

TEST_CASE("Two threads training through one scaler get errors, never a corrupted scaler",
          "[scaler][threads]") {
  // Without the detection this corrupts the heap (unscale_ in one thread while update() clears
  // the per-optimizer map in the other). Every failure must be the refusal or one of the
  // iteration-order errors an interleaving can cause (another thread's update() ends this
  // thread's iteration); the scaler stays usable.
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(4.0).growth_interval(1000000));
  std::atomic<int> refused{0};
  std::atomic<int> unexpected{0};
  std::string first_unexpected;
  std::atomic<bool> recorded{false};
  const auto train = [&] {
    auto param = make_param(64);
    torch::optim::SGD optimizer({param}, 0.0);
    for (int i = 0; i < 400; ++i) {
      try {
        scaler.scale(torch::ones({}));
        set_grad(param, torch::ones({64}));
        scaler.unscale_(optimizer);
        scaler.step(optimizer);
        scaler.update();
      } catch (const c10::Error& e) {
        const std::string message = e.what_without_backtrace();
        if (message.find("while another thread is inside GradScaler::") != std::string::npos) {
          ++refused;
        } else if (message.find("No inf checks were recorded") == std::string::npos &&
                   message.find("has already been called") == std::string::npos &&
                   message.find("is being called after step()") == std::string::npos) {
          if (!recorded.exchange(true)) first_unexpected = message;
          ++unexpected;
        }
      }
    }
  };
  std::thread a(train);
  std::thread b(train);
  a.join();
  b.join();
  INFO(first_unexpected);
  CHECK(unexpected == 0);
  WARN("overlapping calls refused: " << refused.load());
  // Still a working scaler: a clean iteration from this thread.
  auto param = make_param(2);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.update(4.0);
  scaler.scale(torch::ones({}));
  set_grad(param, torch::ones({2}));
  CHECK(scaler.step(optimizer).read_taken());
  scaler.update();
  CHECK(scaler.get_scale() == 4.0);
}

TEST_CASE("Scalers in different threads train independently, as each would alone",
          "[scaler][threads]") {
  // amp's shared pieces (op registration, the CPU loop choice, the update kernels) must be safe
  // for concurrent scalers; each thread's result equals the same training run on its own.
  const auto train = [](int seed, double* scale_out, float* param_out) {
    auto scaler = cpu_scaler(GradScalerOptions().init_scale(1024.0).growth_interval(3));
    auto param = make_param(256);
    torch::optim::SGD optimizer({param}, 0.01);
    for (int i = 0; i < 200; ++i) {
      scaler.scale(torch::ones({}));
      const float g = (i + seed) % 17 == 0 ? INFINITY : static_cast<float>((i % 5) + seed);
      set_grad(param, torch::full({256}, g));
      scaler.unscale_(optimizer);
      scaler.step(optimizer);
      scaler.update();
    }
    *scale_out = scaler.get_scale();
    *param_out = param.detach()[0].item<float>();
  };
  double alone_scale[2];
  float alone_param[2];
  for (int s = 0; s < 2; ++s) train(s + 1, &alone_scale[s], &alone_param[s]);
  double scale[2];
  float param[2];
  std::thread a(train, 1, &scale[0], &param[0]);
  std::thread b(train, 2, &scale[1], &param[1]);
  a.join();
  b.join();
  for (int s = 0; s < 2; ++s) {
    CHECK(scale[s] == alone_scale[s]);
    CHECK(param[s] == alone_param[s]);
  }
}
