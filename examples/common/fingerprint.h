// A hash of a model's parameters, printed by the training examples so that runs can be compared
// bit for bit (a resumed run with an uninterrupted one, a build with the one before).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace amp_examples {

/// The 64-bit FNV-1a hash of the parameters' bytes, tensor after tensor in the order given (a
/// module's parameters() lists them in registration order), each copied to the CPU and made
/// contiguous first. Equal fingerprints mean bit-identical parameters, whatever their device.
std::uint64_t parameter_fingerprint(const std::vector<at::Tensor>& parameters);

}  // namespace amp_examples
