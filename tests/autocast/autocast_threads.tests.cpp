// Autocast state across threads: capture_autocast_state + AutocastStateGuard carry a region's
// state into a worker thread, read back there through ATen and through the ops' dtypes; and the
// process-wide weight-cast cache as Python's torch.autocast shows it in threads (torch 2.14).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/autocast_mode.h>

#include <string>
#include <thread>

#include <amp/autocast.h>

#include "support/autocast_helpers.h"

namespace {

using amp_test::AtenAutocastState;
using amp_test::full_autocast_state;
using amp_test::FullAutocastState;
using amp_test::kAutocastDevices;
using amp_test::nesting_count;
using amp_test::weight_cast_node;

// What a thread sees, from ATen's getters and from the dtype an mm produces there.
struct ThreadView {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::Undefined;
  c10::ScalarType mm_dtype = c10::ScalarType::Undefined;
  bool cache_enabled = true;
  int nesting = -1;
};

ThreadView observe(const torch::Tensor& a) {
  return {at::autocast::is_autocast_enabled(torch::kCPU),
          at::autocast::get_autocast_dtype(torch::kCPU), torch::mm(a, a).scalar_type(),
          at::autocast::is_autocast_cache_enabled(), nesting_count()};
}

}  // namespace

TEST_CASE("AutocastStateGuard gives a worker thread the capturing thread's region",
          "[autocast][threads]") {
  const auto a = torch::randn({3, 3});
  amp::AutocastGuard autocast(torch::kCPU, torch::kHalf, true, /*cache_enabled=*/false);
  const amp::AutocastState state = amp::capture_autocast_state();

  ThreadView before, inside, after;
  std::thread worker([&] {
    before = observe(a);  // ATen: a new thread starts with autocast off and its own defaults
    {
      amp::AutocastStateGuard guard(state);
      inside = observe(a);
    }
    after = observe(a);
  });
  worker.join();

  CHECK_FALSE(before.cpu_enabled);
  CHECK(before.mm_dtype == torch::kFloat);

  CHECK(inside.cpu_enabled);
  CHECK(inside.cpu_dtype == torch::kHalf);
  CHECK(inside.mm_dtype == torch::kHalf);
  CHECK_FALSE(inside.cache_enabled);
  CHECK(inside.nesting == 1);

  // The worker's own state is back once the guard is gone.
  CHECK_FALSE(after.cpu_enabled);
  CHECK(after.cpu_dtype == torch::kBFloat16);
  CHECK(after.mm_dtype == torch::kFloat);
  CHECK(after.cache_enabled);
  CHECK(after.nesting == 0);
}

TEST_CASE("A captured state holds every autocast device type's flags as ATen reports them",
          "[autocast][threads]") {
  // Set through ATen directly, on device types other than CPU too, so nothing here comes from amp.
  AtenAutocastState scope;
  scope.set(torch::kCPU, true, torch::kHalf);
  scope.set(torch::kXPU, true, torch::kBFloat16);
  scope.set(torch::kHPU, false, torch::kHalf);
  at::autocast::set_autocast_cache_enabled(false);
  const FullAutocastState expected = full_autocast_state();

  const amp::AutocastState state = amp::capture_autocast_state();
  REQUIRE(state.devices.size() == kAutocastDevices.size());
  for (size_t i = 0; i < kAutocastDevices.size(); ++i) {
    CAPTURE(c10::DeviceTypeName(kAutocastDevices[i]));
    CHECK(state.devices[i].device == kAutocastDevices[i]);
    CHECK(state.devices[i].enabled == expected.devices[i].enabled);
    CHECK(state.devices[i].dtype == expected.devices[i].dtype);
  }
  CHECK_FALSE(state.cache_enabled);

  // Applied in a fresh thread, ATen there reports the same flags (and one region's nesting).
  FullAutocastState in_worker;
  std::thread worker([&] {
    amp::AutocastStateGuard guard(state);
    in_worker = full_autocast_state();
  });
  worker.join();
  CHECK(in_worker.devices == expected.devices);
  CHECK(in_worker.cache_enabled == expected.cache_enabled);
  CHECK(in_worker.nesting == 1);
}

TEST_CASE("AutocastStateGuard restores the thread's own state on exit", "[autocast][threads]") {
  const FullAutocastState outside = full_autocast_state();
  amp::AutocastState bf16_with_cache;
  {
    AtenAutocastState scope;
    scope.set(torch::kCPU, true, torch::kBFloat16);
    at::autocast::set_autocast_cache_enabled(true);
    bf16_with_cache = amp::capture_autocast_state();
  }
  {
    amp::AutocastGuard half(torch::kCPU, torch::kHalf, true, /*cache_enabled=*/false);
    const FullAutocastState inside_half = full_autocast_state();
    {
      amp::AutocastStateGuard guard(bf16_with_cache);
      CHECK(at::autocast::is_autocast_enabled(torch::kCPU));
      CHECK(at::autocast::get_autocast_dtype(torch::kCPU) == torch::kBFloat16);
      CHECK(at::autocast::is_autocast_cache_enabled());
      CHECK(nesting_count() == inside_half.nesting + 1);
      CHECK(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kBFloat16);
    }
    CHECK(full_autocast_state() == inside_half);
    CHECK(at::autocast::get_autocast_dtype(torch::kCPU) == torch::kHalf);
    CHECK_FALSE(at::autocast::is_autocast_cache_enabled());
  }
  CHECK(full_autocast_state() == outside);
}

