// A list of tensors seen as flat dense arrays, for the CPU and CUDA list kernels alike: dense
// tensors (contiguous in any dimension order, offset views included) are used where they lie,
// any other layout through a contiguous copy that write_back() copies into the original.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include "ops/kernel_common.h"

namespace amp::detail {

class DenseList {
 public:
  /// Empty tensors are left out; non-dense ones are copied to contiguous memory.
  explicit DenseList(at::TensorList tensors);

  /// The non-empty tensors in list order.
  const std::vector<FlatTensor>& flat() const { return flat_; }

  /// Copies the contiguous copies back into the non-dense originals (after a pass that stores).
  void write_back();

 private:
  std::vector<FlatTensor> flat_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_;  // (original, contiguous copy)
};

}  // namespace amp::detail
