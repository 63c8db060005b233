// HostReadRecorder: a RecordFunction observer that keeps the op stack of this thread and notes
// each op that returns a tensor's value to the host.
#include "support/host_reads.h"

#include <cstring>

namespace amp_test {

namespace {

thread_local std::vector<std::string> op_stack;
thread_local std::vector<std::string> host_reads;

bool reads_to_host(const char* name) {
  for (const char* op :
       {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal"}) {
    if (std::strcmp(name, op) == 0) return true;
  }
  return false;
}

// Inside a fused optimizer kernel, or inside another read (item() calls _local_scalar_dense).
bool exempt_by_caller() {
  for (const auto& op : op_stack) {
    if (op == "aten::_fused_adam_" || op == "aten::_fused_adamw_" || op == "aten::_fused_sgd_" ||
        reads_to_host(op.c_str())) {
      return true;
    }
  }
  return false;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (reads_to_host(name) && !exempt_by_caller()) {
    std::string chain;
    for (const auto& op : op_stack) chain += op + " > ";
    host_reads.push_back(chain + name);
  }
  op_stack.emplace_back(name);
  return nullptr;
}

void on_exit(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  if (!op_stack.empty()) op_stack.pop_back();
}

}  // namespace

HostReadRecorder::HostReadRecorder() {
  op_stack.clear();
  host_reads.clear();
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_enter, on_exit).scopes({at::RecordScope::FUNCTION}));
}

HostReadRecorder::~HostReadRecorder() { at::removeCallback(handle_); }

const std::vector<std::string>& HostReadRecorder::reads() const { return host_reads; }

}  // namespace amp_test
