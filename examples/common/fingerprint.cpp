// The parameter fingerprint: FNV-1a over the bytes of each parameter in turn.
#include "fingerprint.h"

#include <ATen/core/Tensor.h>

namespace amp_examples {

std::uint64_t parameter_fingerprint(const std::vector<at::Tensor>& parameters) {
  // FNV-1a's 64-bit offset basis and prime.
  std::uint64_t hash = 0xcbf29ce484222325u;
  for (const at::Tensor& parameter : parameters) {
    const at::Tensor host = parameter.detach().to(at::kCPU).contiguous();
    const auto* byte = static_cast<const std::uint8_t*>(host.data_ptr());
    for (const auto* end = byte + host.nbytes(); byte != end; ++byte) {
      hash = (hash ^ *byte) * 0x100000001b3u;
    }
  }
  return hash;
}

}  // namespace amp_examples
