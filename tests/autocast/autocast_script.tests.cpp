// amp::ScriptAutocastGuard: scripted and traced modules saved by Python, loaded with
// torch::jit::load and run under AutocastGuard, give eager autocast's bits (Python's, from
// script_autocast_reference.py) in the output and every gradient, on every call.
#include <torch/script.h>
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include <amp/autocast.h>
#include <amp/state_dict.h>
#include <torch/csrc/jit/passes/autocast.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include "support/python_rows.h"
#include "support/temp_dir.h"

namespace {

using amp_test::tensor_row;

// Every call as the reference makes it: forward under bf16 autocast, a float32 loss, backward;
// the output's row and each gradient's, by parameter name.
std::vector<std::vector<std::string>> run_calls(torch::jit::Module& module,
                                                const std::vector<at::Tensor>& inputs) {
  std::vector<std::vector<std::string>> rows;
  for (std::size_t call = 0; call < inputs.size(); ++call) {
    for (auto p : module.parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor out;
    {
      amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      out = module.forward({inputs[call]}).toTensor();
    }
    out.to(torch::kFloat).square().mean().backward();
    const std::string prefix = "call" + std::to_string(call);
    rows.push_back(tensor_row(prefix + ".out", out));
    for (const auto& p : module.named_parameters()) {
      rows.push_back(tensor_row(prefix + ".grad." + p.name, p.value.grad()));
    }
  }
  return rows;
}

}  // namespace

TEST_CASE("Scripted and traced modules under ScriptAutocastGuard give eager autocast's bits",
          "[autocast][script][python]") {
  amp_test::TempDir dir("script_autocast");
  const auto expected = amp_test::python_rows(
      AMP_TEST_PYTHON, AMP_TEST_SOURCE_DIR "/autocast/script_autocast_reference.py",
      "write \"" + dir.path().string() + "\"");
  REQUIRE(expected.size() == 15);  // 3 calls: the output and 4 gradients each
  std::vector<at::Tensor> inputs;
  const c10::IValue saved = amp::load_pickled((dir.path() / "inputs.pt").string());
  for (const c10::IValue& x : saved.toListRef()) inputs.push_back(x.toTensor());
  const std::string kind = GENERATE("scripted", "traced");
  CAPTURE(kind);
  torch::jit::Module module = torch::jit::load((dir.path() / (kind + ".pt")).string());
  amp::prepare_for_autocast(module);
  amp::ScriptAutocastGuard script_autocast;
  if (kind == "traced") {
    // Without the rewrite the traced aten::_convolution escapes autocast's lists: other bits.
    torch::jit::Module unprepared = torch::jit::load((dir.path() / "traced.pt").string());
    amp::ScriptAutocastGuard script_autocast;
    CHECK(run_calls(unprepared, inputs) != expected);
  }
  const auto actual = run_calls(module, inputs);
  REQUIRE(actual.size() == expected.size());
  for (std::size_t r = 0; r < actual.size(); ++r) {
    INFO(expected[r][0]);
    CHECK(actual[r] == expected[r]);
  }
}

TEST_CASE("ScriptAutocastGuard restores the executor's and the JIT autocast pass's settings",
          "[autocast][script]") {
  const bool optimize = torch::jit::getGraphExecutorOptimize();
  const bool jit_autocast = torch::jit::autocastEnabled();
  {
    amp::ScriptAutocastGuard outer;
    CHECK_FALSE(torch::jit::getGraphExecutorOptimize());
    CHECK_FALSE(torch::jit::autocastEnabled());
    {
      amp::ScriptAutocastGuard inner;
      CHECK_FALSE(torch::jit::autocastEnabled());
    }
    // The inner guard's end leaves the outer one's settings.
    CHECK_FALSE(torch::jit::getGraphExecutorOptimize());
    CHECK_FALSE(torch::jit::autocastEnabled());
  }
  CHECK(torch::jit::getGraphExecutorOptimize() == optimize);
  CHECK(torch::jit::autocastEnabled() == jit_autocast);
}

TEST_CASE(
    "ScriptAutocastGuards made and ended on two threads at once leave the JIT autocast pass "
    "as they found it",
    "[autocast][script][threads]") {
  const bool jit_autocast = torch::jit::autocastEnabled();
  torch::jit::setAutocastMode(true);
  // Each thread's last guard may end while the other's first begins: the one that begins must
  // not save the "off" the ending one has not yet undone.
  const auto churn = [] {
    for (int k = 0; k < 100000; ++k) amp::ScriptAutocastGuard guard;
  };
  std::thread first(churn), second(churn);
  first.join();
  second.join();
  CHECK(torch::jit::autocastEnabled());
  torch::jit::setAutocastMode(jit_autocast);
}
