// DenseList: the list kernels' flat view of a tensor list (see dense_list.h).
#include "ops/dense_list.h"

#include "kernels/dtype_of.h"

namespace amp::detail {

DenseList::DenseList(at::TensorList tensors) {
  flat_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    at::Tensor dense = t;
    if (!t.is_non_overlapping_and_dense()) {
      dense = t.contiguous();
      copies_.emplace_back(t, dense);
    }
    flat_.push_back(FlatTensor{dense.data_ptr(), dense.numel(), *kernels::dtype_of(t.scalar_type()),
                               static_cast<int64_t>(i)});
  }
}

void DenseList::write_back() {
  for (auto& [original, dense] : copies_) original.copy_(dense);
}

}  // namespace amp::detail
