// Autocast state across threads: a new std::thread starts with autocast off, and
// capture_autocast_state + AutocastStateGuard carry a region's state into it.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <thread>

#include <amp/autocast.h>

#include "autocast_test_support.h"

namespace {

// What a worker thread sees: the CPU flags and the dtype an mm produces there.
struct WorkerView {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::Undefined;
  c10::ScalarType mm_dtype = c10::ScalarType::Undefined;
  bool cache_enabled = true;
};

WorkerView observe(const torch::Tensor& a) {
  return {at::autocast::is_autocast_enabled(torch::kCPU),
          at::autocast::get_autocast_dtype(torch::kCPU), torch::mm(a, a).scalar_type(),
          at::autocast::is_autocast_cache_enabled()};
}

}  // namespace

TEST_CASE("A new thread starts with autocast off even inside a region", "[autocast][threads]") {
  const auto a = torch::randn({3, 3});
  amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
  REQUIRE(torch::mm(a, a).scalar_type() == torch::kHalf);

  WorkerView view;
  std::thread worker([&] { view = observe(a); });
  worker.join();
  CHECK_FALSE(view.cpu_enabled);
  CHECK(view.cpu_dtype == torch::kBFloat16);  // the thread's own default, not the region's
  CHECK(view.mm_dtype == torch::kFloat);
}

TEST_CASE("A captured state applied in a worker thread gives the region's dtypes",
          "[autocast][threads]") {
  const auto a = torch::randn({3, 3});
  amp::AutocastState state;
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kHalf, true, /*cache_enabled=*/false);
    state = amp::capture_autocast_state();
  }
  WorkerView inside, after;
  std::thread worker([&] {
    {
      amp::AutocastStateGuard guard(state);
      inside = observe(a);
    }
    after = observe(a);
  });
  worker.join();
  CHECK(inside.cpu_enabled);
  CHECK(inside.cpu_dtype == torch::kHalf);
  CHECK(inside.mm_dtype == torch::kHalf);
  CHECK_FALSE(inside.cache_enabled);
  // The worker's own state is back once the guard is gone.
  CHECK_FALSE(after.cpu_enabled);
  CHECK(after.cpu_dtype == torch::kBFloat16);
  CHECK(after.mm_dtype == torch::kFloat);
  CHECK(after.cache_enabled);
}

TEST_CASE("A captured state lists every autocast device type", "[autocast][threads]") {
  amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
  const amp::AutocastState state = amp::capture_autocast_state();
  REQUIRE(state.devices.size() == at::autocast::_AUTOCAST_SUPPORTED_DEVICES.size());
  CHECK(state.cache_enabled);
  bool saw_cpu = false, saw_cuda = false;
  for (const auto& entry : state.devices) {
    CHECK(amp::is_autocast_available(entry.device));
    if (entry.device == torch::kCPU) {
      saw_cpu = true;
      CHECK(entry.enabled);
      CHECK(entry.dtype == torch::kHalf);
    } else if (entry.device == torch::kCUDA) {
      saw_cuda = true;
      CHECK_FALSE(entry.enabled);
      CHECK(entry.dtype == torch::kHalf);
    }
  }
  CHECK(saw_cpu);
  CHECK(saw_cuda);
}

TEST_CASE("AutocastStateGuard restores the thread's state on the same thread too",
          "[autocast][threads]") {
  const amp::AutocastState before = amp::capture_autocast_state();
  amp::AutocastState bf16;
  {
    amp::AutocastGuard autocast(torch::kCPU);
    bf16 = amp::capture_autocast_state();
  }
  {
    amp::AutocastGuard half(torch::kCPU, torch::kHalf, true, false);
    const amp::AutocastState inside_half = amp::capture_autocast_state();
    {
      amp::AutocastStateGuard guard(bf16);
      CHECK(amp::capture_autocast_state() == bf16);
    }
    CHECK(amp::capture_autocast_state() == inside_half);
  }
  CHECK(amp::capture_autocast_state() == before);
}

TEST_CASE("A worker's cached weight casts end with its AutocastStateGuard", "[autocast][threads]") {
  const auto x = torch::randn({4, 4});
  const auto weight = torch::randn({4, 4}, torch::requires_grad());
  amp::AutocastState state;
  {
    amp::AutocastGuard autocast(torch::kCPU);
    state = amp::capture_autocast_state();
  }
  const torch::autograd::Node* first = nullptr;
  const torch::autograd::Node* second = nullptr;
  torch::Tensor keep_first;
  std::thread worker([&] {
    {
      amp::AutocastStateGuard guard(state);
      keep_first = torch::mm(x, weight);
      first = amp_test::weight_cast_node(keep_first);
      second = amp_test::weight_cast_node(torch::mm(x, weight));
    }
  });
  worker.join();
  CHECK(first == second);
  amp::AutocastGuard autocast(torch::kCPU);
  CHECK(amp_test::weight_cast_node(torch::mm(x, weight)) != first);
}

TEST_CASE("AutocastStateGuard refuses a device type autocast does not know",
          "[autocast][threads][errors]") {
  amp::AutocastState state = amp::capture_autocast_state();
  state.devices.push_back({torch::kMeta, true, torch::kHalf});
  const amp::AutocastState before = amp::capture_autocast_state();
  CHECK_THROWS_WITH(amp::AutocastStateGuard(state),
                    Catch::Contains("User specified an unsupported autocast device_type 'meta'"));
  CHECK(amp::capture_autocast_state() == before);
}
