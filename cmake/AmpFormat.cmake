# The ctest that keeps every C++ and CUDA file of src/, include/, tests/, examples/ and bench/
# formatted as .clang-format says (clang-format 14, which scripts/setup installs; another major
# version formats differently, so only 14 is used). Without clang-format-14 the configure step
# stops, so that the check fails rather than disappears; AMP_FORMAT_CHECK=OFF skips it on purpose.
include_guard(GLOBAL)

option(AMP_FORMAT_CHECK "Add the ctest that every source matches .clang-format (needs clang-format-14)" ON)
if(NOT AMP_BUILD_TESTS OR NOT AMP_FORMAT_CHECK)
  return()
endif()
find_program(AMP_CLANG_FORMAT NAMES clang-format-14)
if(NOT AMP_CLANG_FORMAT)
  message(FATAL_ERROR "amp: clang-format-14 not found, and the tests include the format check. "
    "Install it (scripts/setup does; on Debian 12: apt-get install clang-format), or configure "
    "with -DAMP_FORMAT_CHECK=OFF to build the tests without that check.")
endif()
set(_amp_format_test "format: every source and header of src, include, tests, examples and bench matches .clang-format")
add_test(NAME "${_amp_format_test}"
  COMMAND "${CMAKE_COMMAND}" "-DCLANG_FORMAT=${AMP_CLANG_FORMAT}"
    "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" -P "${PROJECT_SOURCE_DIR}/cmake/AmpFormatCheck.cmake")
set_tests_properties("${_amp_format_test}" PROPERTIES LABELS docs)
