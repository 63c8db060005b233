// amp::checkpoint: the same numbers as the plain function (dropout, autocast, nesting, several
// outputs, non-tensor arguments, autograd::grad), activations really dropped, one recomputation
// per backward, early stop, float8 delayed scaling, checkpoint_sequential and CheckpointWrapper,
// GradScaler with a fused optimizer, and the errors. The comparison with Python's
// torch.utils.checkpoint is in tests/parity/checkpoint_parity.py.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <amp/autocast.h>
#include <amp/checkpoint.h>
#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "support/host_reads.h"
#include "support/optim_helpers.h"

namespace {

// Linear -> dropout -> GELU -> Linear, the block the tests checkpoint.
struct Block : torch::nn::Module {
  explicit Block(int64_t width = 16) {
    fc1 = register_module("fc1", torch::nn::Linear(width, 2 * width));
    fc2 = register_module("fc2", torch::nn::Linear(2 * width, width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::gelu(torch::dropout(fc1(x), 0.3, /*train=*/true)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct Run {
  torch::Tensor output, input_grad;
  std::vector<torch::Tensor> param_grads;
  torch::Tensor rng_after;  // a draw after backward: the RNG state the run left
};

// Seeds, builds the block, runs forward (through `call`) and backward, and records everything.
template <typename Call>
Run run(const Call& call, std::optional<torch::Dtype> autocast = std::nullopt) {
  torch::manual_seed(7);
  auto block = std::make_shared<Block>();
  auto x = torch::randn({4, 16}).requires_grad_(true);
  torch::Tensor out;
  {
    amp::AutocastGuard guard(c10::DeviceType::CPU, autocast, autocast.has_value());
    out = call(*block, x);
  }
  out.to(torch::kFloat).square().sum().backward();
  Run r{out.detach(), x.grad(), {}, torch::rand({4})};
  for (const auto& p : block->parameters()) r.param_grads.push_back(p.grad().clone());
  return r;
}

bool same_run(const Run& a, const Run& b) {
  if (!same_bits(a.output, b.output) || !same_bits(a.input_grad, b.input_grad) ||
      !same_bits(a.rng_after, b.rng_after) || a.param_grads.size() != b.param_grads.size()) {
    return false;
  }
  for (size_t i = 0; i < a.param_grads.size(); ++i) {
    if (!same_bits(a.param_grads[i], b.param_grads[i])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("A checkpointed block gives the plain block's output and gradients, bit for bit",
          "[checkpoint]") {
  const auto plain = [](Block& b, const torch::Tensor& x) { return b.forward(x); };
  const auto checkpointed = [](Block& b, const torch::Tensor& x) {
    return amp::checkpoint([&b](const torch::Tensor& t) { return b.forward(t); }, x);
  };
  SECTION("float32") { CHECK(same_run(run(checkpointed), run(plain))); }
  SECTION("CPU bfloat16 autocast: recomputed under the forward's autocast") {
    const auto a = run(checkpointed, torch::kBFloat16);
    CHECK(a.output.scalar_type() == torch::kBFloat16);
    CHECK(same_run(a, run(plain, torch::kBFloat16)));
  }
  SECTION("CPU float16 autocast") {
    CHECK(same_run(run(checkpointed, torch::kHalf), run(plain, torch::kHalf)));
  }
  SECTION("without preserve_rng_state the recomputed dropout mask differs") {
    const auto loose = [](Block& b, const torch::Tensor& x) {
      return amp::checkpoint(
          amp::CheckpointOptions().preserve_rng_state(false),
          [&b](const torch::Tensor& t) { return b.forward(t); }, x);
    };
    const auto a = run(loose);
    const auto p = run(plain);
    CHECK(same_bits(a.output, p.output));  // the forward is the same
    CHECK_FALSE(same_bits(a.input_grad, p.input_grad));
  }
}

TEST_CASE("The checkpointed function keeps no activation and is recomputed once per backward",
          "[checkpoint]") {
  torch::manual_seed(3);
  auto w = torch::randn({64, 64}).requires_grad_(true);
  int calls = 0;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> hidden_storage;
  const auto fn = [&](const torch::Tensor& x) {
    ++calls;
    auto hidden = torch::tanh(x.matmul(w));  // saved by tanh's and matmul's backward
    if (calls == 1) hidden_storage.emplace(hidden.storage().getWeakStorageImpl());
    return hidden.matmul(w).sum(1);
  };
  auto x = torch::randn({8, 64}).requires_grad_(true);
  auto y = amp::checkpoint(fn, x);
  CHECK(calls == 1);
  CHECK(hidden_storage->expired());  // the activation is gone after the forward
  // The same without checkpoint keeps it.
  {
    calls = 0;
    auto kept = fn(x);
    CHECK_FALSE(hidden_storage->expired());
  }
  calls = 1;
  y.sum().backward({}, /*retain_graph=*/true);
  CHECK(calls == 2);
  const auto first = w.grad().clone();
  w.mutable_grad().reset();
  y.sum().backward();  // a second backward (retained graph): one more recomputation
  CHECK(calls == 3);
  CHECK(same_bits(w.grad(), first));
}

TEST_CASE("Early stop ends the recomputation once every dropped tensor exists", "[checkpoint]") {
  auto w = torch::randn({8, 8}).requires_grad_(true);
  int tail_runs = 0;
  const auto fn = [&](const torch::Tensor& x) {
    auto y = torch::sigmoid(x.matmul(w));  // saves tensors
    ++tail_runs;                           // after the last saved tensor
    return y * 2.0;                        // a scalar product: mul saves nothing for x
  };
  for (const bool early : {true, false}) {
    tail_runs = 0;
    auto x = torch::randn({4, 8}).requires_grad_(true);
    amp::checkpoint(amp::CheckpointOptions().early_stop(early), fn, x).sum().backward();
    CHECK(tail_runs == (early ? 1 : 2));
  }
}

TEST_CASE("Nested checkpoints, several outputs, a non-tensor argument and an input without grad",
          "[checkpoint]") {
  const auto body = [](Block& b, const torch::Tensor& x, const torch::Tensor& bias, double scale,
                       bool nested) {
    const auto inner = [&b](const torch::Tensor& t) { return b.fc1(t).relu(); };
    auto h = nested ? amp::checkpoint(inner, x) : inner(x);
    auto out = b.fc2(torch::dropout(h, 0.2, true)) * scale + bias;
    return std::make_tuple(out, h.mean());
  };
  const auto go = [&](bool checkpointed) {
    torch::manual_seed(11);
    Block b;
    auto x = torch::randn({3, 16}).requires_grad_(true);
    const auto bias = torch::randn({16});  // no grad
    std::tuple<torch::Tensor, torch::Tensor> outs;
    if (checkpointed) {
      outs = amp::checkpoint([&](const torch::Tensor& t, const torch::Tensor& c,
                                 double s) { return body(b, t, c, s, /*nested=*/true); },
                             x, bias, 0.5);
    } else {
      outs = body(b, x, bias, 0.5, false);
    }
    (std::get<0>(outs).square().sum() + std::get<1>(outs)).backward();
    return std::vector<torch::Tensor>{std::get<0>(outs).detach(), x.grad(), b.fc1->weight.grad(),
                                      b.fc2->weight.grad(), b.fc2->bias.grad()};
  };
  const auto a = go(true);
  const auto p = go(false);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(same_bits(a[i], p[i]));
  }
}

TEST_CASE("torch::autograd::grad through a checkpoint gives backward's gradients", "[checkpoint]") {
  torch::manual_seed(5);
  auto w = torch::randn({6, 6}).requires_grad_(true);
  auto x = torch::randn({2, 6}).requires_grad_(true);
  const auto fn = [&](const torch::Tensor& t) { return torch::sin(t.matmul(w)).matmul(w); };
  auto y = amp::checkpoint(fn, x);
  const auto grads = torch::autograd::grad({y.sum()}, {x, w});
  auto plain = fn(x);
  const auto expected = torch::autograd::grad({plain.sum()}, {x, w});
  CHECK(same_bits(grads[0], expected[0]));
  CHECK(same_bits(grads[1], expected[1]));
}

TEST_CASE("Without grad mode the checkpointed function simply runs", "[checkpoint]") {
  int calls = 0;
  auto w = torch::randn({4, 4}).requires_grad_(true);
  torch::NoGradGuard no_grad;
  auto y = amp::checkpoint(
      [&](const torch::Tensor& t) {
        ++calls;
        return t.matmul(w);
      },
      torch::randn({2, 4}));
  CHECK(calls == 1);
  CHECK_FALSE(y.requires_grad());
}

TEST_CASE("A recomputation that differs, a second backward and a changed input are refused",
          "[checkpoint]") {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  SECTION("determinism check: the recomputation saved other tensors") {
    int calls = 0;
    const auto fn = [&](const torch::Tensor& x) {
      // The second run (the recomputation) takes another shape.
      auto t = ++calls == 1 ? x : torch::cat({x, x});
      return torch::tanh(t.matmul(w)).sum();
    };
    auto y = amp::checkpoint(fn, torch::randn({2, 4}));
    CHECK_THROWS_WITH(y.backward(),
                      Contains("amp::checkpoint: tensors saved for backward differ between the "
                               "forward and the recomputation") &&
                          Contains("shape [2, 4]") && Contains("shape [4, 4]"));
  }
  SECTION("a second backward through a freed graph") {
    auto y = amp::checkpoint([&](const torch::Tensor& x) { return torch::tanh(x.matmul(w)); },
                             torch::randn({2, 4}));
    y.sum().backward();
    CHECK_THROWS_WITH(y.sum().backward(),
                      Contains("Trying to backward through the graph a second time"));
  }
  SECTION("an argument modified in place between forward and backward") {
    auto x = torch::randn({2, 4});
    auto y = amp::checkpoint([&](const torch::Tensor& t) { return torch::tanh(t.matmul(w)); }, x);
    x.add_(1.0);
    CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an inplace operation"));
  }
}

TEST_CASE("Float8 delayed scaling is recomputed with the forward's scales and advances once",
          "[checkpoint][fp8]") {
  const auto go = [](bool checkpointed) {
    torch::manual_seed(2);
    amp::fp8::Float8Linear layer(
        amp::fp8::Float8LinearOptions(32, 16).recipe(amp::fp8::Recipe::delayed()));
    std::vector<torch::Tensor> out;
    for (int step = 0; step < 3; ++step) {
      auto x = torch::randn({16, 32}).requires_grad_(true);
      torch::Tensor y;
      {
        amp::fp8::Float8AutocastGuard float8;
        y = checkpointed ? amp::checkpoint([&](const torch::Tensor& t) { return layer(t); }, x)
                         : layer(x);
      }
      y.square().sum().backward();
      out.push_back(x.grad());
    }
    out.push_back(layer->weight.grad());
    for (const auto& b : layer->buffers()) out.push_back(b.clone());
    return out;
  };
  const auto a = go(true);
  const auto p = go(false);
  REQUIRE(a.size() == p.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(same_bits(a[i], p[i]));
  }
}

TEST_CASE("checkpoint_sequential and CheckpointWrapper compute as the plain Sequential",
          "[checkpoint]") {
  const auto make = [] {
    torch::manual_seed(4);
    return torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::ReLU(),
                                 torch::nn::Dropout(0.25), torch::nn::Linear(8, 8),
                                 torch::nn::Tanh(), torch::nn::Linear(8, 4));
  };
  const auto grads = [](torch::nn::Sequential& s, const torch::Tensor& y) {
    y.square().sum().backward();
    std::vector<torch::Tensor> g{y.detach()};
    for (const auto& p : s->parameters()) g.push_back(p.grad());
    return g;
  };
  auto plain = make();
  torch::manual_seed(9);
  const auto expected = grads(plain, plain->forward(torch::randn({5, 8})));
  for (const int64_t segments : {1, 2, 3, 6}) {
    CAPTURE(segments);
    auto seq = make();
    torch::manual_seed(9);
    const auto got = grads(seq, amp::checkpoint_sequential(seq, segments, torch::randn({5, 8})));
    CHECK(amp_test::all_same_bits(got, expected));
  }
  // Each module wrapped where it stands: the Sequential's forward is unchanged.
  auto wrapped = make();
  torch::nn::Sequential rebuilt;
  for (const auto& module : *wrapped) rebuilt->push_back(amp::CheckpointWrapper(module));
  torch::manual_seed(9);
  CHECK(amp_test::all_same_bits(grads(rebuilt, rebuilt->forward(torch::randn({5, 8}))), expected));
  CHECK_THROWS_WITH(amp::checkpoint_sequential(wrapped, 7, torch::randn({5, 8})),
                    Contains("amp::checkpoint_sequential: segments must be in [1, 6] (the number "
                             "of modules of the Sequential). Got segments=7."));
}

TEST_CASE("GradScaler with a fused optimizer steps a checkpointed model with no host read",
          "[checkpoint][scaler]") {
  torch::manual_seed(6);
  auto block = std::make_shared<Block>();
  amp::optim::FusedAdamW opt(block->parameters(), amp::optim::FusedAdamWOptions(1e-3));
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(256.0));
  for (int k = 0; k < 3; ++k) {
    opt.zero_grad();
    auto x = torch::randn({4, 16});
    amp_test::HostReadRecorder recorder;
    torch::Tensor loss;
    {
      amp::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16);
      loss = amp::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x)
                 .to(torch::kFloat)
                 .square()
                 .mean();
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    INFO("iteration " << k << ": " << (recorder.reads().empty() ? "" : recorder.reads().front()));
    CHECK(recorder.reads().empty());
  }
}

TEST_CASE("A backward inside the checkpointed function gives the plain function's gradients",
          "[checkpoint]") {
  // Python's rule 6: a derivative loss (torch::autograd::grad inside the function) runs through
  // the recomputation's own graph, in the forward and again in the final backward.
  torch::manual_seed(8);
  auto w = torch::randn({5, 5}).requires_grad_(true);
  const auto with_graph = [&](const torch::Tensor& x) {
    auto z = torch::cos(torch::sin(x.matmul(w)));
    auto gx = torch::autograd::grad({z.sum()}, {x}, {}, /*retain_graph=*/true,
                                    /*create_graph=*/true)[0];
    return gx * z;
  };
  const auto without_graph = [&](const torch::Tensor& x) {
    auto z = torch::cos(torch::sin(x.matmul(w)));
    auto gx = torch::autograd::grad({z.sum()}, {x})[0];
    return torch::cos(x) * gx;
  };
  for (const bool early_stop : {true, false}) {
    CAPTURE(early_stop);
    const auto opts = amp::CheckpointOptions().early_stop(early_stop);
    for (int which = 0; which < 2; ++which) {
      CAPTURE(which);
      const auto fn = [&](const torch::Tensor& x) {
        return which == 0 ? with_graph(x) : without_graph(x);
      };
      auto x = torch::randn({3, 5}).requires_grad_(true);
      // Without create_graph the inner gradient is a constant: only x reaches the output.
      const std::vector<torch::Tensor> inputs =
          which == 0 ? std::vector<torch::Tensor>{x, w} : std::vector<torch::Tensor>{x};
      const auto got = torch::autograd::grad({amp::checkpoint(opts, fn, x).sum()}, inputs);
      const auto expected = torch::autograd::grad({fn(x).sum()}, inputs);
      REQUIRE(got.size() == expected.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(same_bits(got[i], expected[i]));
    }
  }
}

TEST_CASE("A recomputation that saves fewer tensors is refused under every determinism_check",
          "[checkpoint]") {
  // Python's "none" skips the metadata comparison but still counts the saved tensors.
  for (const auto check : {amp::DeterminismCheck::kDefault, amp::DeterminismCheck::kNone}) {
    CAPTURE(static_cast<int>(check));
    for (const bool backward_needs_the_missing : {false, true}) {
      CAPTURE(backward_needs_the_missing);
      int calls = 0;
      const auto fn = [&](const torch::Tensor& x) {
        // The forward saves five tensors; the recomputation two.
        if (++calls > 1) return torch::cos(torch::sin(x));
        auto y = torch::sigmoid(torch::tanh(torch::exp(torch::cos(torch::sin(x)))));
        return backward_needs_the_missing ? y : y.detach() + torch::cos(torch::sin(x));
      };
      auto x = torch::randn({4}).requires_grad_(true);
      auto y = amp::checkpoint(amp::CheckpointOptions().determinism_check(check), fn, x);
      CHECK_THROWS_WITH(y.sum().backward(), Contains("amp::checkpoint: the forward saved") &&
                                                Contains("determinism_check does not relax this") &&
                                                !Contains("INTERNAL ASSERT"));
    }
  }
}

TEST_CASE("The RNG devices of a checkpoint include tensors nested in its arguments",
          "[checkpoint]") {
  // Python collects them with tree_map; a CUDA tensor inside a vector must restore the CUDA
  // generator, or dropout redraws another mask (checked on a GPU in checkpoint_cuda.tests.cpp).
  const auto cpu = torch::zeros({1});
  const auto meta = torch::zeros({1}, torch::Device(torch::kMeta));
  CHECK(amp::detail::accelerator_devices(cpu, meta, 3, std::string("cuda")).empty());
  // Only the devices are read, so a tensor's device is enough: the CPU tensors stand in and the
  // collector's list is checked for the devices it would add.
  std::vector<c10::Device> seen;
  const auto record = [&seen](const torch::Tensor& t) { seen.push_back(t.device()); };
  std::vector<torch::Tensor> list{cpu, cpu};
  std::tuple<int, std::optional<torch::Tensor>> tuple{1, cpu};
  std::map<std::string, torch::Tensor> dict{{"a", cpu}};
  amp::detail::for_each_tensor(list, record);
  amp::detail::for_each_tensor(tuple, record);
  amp::detail::for_each_tensor(dict, record);
  amp::detail::for_each_tensor(std::optional<torch::Tensor>(), record);
  amp::detail::for_each_tensor(std::vector<std::vector<torch::Tensor>>{{cpu}, {cpu, cpu}}, record);
  CHECK(seen.size() == 7);
}
