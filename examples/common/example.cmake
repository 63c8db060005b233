# Included by each example's CMakeLists.txt, after project(): finds amp (inside amp's own tree
# amp::amp already exists) and fmt, adds the shared helpers of this folder once, and defines
# amp_add_example(). An example copied out of amp's tree needs this folder beside it, as ../common.
if(NOT TARGET amp::amp)
  find_package(amp REQUIRED)  # also finds LibTorch, through Torch_DIR or CMAKE_PREFIX_PATH
endif()
find_package(fmt REQUIRED)
if(NOT TARGET amp_example_common)
  add_subdirectory("${CMAKE_CURRENT_LIST_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/common")
endif()

# amp_add_example(<program> [TRAINING] <source>...): an executable linked with amp, fmt
# (header-only: the sources also see LibTorch's bundled fmt headers, see amp's docs/BUILD.md) and
# the helpers without LibTorch (amp_example_common); TRAINING adds the training examples' helpers
# (amp_example_training).
function(amp_add_example program)
  cmake_parse_arguments(PARSE_ARGV 1 example "TRAINING" "" "")
  add_executable(${program} ${example_UNPARSED_ARGUMENTS})
  target_compile_features(${program} PRIVATE cxx_std_20)
  target_link_libraries(${program} PRIVATE amp::amp amp_example_common fmt::fmt-header-only)
  if(example_TRAINING)
    target_link_libraries(${program} PRIVATE amp_example_training)
    # The precompiled header amp_example_training uses (examples/common/CMakeLists.txt).
    target_precompile_headers(${program} REUSE_FROM ${AMP_EXAMPLE_PCH_TARGET})
  endif()
endfunction()
