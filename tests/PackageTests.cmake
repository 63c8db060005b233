# CTest checks of amp as an installed package: install it, inspect what was installed, and build
# standalone consumer projects against it with find_package(amp).
set(_amp_prefix "${CMAKE_CURRENT_BINARY_DIR}/package-prefix")
# Named one by one: a ;-list would be split into separate arguments by add_test.
set(_amp_consumer_options
  "-Damp_DIR=${_amp_prefix}/lib/cmake/amp"
  "-DTorch_DIR=${Torch_DIR}"
  "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}"
  "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}"
  "-DTORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}")
if(CMAKE_CXX_COMPILER_LAUNCHER)
  list(APPEND _amp_consumer_options "-DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}")
endif()

add_test(NAME package.install
  COMMAND "${CMAKE_COMMAND}" --install "${PROJECT_BINARY_DIR}" --prefix "${_amp_prefix}")
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP amp_package LABELS package)

add_test(NAME package.is_relocatable_and_keeps_fmt_private
  COMMAND "${CMAKE_COMMAND}"
    "-DPREFIX=${_amp_prefix}"
    "-DTORCH_DIR=${Torch_DIR}"
    "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
    -P "${CMAKE_CURRENT_SOURCE_DIR}/package/inspect_install.cmake")
set_tests_properties(package.is_relocatable_and_keeps_fmt_private PROPERTIES
  FIXTURES_REQUIRED amp_package LABELS package)

# Each consumer is a complete CMake project: configure, build, run its program. consumer_distributed
# asks for the optional component: find_package(amp COMPONENTS distributed).
set(_amp_consumers find_package own_fmt)
if(AMP_WITH_DISTRIBUTED)
  list(APPEND _amp_consumers distributed)
endif()
foreach(_consumer IN LISTS _amp_consumers)
  add_test(NAME package.consumer_${_consumer}
    COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test
      "${CMAKE_CURRENT_SOURCE_DIR}/package/consumer_${_consumer}"
      "${CMAKE_CURRENT_BINARY_DIR}/consumer_${_consumer}"
      --build-generator Ninja
      --build-options ${_amp_consumer_options}
      --test-command consumer)
  set_tests_properties(package.consumer_${_consumer} PROPERTIES
    FIXTURES_REQUIRED amp_package LABELS package)
endforeach()

if(AMP_WITH_DISTRIBUTED)
  set_tests_properties(package.consumer_distributed PROPERTIES LABELS "package;distributed"
    PASS_REGULAR_EXPRESSION "distributed 1: 1 of 2 steps taken, scale 32768")
  # Without c10d (AMP_WITH_DISTRIBUTED=OFF) the core library builds and says so.
  add_test(NAME package.builds_without_distributed
    COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test
      "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/without-distributed"
      --build-generator Ninja
      --build-options ${_amp_consumer_options}
        -DAMP_WITH_CUDA=OFF -DAMP_WITH_DISTRIBUTED=OFF -DAMP_BUILD_TESTS=OFF
        -DAMP_BUILD_EXAMPLES=OFF -DAMP_BUILD_BENCHMARKS=OFF "-DAMP_PYTHON=${AMP_PYTHON}"
      --test-command "${CMAKE_COMMAND}" -E cat include/amp/version.h)
  set_tests_properties(package.builds_without_distributed PROPERTIES LABELS package
    PASS_REGULAR_EXPRESSION "#define AMP_BUILT_WITH_DISTRIBUTED 0")
endif()

# The AMP_WITH_CUDA=OFF configuration must build (a CPU-only LibTorch needs it); amp::distributed
# then has no NCCL groups.
if(AMP_WITH_CUDA)
  add_test(NAME package.builds_without_cuda
    COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test
      "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/without-cuda"
      --build-generator Ninja
      --build-options ${_amp_consumer_options}
        -DAMP_WITH_CUDA=OFF -DAMP_BUILD_TESTS=OFF -DAMP_BUILD_EXAMPLES=OFF
        "-DAMP_PYTHON=${AMP_PYTHON}")
  set_tests_properties(package.builds_without_cuda PROPERTIES LABELS package)
endif()
