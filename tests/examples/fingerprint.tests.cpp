// The examples' parameter fingerprint: FNV-1a over the parameters' bytes, stable for fixed values.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/fingerprint.h"

namespace {

using amp_examples::parameter_fingerprint;

// A weight and a bias with exactly representable values: [[0, .25, .5], [.75, 1, 1.25]], [-1.5, 2].
std::vector<torch::Tensor> fixed_parameters() {
  return {torch::arange(6, torch::kFloat32).reshape({2, 3}) / 4, torch::tensor({-1.5F, 2.0F})};
}

}  // namespace

TEST_CASE("The fingerprint is 64-bit FNV-1a of the bytes: the published test vectors",
          "[examples]") {
  // FNV-1a 64 of "" (the offset basis), "a" and "foobar", from the algorithm's reference tables.
  CHECK(parameter_fingerprint({}) == 0xcbf29ce484222325u);
  CHECK(parameter_fingerprint({torch::tensor({97}, torch::kUInt8)}) == 0xaf63dc4c8601ec8cu);
  CHECK(parameter_fingerprint({torch::tensor({'f', 'o', 'o', 'b', 'a', 'r'}, torch::kUInt8)}) ==
        0x85944171f73967e8u);
}

TEST_CASE("The fingerprint of fixed parameters is stable, and depends on their order and values",
          "[examples]") {
  // Expected values: FNV-1a over `tensor.contiguous().numpy().tobytes()` in Python.
  std::vector<torch::Tensor> parameters = fixed_parameters();
  CHECK(parameter_fingerprint(parameters) == 0x79c036f3e338ff82u);
  CHECK(parameter_fingerprint({parameters[1], parameters[0]}) == 0x66f1bee5365daa82u);
  CHECK(parameter_fingerprint({parameters[0].to(torch::kHalf)}) == 0xabe642f541224e20u);
  // A value one step (the last bit of its mantissa) away changes it.
  parameters[1][0].fill_(std::nextafter(-1.5F, 0.0F));
  CHECK(parameter_fingerprint(parameters) != 0x79c036f3e338ff82u);
}

TEST_CASE("The fingerprint hashes values in logical order, whatever the layout or device",
          "[examples]") {
  const std::vector<torch::Tensor> parameters = fixed_parameters();
  // A transposed view is hashed as its contiguous copy ([[0, .75], [.25, 1], [.5, 1.25]]).
  CHECK(parameter_fingerprint({parameters[0].t(), parameters[1]}) == 0x9510b871e55e9472u);
  // Gradients and autograd history play no part.
  const torch::Tensor weight = parameters[0].clone().requires_grad_(true);
  (weight * 2).sum().backward();
  CHECK(parameter_fingerprint({weight, parameters[1]}) == 0x79c036f3e338ff82u);
}

TEST_CASE("The fingerprint of CUDA parameters equals that of the same values on the CPU",
          "[examples][cuda]") {
  const std::vector<torch::Tensor> parameters = fixed_parameters();
  CHECK(parameter_fingerprint({parameters[0].cuda(), parameters[1].cuda()}) == 0x79c036f3e338ff82u);
}
