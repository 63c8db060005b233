# The ctest that keeps src/ and include/ formatted as .clang-format says (clang-format 14, which
# scripts/setup installs; another major version formats differently, so only 14 is used).
include_guard(GLOBAL)

find_program(AMP_CLANG_FORMAT NAMES clang-format-14)
if(NOT AMP_CLANG_FORMAT)
  message(STATUS "amp: clang-format-14 not found: no format test (on Debian 12: apt-get install "
    "clang-format)")
  return()
endif()
if(AMP_BUILD_TESTS)
  add_test(NAME "format: every source and header of src/ and include/ matches .clang-format"
    COMMAND "${CMAKE_COMMAND}" "-DCLANG_FORMAT=${AMP_CLANG_FORMAT}"
      "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" -P "${PROJECT_SOURCE_DIR}/cmake/AmpFormatCheck.cmake")
  set_tests_properties("format: every source and header of src/ and include/ matches .clang-format"
    PROPERTIES LABELS docs)
endif()
