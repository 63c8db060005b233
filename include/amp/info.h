// What this build of amp is: its version and whether its CUDA code was compiled.
#pragma once

#include <string>

#include <amp/export.h>

namespace amp {

/// The version of the amp library that is loaded at run time, such as "0.1.0". Compare with
/// AMP_VERSION_STRING from <amp/version.h> to detect a header/library mismatch.
AMP_EXPORT std::string version();

/// True when the loaded amp library was built with its CUDA code (AMP_WITH_CUDA=ON).
AMP_EXPORT bool built_with_cuda();
/// Whether this build of amp includes the amp::distributed library (AMP_WITH_DISTRIBUTED):
/// c10d process groups, GradScaler across ranks, gradient all-reduce (amp/distributed.h).
AMP_EXPORT bool built_with_distributed();

}  // namespace amp
