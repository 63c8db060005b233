// Formatting done with the consumer's own fmt, behind a torch-free interface.
#pragma once

#include <string>

/// The FMT_VERSION this translation unit was compiled against.
int report_fmt_version();
/// "<what>: <value with 3 decimals>", formatted by fmt.
std::string report_line(const std::string& what, double value);
