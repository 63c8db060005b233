// amp::detail::BufferRoles: what one of amp's modules says about its own buffers to the code that
// treats every module's buffers alike (dtype changes, DistributedDataParallel's broadcast), so that
// such code asks the module instead of naming its type.
#pragma once

#include <string>

#include <torch/nn/module.h>

namespace amp::detail {

/// Mixed into a module type whose buffers are not all ordinary state.
class BufferRoles {
 public:
  virtual ~BufferRoles() = default;
  /// Whether the module's own buffer `name` stays float32 when the module's dtype changes
  /// (Module::to(dtype), amp::to_low_precision).
  virtual bool keeps_float32(const std::string& name) const = 0;
  /// Whether every rank of a data-parallel job keeps its own value of buffer `name`, which
  /// DistributedDataParallel then does not broadcast from rank 0.
  virtual bool rank_local(const std::string& name) const = 0;

 protected:
  BufferRoles() = default;
  BufferRoles(const BufferRoles&) = default;
  BufferRoles& operator=(const BufferRoles&) = default;
};

/// `module`'s own buffer `name` keeps float32 (false for modules that say nothing).
inline bool keeps_float32_buffer(const torch::nn::Module& module, const std::string& name) {
  const auto* roles = dynamic_cast<const BufferRoles*>(&module);
  return roles != nullptr && roles->keeps_float32(name);
}

/// `module`'s own buffer `name` is rank-local (false for modules that say nothing).
inline bool rank_local_buffer(const torch::nn::Module& module, const std::string& name) {
  const auto* roles = dynamic_cast<const BufferRoles*>(&module);
  return roles != nullptr && roles->rank_local(name);
}

}  // namespace amp::detail
