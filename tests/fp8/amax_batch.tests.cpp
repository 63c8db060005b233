// Batched amax reductions for delayed scaling (src/fp8/amax_batch.h) in one process: a stand-in
// "other rank" whose amax is always 3 makes the reduction change the values, and every model is
// trained twice, once with a reduction called per cast and once batched; the histories, scales
// and parameters must be the same bits, with one reduction per backward pass. The multi-process
// case over Gloo is in tests/distributed.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include <amp/fp8.h>

#include "fp8/amax_batch.h"
#include "fp8_helpers.h"

using amp::fp8::DelayedScalingOptions;

namespace {

// What another rank would contribute: an amax of 3 (the reduction is the elementwise maximum).
void max_with_other_rank(const at::Tensor& amaxes) {
  amaxes.copy_(at::maximum(amaxes, at::full_like(amaxes, 3.0)));
}

struct Calls {
  int per_cast = 0;
  std::vector<int64_t> batch_sizes;
};

DelayedScalingOptions per_cast_options(Calls& calls) {
  return DelayedScalingOptions().amax_history_len(4).amax_reduction([&calls](const at::Tensor& a) {
    ++calls.per_cast;
    max_with_other_rank(a);
  });
}

DelayedScalingOptions batched_options(Calls& calls, const void* ranks) {
  return DelayedScalingOptions().amax_history_len(4).amax_reduction(
      amp::fp8::detail::batched_amax_reduction(ranks, [&calls](const at::Tensor& amaxes) {
        calls.batch_sizes.push_back(amaxes.numel());
        max_with_other_rank(amaxes);
      }));
}

// Two delayed layers, 16 -> 16 -> 8, seeded alike whatever the options.
torch::nn::Sequential two_layers(const DelayedScalingOptions& options) {
  torch::manual_seed(5);
  return torch::nn::Sequential(
      Float8Linear(Float8LinearOptions(16, 16).recipe(Recipe::delayed(options))),
      Float8Linear(Float8LinearOptions(16, 8).recipe(Recipe::delayed(options))));
}

torch::Tensor batch(int step, int micro) {
  torch::manual_seed(300 + 10 * step + micro);
  return torch::randn({4, 16}) * (0.5 + step + micro);
}

// `steps` SGD steps of `micro_batches` forward/backward passes each, inside a float8 region.
void train(torch::nn::Sequential& model, int steps, int micro_batches) {
  torch::optim::SGD opt(model->parameters(), 0.05);
  Float8AutocastGuard float8;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    for (int micro = 0; micro < micro_batches; ++micro) {
      model->forward(batch(step, micro)).square().mean().backward();
    }
    opt.step();
  }
}

void check_same_state(torch::nn::Module& per_cast, torch::nn::Module& batched) {
  const auto expected_buffers = per_cast.named_buffers();
  const auto buffers = batched.named_buffers();
  REQUIRE(buffers.size() == 12);
  for (const auto& item : expected_buffers) {
    INFO(item.key());
    CHECK(same_bytes(buffers[item.key()], item.value()));
  }
  const auto parameters = batched.named_parameters();
  for (const auto& item : per_cast.named_parameters()) {
    INFO(item.key());
    CHECK(same_bytes(parameters[item.key()], item.value()));
  }
}

}  // namespace

TEST_CASE("Batched amax reductions give the bits of per-cast ones with one call per backward",
          "[fp8]") {
  const int micro_batches = GENERATE(1, 2);
  CAPTURE(micro_batches);
  Calls calls;
  int ranks = 0;
  auto per_cast = two_layers(per_cast_options(calls));
  auto batched = two_layers(batched_options(calls, &ranks));
  const auto issued_before = amp::fp8::detail::batched_amax_reductions_issued();
  train(per_cast, 3, micro_batches);
  train(batched, 3, micro_batches);

  // Two layers cast input, weight and grad_output once a pass.
  CHECK(calls.per_cast == 3 * micro_batches * 6);
  CHECK(calls.batch_sizes == std::vector<int64_t>(3 * micro_batches, 6));
  CHECK(amp::fp8::detail::batched_amax_reductions_issued() - issued_before == 3 * micro_batches);
  // The reduction did change the state: amaxes below 3 were raised to it.
  CHECK(torch::equal(batched->named_buffers()["0.amax_history_weight"].slice(0, 1),
                     torch::full({3}, 3.0)));
  check_same_state(*per_cast, *batched);
}

