// Statistics and machine facts shared by amp's CPU benchmarks: medians and their confidence
// intervals, paired ratios, the benchmark MLP, the CPU model and load.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace amp_bench {

inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

inline double median(const std::vector<double>& v) { return quantile(v, 0.5); }

/// Distribution-free ~95% confidence interval of the median: the order statistics at ranks
/// n/2 -+ 1.96 sqrt(n)/2 (binomial normal approximation), so noise bursts cannot move it much.
inline std::pair<double, double> median_ci(std::vector<double> v) {
  if (v.empty()) return {0.0, 0.0};
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  const double half = 0.98 * std::sqrt(n);
  const auto lo = static_cast<size_t>(std::max(0.0, std::floor(n / 2 - half)));
  const auto hi = static_cast<size_t>(std::min(n - 1, std::ceil(n / 2 + half)));
  return {v[lo], v[hi]};
}

/// Per-round ratio a[i] / b[i] (rounds are paired: both ran in the same round).
inline std::vector<double> ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(a[i] / b[i]);
  return r;
}

/// An MLP 784 -> widths... with ReLU between layers (a single Linear for {784, 10}).
inline torch::nn::Sequential make_mlp(const std::vector<int64_t>& widths) {
  torch::nn::Sequential seq;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    seq->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) seq->push_back(torch::nn::ReLU());
  }
  return seq;
}

/// First "model name" line of /proc/cpuinfo, or "unknown".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace amp_bench
