// Run-time answers to what this build of amp is.
#include <amp/info.h>
#include <amp/version.h>

namespace amp {

std::string version() { return AMP_VERSION_STRING; }

bool built_with_cuda() { return AMP_BUILT_WITH_CUDA != 0; }
bool built_with_distributed() { return AMP_BUILT_WITH_DISTRIBUTED != 0; }

}  // namespace amp