TEST_CASE("A layer cast twice before a flush applies its first amax before the second cast",
          "[fp8]") {
  // The same 16 -> 16 layer twice in one forward: its second input cast must use the scale the
  // first left, so the waiting amaxes are flushed in the middle of the forward.
  Calls calls;
  int ranks = 0;
  auto run = [](const DelayedScalingOptions& options) {
    torch::manual_seed(8);
    Float8Linear layer(Float8LinearOptions(16, 16).recipe(Recipe::delayed(options)));
    torch::optim::SGD opt(layer->parameters(), 0.05);
    Float8AutocastGuard float8;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      layer(layer(batch(step, 0))).square().mean().backward();
      opt.step();
    }
    return layer;
  };
  auto per_cast = run(per_cast_options(calls));
  auto batched = run(batched_options(calls, &ranks));
  // Per step: the second forward's input cast flushes the first's input and weight (2); the
  // backward's second grad_output cast flushes the second forward's casts and the first
  // grad_output (3); the end of the backward flushes the last grad_output (1).
  CHECK(calls.batch_sizes == std::vector<int64_t>{2, 3, 1, 2, 3, 1, 2, 3, 1});
  for (const auto& item : per_cast->named_buffers()) {
    INFO(item.key());
    CHECK(same_bytes(batched->named_buffers()[item.key()], item.value()));
  }
}

TEST_CASE("flush_delayed_scaling applies the amaxes of forwards without a backward", "[fp8]") {
  Calls calls;
  int ranks = 0;
  auto per_cast = two_layers(per_cast_options(calls));
  auto batched = two_layers(batched_options(calls, &ranks));
  {
    torch::NoGradGuard evaluation;
    Float8AutocastGuard float8;
    per_cast->forward(batch(0, 0));
    batched->forward(batch(0, 0));
  }
  // The batched layers' amaxes wait in history[0]; the scales have not moved yet.
  CHECK(calls.batch_sizes.empty());
  CHECK(batched->named_buffers()["0.amax_history_input"][0].item<float>() > 0);
  CHECK(batched->named_buffers()["0.scale_input"].item<float>() == 1.0f);
  amp::fp8::flush_delayed_scaling();
  CHECK(calls.batch_sizes == std::vector<int64_t>{4});
  check_same_state(*per_cast, *batched);
  // Nothing waits: a second flush issues nothing.
  amp::fp8::flush_delayed_scaling();
  CHECK(calls.batch_sizes.size() == 1);
}

TEST_CASE("Batched amax reductions are grouped by their ranks", "[fp8]") {
  // Two models reducing over different groups: one call per group per flush, each with its own
  // layers' amaxes.
  Calls first_calls, second_calls;
  int first_ranks = 0, second_ranks = 0;
  auto first = two_layers(batched_options(first_calls, &first_ranks));
  torch::manual_seed(6);
  Float8Linear second(Float8LinearOptions(16, 8).recipe(
      Recipe::delayed(batched_options(second_calls, &second_ranks))));
  {
    Float8AutocastGuard float8;
    auto loss = first->forward(batch(0, 0)).sum() + second(batch(0, 1)).sum();
    loss.backward();
  }
  CHECK(first_calls.batch_sizes == std::vector<int64_t>{6});
  CHECK(second_calls.batch_sizes == std::vector<int64_t>{3});
}

TEST_CASE("A second thread casting while the first's batched amaxes wait is refused",
          "[fp8][threads]") {
  // The waiting amaxes are per process: one thread's flush would reduce the other's, and across
  // ranks the collectives could go out of order. Refused before the cast changes anything.
  Calls calls;
  auto model = two_layers(batched_options(calls, &calls));
  {
    Float8AutocastGuard float8;
    model->forward(batch(0, 0));  // an evaluation forward: its amaxes wait
  }
  const auto history = model->named_buffers()["0.amax_history_input"].clone();
  std::string error;
  std::thread other([&] {
    try {
      Float8AutocastGuard float8;
      model->forward(batch(0, 1));
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
  });
  other.join();
  CHECK_THAT(error, Catch::Contains("two threads cast with a batched amax reduction") &&
                        Catch::Contains("one thread per process"));
  CHECK(same_bytes(model->named_buffers()["0.amax_history_input"], history));
  // Once the first thread's amaxes are applied, another thread may train.
  amp::fp8::flush_delayed_scaling();
  std::thread after([&] {
    Float8AutocastGuard float8;
    model->forward(batch(0, 2));
    amp::fp8::flush_delayed_scaling();
  });
  after.join();
}
