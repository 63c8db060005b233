// amp::to_low_precision: a module's weights cast to bfloat16/float16 for training with low-
// precision parameters (amp::optim's master_weights, kahan_summation or stochastic_rounding),
// normalisation layers kept in float32 as Apex's keep_batchnorm_fp32 does.
#pragma once

#include <functional>
#include <string>

#include <c10/core/ScalarType.h>

#include <amp/export.h>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace amp {

/// Selects the submodules whose parameters and buffers stay as they are: called with each
/// module's qualified name ("" for the root, "encoder.norm1" below it) and the module. A module
/// kept keeps its whole subtree.
using KeepPredicate = std::function<bool(const std::string& name, const torch::nn::Module& module)>;

/// The default KeepPredicate: LibTorch's normalisation layers (BatchNorm1d/2d/3d,
/// InstanceNorm1d/2d/3d, LayerNorm, GroupNorm, LocalResponseNorm, CrossMapLRN2d), whose
/// statistics and affine parameters lose too much in 8 mantissa bits.
AMP_EXPORT bool is_normalization(const std::string& name, const torch::nn::Module& module);

/// Casts the floating-point parameters (and their gradients) and buffers of `module` and its
/// submodules to `dtype` (BFloat16 or Half) in place, except in the submodules `keep` selects;
/// integer buffers (e.g. BatchNorm's num_batches_tracked) are left alone. Parameters keep their
/// identity, so references to them stay valid, but call it before building the optimizer: an
/// optimizer's state is typed like the parameters it first saw. Throws c10::Error for another
/// dtype.
AMP_EXPORT void to_low_precision(torch::nn::Module& module, c10::ScalarType dtype,
                                 const KeepPredicate& keep = is_normalization);

}  // namespace amp
