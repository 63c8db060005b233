# Run by the ctest "format: ..." (cmake/AmpFormat.cmake): every C++ and CUDA source and header of
# src/, include/, tests/, examples/ and bench/ must be what clang-format makes of it under .clang-format. Prints each file
# that differs and the command that fixes them.
# Inputs: -DCLANG_FORMAT=<program> -DSOURCE_DIR=<repository root>
set(_globs "")
foreach(_dir IN ITEMS src include tests examples bench)
  foreach(_ext IN ITEMS h cpp cuh cu)
    list(APPEND _globs "${SOURCE_DIR}/${_dir}/*.${_ext}")
  endforeach()
endforeach()
file(GLOB_RECURSE _files RELATIVE "${SOURCE_DIR}" ${_globs})
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
message(STATUS "all ${_count} files of src, include, tests, examples and bench match .clang-format")
