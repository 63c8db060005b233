# API reference: the amp_docs target (Doxygen over include/amp) and a ctest that fails on any warning.
include_guard(GLOBAL)

find_package(Doxygen QUIET)
# The Doxyfile's INPUT_FILTER runs sed to turn the headers' "Args:" lines into Doxygen paragraphs.
find_program(AMP_SED_EXECUTABLE sed)
if(NOT DOXYGEN_FOUND OR NOT AMP_SED_EXECUTABLE)
  message(STATUS "amp: doxygen or sed not found: no amp_docs target and no "
    "docs.api_reference_builds_without_warnings test (on Debian: apt-get install doxygen)")
  return()
endif()

set(AMP_DOCS_OUTPUT_DIR "${PROJECT_BINARY_DIR}/docs/api")
file(MAKE_DIRECTORY "${AMP_DOCS_OUTPUT_DIR}")
set(_amp_doxyfile "${PROJECT_BINARY_DIR}/docs/Doxyfile")
configure_file("${PROJECT_SOURCE_DIR}/docs/Doxyfile.in" "${_amp_doxyfile}" @ONLY)

# The target and the test run the same check: Doxygen (WARN_AS_ERROR=FAIL_ON_WARNINGS), then a
# scan of its XML for undocumented public enumerators. The inputs include the generated version.h,
# which configure writes (src/CMakeLists.txt), so neither needs a build step first.
set(_amp_docs_check
  "${CMAKE_COMMAND}" "-DDOXYGEN=${DOXYGEN_EXECUTABLE}" "-DDOXYFILE=${_amp_doxyfile}"
  "-DXML_DIR=${AMP_DOCS_OUTPUT_DIR}/xml" -P "${PROJECT_SOURCE_DIR}/cmake/AmpDocsCheck.cmake")

add_custom_target(amp_docs
  COMMAND ${_amp_docs_check}
  COMMAND "${CMAKE_COMMAND}" -E echo "amp: API reference in ${AMP_DOCS_OUTPUT_DIR}/html/index.html"
  WORKING_DIRECTORY "${PROJECT_BINARY_DIR}"
  COMMENT "Generating amp's API reference with Doxygen"
  VERBATIM)

if(AMP_BUILD_TESTS)
  add_test(NAME docs.api_reference_builds_without_warnings
    COMMAND ${_amp_docs_check}
    WORKING_DIRECTORY "${PROJECT_BINARY_DIR}")
  set_tests_properties(docs.api_reference_builds_without_warnings PROPERTIES LABELS docs)
endif()
