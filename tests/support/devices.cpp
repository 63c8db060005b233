// Device detection for the test runner.
#include "support/devices.h"

#include <ATen/Context.h>

#include <amp/info.h>

namespace amp_test {

bool cuda_usable() { return amp::built_with_cuda() && cuda_present(); }

bool cuda_present() { return at::hasCUDA(); }

}  // namespace amp_test
