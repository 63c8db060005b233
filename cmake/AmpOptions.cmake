# Options of the amp build. Developer targets default to on only when amp is the top-level project.
include_guard(GLOBAL)

string(COMPARE EQUAL "${CMAKE_SOURCE_DIR}" "${PROJECT_SOURCE_DIR}" AMP_IS_TOP_LEVEL)

option(AMP_BUILD_TESTS "Build amp's Catch2 test suite and register it with CTest" ${AMP_IS_TOP_LEVEL})
option(AMP_BUILD_EXAMPLES "Build amp's examples" ${AMP_IS_TOP_LEVEL})
option(AMP_BUILD_BENCHMARKS "Build amp's benchmarks (bench/; built, never run by ctest)" ${AMP_IS_TOP_LEVEL})
option(AMP_BUILD_FUZZERS "Build amp's libFuzzer targets (tests/fuzz; needs clang)" OFF)
# AMP_WITH_CUDA is decided in AmpDependencies.cmake: its default depends on what is found.

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_CXX_VISIBILITY_PRESET hidden)
set(CMAKE_CUDA_VISIBILITY_PRESET hidden)  # the kernels and launchers are internal too
set(CMAKE_VISIBILITY_INLINES_HIDDEN ON)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
