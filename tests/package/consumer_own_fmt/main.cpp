// Links amp::amp and the system fmt into one program and uses both.
#include <ATen/ATen.h>

#include <amp/amp.h>

#include <iostream>

#include "report.h"

int main() {
  double mean = 0.0;
  {
    amp::AutocastGuard autocast(c10::DeviceType::CPU);
    mean = at::mm(at::ones({2, 3}), at::ones({3, 2})).to(at::kFloat).mean().item<double>();
  }
  const std::string line = report_line("mean", mean);
  std::cout << line << " (system fmt " << report_fmt_version() << ", amp " << amp::version()
            << ")\n";
  // amp's own fmt is private: the system fmt's version is what this program sees.
  return line == "mean: 3.000" && report_fmt_version() < 120000 ? 0 : 1;
}
