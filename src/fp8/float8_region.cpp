// The float8 region: a per-thread flag that Float8AutocastGuard sets and restores, which
// Float8Linear reads at forward time.
#include <amp/fp8.h>

namespace amp::fp8 {
namespace {

thread_local bool float8_enabled = false;

}  // namespace

Float8AutocastGuard::Float8AutocastGuard(bool enabled) : previous_(float8_enabled) {
  float8_enabled = enabled;
}

Float8AutocastGuard::~Float8AutocastGuard() { float8_enabled = previous_; }

bool is_float8_enabled() { return float8_enabled; }

}  // namespace amp::fp8
