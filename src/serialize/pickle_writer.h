// Writes PickledValues as the protocol-2 pickle torch.save writes, so that Python's
// `torch.load(path, weights_only=True)` reads it: dicts, OrderedDicts, lists, tuples, numbers,
// strings, None and tensor records (_rebuild_tensor_v2 over a typed storage, or _v3 over an
// UntypedStorage for float8 and the unsigned dtypes). Standard C++ only.
#pragma once

#include <string>

#include "serialize/pickle_values.h"

namespace amp::detail {

/// The pickle of `value`. Each tensor record is written as it stands (its key, dtype, element
/// count, offset, sizes and strides); the caller writes the storages' bytes under "data/<key>".
/// Throws ReaderError for a tensor dtype torch.save has no record for.
std::string write_torch_pickle(const PickledValue& value);

}  // namespace amp::detail
