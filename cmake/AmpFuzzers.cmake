# libFuzzer targets (AMP_BUILD_FUZZERS=ON, clang only; the `fuzz` preset): each built from its
# tests/fuzz/<target>_fuzz.cpp and what it exercises, without LibTorch.
include_guard(GLOBAL)

if(NOT AMP_BUILD_FUZZERS)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "AMP_BUILD_FUZZERS needs clang (libFuzzer is part of clang's runtime), but "
    "the C++ compiler is ${CMAKE_CXX_COMPILER_ID} (${CMAKE_CXX_COMPILER}). Configure with the "
    "`fuzz` preset or -DCMAKE_CXX_COMPILER=clang++ (scripts/setup installs clang and "
    "libclang-rt-14-dev).")
endif()

set(AMP_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)

# amp_add_fuzzer(<name> <sources>...): the executable <name>_fuzz.
function(amp_add_fuzzer name)
  add_executable(${name}_fuzz "${PROJECT_SOURCE_DIR}/tests/fuzz/${name}_fuzz.cpp" ${ARGN})
  target_include_directories(${name}_fuzz PRIVATE "${PROJECT_SOURCE_DIR}/src")
  target_compile_options(${name}_fuzz PRIVATE ${AMP_FUZZ_FLAGS})
  target_link_options(${name}_fuzz PRIVATE ${AMP_FUZZ_FLAGS})
endfunction()

# The state-file reader and the archive checker: amp_serialize (src/serialize), which carries the
# same instrumentation when AMP_BUILD_FUZZERS is ON.
amp_add_fuzzer(state_file)
target_link_libraries(state_file_fuzz PRIVATE amp_serialize)
amp_add_fuzzer(archive)
target_link_libraries(archive_fuzz PRIVATE amp_serialize)
# The examples' IDX reader (raw and gzip), with the zlib and fmt the examples use.
find_package(ZLIB REQUIRED)
find_package(fmt REQUIRED)
amp_add_fuzzer(idx "${PROJECT_SOURCE_DIR}/examples/common/idx.cpp")
target_include_directories(idx_fuzz PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
target_link_libraries(idx_fuzz PRIVATE ZLIB::ZLIB fmt::fmt-header-only)
