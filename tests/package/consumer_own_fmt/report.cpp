// Uses the system fmt (compiled library), with no LibTorch include path in sight.
#include "report.h"

#include <fmt/format.h>

int report_fmt_version() { return FMT_VERSION; }

std::string report_line(const std::string& what, double value) {
  return fmt::format("{}: {:.3f}", what, value);
}
