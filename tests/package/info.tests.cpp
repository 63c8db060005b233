// The library reports the version it was built as, matching the header it is used with.
#include <catch2/catch.hpp>

#include <amp/amp.h>

TEST_CASE("The loaded library's version equals the header's version", "[package]") {
  CHECK(amp::version() == AMP_VERSION_STRING);
  CHECK(AMP_VERSION == AMP_VERSION_MAJOR * 10000 + AMP_VERSION_MINOR * 100 + AMP_VERSION_PATCH);
  CHECK(amp::built_with_cuda() == (AMP_BUILT_WITH_CUDA == 1));
}
