# Run by the ctest "format: ..." (cmake/AmpFormat.cmake): every C++ and CUDA source and header of
# src/ and include/ must be what clang-format makes of it under .clang-format. Prints each file
# that differs and the command that fixes them.
# Inputs: -DCLANG_FORMAT=<program> -DSOURCE_DIR=<repository root>
file(GLOB_RECURSE _files RELATIVE "${SOURCE_DIR}"
  "${SOURCE_DIR}/src/*.h" "${SOURCE_DIR}/src/*.cpp" "${SOURCE_DIR}/src/*.cuh"
  "${SOURCE_DIR}/src/*.cu" "${SOURCE_DIR}/include/*.h")
list(SORT _files)
set(_differ "")
foreach(_file IN LISTS _files)
  execute_process(COMMAND "${CLANG_FORMAT}" --style=file --dry-run --Werror "${_file}"
    WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE _status OUTPUT_QUIET ERROR_QUIET)
  if(NOT _status EQUAL 0)
    list(APPEND _differ "${_file}")
  endif()
endforeach()
list(LENGTH _files _count)
if(_differ)
  list(LENGTH _differ _bad)
  list(JOIN _differ "\n  " _listed)
  message(FATAL_ERROR "${_bad} of ${_count} files differ from .clang-format:\n  ${_listed}\n"
    "Format them: ${CLANG_FORMAT} -i --style=file <files> (from the repository root).")
endif()
message(STATUS "all ${_count} files of src/ and include/ match .clang-format")
