// Captures the warnings (TORCH_WARN) raised while a WarningCollector is installed.
#pragma once

#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace amp_test {

/// Install with c10::WarningUtils::WarningHandlerGuard; `messages` holds each warning's text.
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

}  // namespace amp_test
