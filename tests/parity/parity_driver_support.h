// What the parity drivers share: the inputs file the Python side writes, the model, gradient
// clipping op for op as Python does it, and the results file the Python side reads back.
#pragma once

#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace amp_parity {

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "cannot open ", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The inputs dict written by the Python side (torch.save of a dict of plain values and tensors).
struct Inputs {
  explicit Inputs(const std::string& path)
      : dict(torch::pickle_load(read_bytes(path)).toGenericDict()) {}
  c10::IValue at(const std::string& key) const { return dict.at(c10::IValue(key)); }
  double real(const std::string& key) const { return at(key).toDouble(); }
  int64_t integer(const std::string& key) const { return at(key).toInt(); }
  std::string text(const std::string& key) const { return at(key).toStringRef(); }
  bool has(const std::string& key) const { return dict.contains(c10::IValue(key)); }
  std::vector<torch::Tensor> tensors(const std::string& key) const {
    std::vector<torch::Tensor> out;
    for (const auto& value : at(key).toList()) out.push_back(value.get().toTensor());
    return out;
  }
  c10::impl::GenericDict dict;
};

// The two-layer MLP of both suites: p = {w1, b1, w2, b2}.
inline torch::Tensor forward(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
  return torch::linear(torch::linear(x, p[0], p[1]).relu(), p[2], p[3]);
}

// Python's clip_grad_norm_(foreach=False) op for op (including `max_norm / t` being
// `t.reciprocal() * max_norm` in Python), so the clipped gradients agree bit for bit.
inline void clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : params) {
    if (p.grad().defined()) norms.push_back(torch::linalg_vector_norm(p.grad(), 2));
  }
  const auto total = torch::linalg_vector_norm(torch::stack(norms), 2);
  const auto coef = torch::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

// Writes `value` where the Python side reads it with torch.load.
inline void write_pickle(const c10::IValue& value, const std::string& path) {
  const auto bytes = torch::pickle_save(value);
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

}  // namespace amp_parity