// Python, torch 2.14, CPU: with a region open in the main thread, y1 = mm(x, w); a
// threading.Thread in its own torch.autocast("cpu") region computing mm(x, w) gets the same cast
// node as y1 (the cache is shared); after that thread's region has ended, the main thread's next
// mm(x, w) gets a new node (the worker's exit cleared the cache).
TEST_CASE("A worker's region shares the weight-cast cache and its exit clears it for all threads",
          "[autocast][threads]") {
  const auto x = torch::randn({4, 4});
  const auto weight = torch::randn({4, 4}, torch::requires_grad());
  amp::AutocastGuard autocast(torch::kCPU);
  const amp::AutocastState state = amp::capture_autocast_state();
  const auto y1 = torch::mm(x, weight);

  torch::Tensor y2;
  std::thread worker([&] {
    amp::AutocastStateGuard guard(state);
    y2 = torch::mm(x, weight);
  });
  worker.join();
  CHECK(weight_cast_node(y2) == weight_cast_node(y1));

  const auto y3 = torch::mm(x, weight);
  CHECK(weight_cast_node(y3) != weight_cast_node(y1));
  // Values are the same either way: a cast again is the same cast.
  CHECK(torch::equal(y3, y1));
}

TEST_CASE("A worker's cached weight casts last until its AutocastStateGuard ends",
          "[autocast][threads]") {
  const auto x = torch::randn({4, 4});
  const auto weight = torch::randn({4, 4}, torch::requires_grad());
  amp::AutocastState state;
  {
    amp::AutocastGuard autocast(torch::kCPU);
    state = amp::capture_autocast_state();
  }
  torch::Tensor in_inner, after_inner;  // keep the cast nodes alive, so addresses are not reused
  std::thread worker([&] {
    amp::AutocastStateGuard guard(state);
    {
      // The guard is the outer region: leaving this inner one must not clear the cache.
      amp::AutocastGuard inner(torch::kCPU);
      in_inner = torch::mm(x, weight);
    }
    after_inner = torch::mm(x, weight);
  });
  worker.join();
  CHECK(weight_cast_node(after_inner) == weight_cast_node(in_inner));

  // The guard's end cleared the cache: a new region on this thread casts again.
  amp::AutocastGuard autocast(torch::kCPU);
  CHECK(weight_cast_node(torch::mm(x, weight)) != weight_cast_node(in_inner));
}

// Python, torch 2.14, CPU: a region with dtype=torch.bfloat16 open in the main thread has cached
// w; a threading.Thread in torch.autocast("cpu", dtype=torch.float16) computing mm(x, w) raises
// "expected m1 and m2 to have the same dtype, but got: c10::Half != c10::BFloat16": the cache is
// keyed by the weight, not by the dtype. AutocastStateGuard's documentation relies on this.
TEST_CASE("Threads with different autocast dtypes at the same time can get each other's casts",
          "[autocast][threads]") {
  const auto x = torch::randn({4, 4});
  const auto weight = torch::randn({4, 4}, torch::requires_grad());
  amp::AutocastState half_state;
  {
    amp::AutocastGuard half(torch::kCPU, torch::kHalf);
    half_state = amp::capture_autocast_state();
  }
  amp::AutocastGuard bf16(torch::kCPU, torch::kBFloat16);
  const auto y = torch::mm(x, weight);
  REQUIRE(y.scalar_type() == torch::kBFloat16);

  std::string error;
  std::thread worker([&] {
    amp::AutocastStateGuard guard(half_state);
    try {
      torch::mm(x, weight);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
  });
  worker.join();
  CHECK_THAT(error, Catch::Contains("expected m1 and m2 to have the same dtype") &&
                        Catch::Contains("Half != c10::BFloat16"));
}

TEST_CASE("AutocastStateGuard refuses a device type autocast does not know",
          "[autocast][threads][errors]") {
  amp::AutocastState state = amp::capture_autocast_state();
  state.devices.push_back({torch::kMeta, true, torch::kHalf});
  const FullAutocastState before = full_autocast_state();
  CHECK_THROWS_WITH(amp::AutocastStateGuard(state),
                    Catch::Contains("User specified an unsupported autocast device_type 'meta'"));
  CHECK(full_autocast_state() == before);
}
