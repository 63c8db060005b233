# Checks an installed amp tree (cmake -DPREFIX=... -DTORCH_DIR=... -DSOURCE_DIR=... -P inspect_install.cmake):
# the files a consumer needs are there, nothing names the build machine's torch, and libamp
# exports no fmt symbols (so a consumer's own fmt never collides with amp's).
foreach(_file IN ITEMS
    include/amp/amp.h include/amp/version.h include/amp/export.h
    lib/cmake/amp/ampConfig.cmake lib/cmake/amp/ampConfigVersion.cmake
    lib/cmake/amp/ampTargets.cmake)
  if(NOT EXISTS "${PREFIX}/${_file}")
    message(FATAL_ERROR "installed tree lacks ${_file}")
  endif()
endforeach()

file(GLOB _libs "${PREFIX}/lib/libamp.so.*.*.*")
list(LENGTH _libs _n)
if(NOT _n EQUAL 1)
  message(FATAL_ERROR "expected one versioned libamp.so.X.Y.Z under ${PREFIX}/lib, found: ${_libs}")
endif()

# SameMajorVersion: any version of this major (not newer than installed) is accepted, the next
# major is not.
function(amp_version_accepts requested out_var)
  set(PACKAGE_FIND_VERSION "${requested}")
  string(REPLACE "." ";" _parts "${requested}")
  list(GET _parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET _parts 1 PACKAGE_FIND_VERSION_MINOR)
  set(PACKAGE_FIND_VERSION_COUNT 2)
  set(CMAKE_SIZEOF_VOID_P 8)
  include("${PREFIX}/lib/cmake/amp/ampConfigVersion.cmake")
  set(${out_var} ${PACKAGE_VERSION_COMPATIBLE} PARENT_SCOPE)
  set(_installed_major_version "${PACKAGE_VERSION}" PARENT_SCOPE)
endfunction()
amp_version_accepts("0.0" _probe)
string(REGEX MATCH "^[0-9]+" _major "${_installed_major_version}")
math(EXPR _next_major "${_major} + 1")
amp_version_accepts("${_major}.0" _same_major)
amp_version_accepts("${_next_major}.0" _next)
if(NOT _same_major OR _next)
  message(FATAL_ERROR "ampConfigVersion.cmake (version ${_installed_major_version}) should accept "
                      "${_major}.0 and refuse ${_next_major}.0 (SameMajorVersion)")
endif()

# No absolute path to the build machine's torch (or any site-packages) in installed text or RPATH.
# TORCH_DIR is <site-packages>/torch/share/cmake/Torch.
get_filename_component(_site_packages "${TORCH_DIR}/../../../.." ABSOLUTE)
set(_build_machine_paths "${_site_packages}" "${SOURCE_DIR}")
file(GLOB_RECURSE _cmake_files "${PREFIX}/lib/cmake/amp/*.cmake")
foreach(_file IN LISTS _cmake_files)
  file(READ "${_file}" _text)
  foreach(_needle IN LISTS _build_machine_paths)
    string(FIND "${_text}" "${_needle}" _at)
    if(NOT _at EQUAL -1)
      message(FATAL_ERROR "${_file} contains the build machine's path '${_needle}'")
    endif()
  endforeach()
endforeach()
execute_process(COMMAND readelf -d ${_libs} OUTPUT_VARIABLE _dynamic COMMAND_ERROR_IS_FATAL ANY)
string(FIND "${_dynamic}" "${_site_packages}" _at)
if(NOT _at EQUAL -1)
  message(FATAL_ERROR "libamp's RPATH/RUNPATH names site-packages:\n${_dynamic}")
endif()

execute_process(COMMAND nm -D -C --defined-only ${_libs} OUTPUT_VARIABLE _symbols
  COMMAND_ERROR_IS_FATAL ANY)
string(REGEX MATCHALL "[^\n]*fmt::[^\n]*" _fmt_symbols "${_symbols}")
if(_fmt_symbols)
  message(FATAL_ERROR "libamp exports fmt symbols, which would collide with a consumer's fmt:\n"
                      "${_fmt_symbols}")
endif()
# The kernels and their launchers are internal: a consumer must not be able to bind to them (and
# two amp builds in one process must not resolve each other's kernels).
string(REGEX MATCHALL "[^\n]*amp::detail::(cpu|cuda|fallback|ops)::[^\n]*" _kernel_symbols "${_symbols}")
if(_kernel_symbols)
  message(FATAL_ERROR "libamp exports kernel-layer symbols:\n${_kernel_symbols}")
endif()
if(NOT _symbols MATCHES "amp::version")
  message(FATAL_ERROR "libamp does not export amp::version(); the export header is not applied")
endif()
# amp::distributed, when built: installed with its header, linked with no gloo library (LibTorch
# carries gloo; a second copy in the process would clash) and exporting no gloo symbols.
file(GLOB _distributed_libs "${PREFIX}/lib/libamp_distributed.so.*.*.*")
if(_distributed_libs)
  if(NOT EXISTS "${PREFIX}/include/amp/distributed.h" OR NOT EXISTS "${PREFIX}/include/amp/distributed_export.h")
    message(FATAL_ERROR "libamp_distributed is installed without amp/distributed.h")
  endif()
  execute_process(COMMAND readelf -d ${_distributed_libs} OUTPUT_VARIABLE _dynamic COMMAND_ERROR_IS_FATAL ANY)
  if(_dynamic MATCHES "gloo")
    message(FATAL_ERROR "libamp_distributed links a gloo library:\n${_dynamic}")
  endif()
  execute_process(COMMAND nm -D -C --defined-only ${_distributed_libs} OUTPUT_VARIABLE _symbols
    COMMAND_ERROR_IS_FATAL ANY)
  if(_symbols MATCHES "gloo::")
    message(FATAL_ERROR "libamp_distributed exports gloo symbols")
  endif()
  if(NOT _symbols MATCHES "amp::distributed::found_inf_sync")
    message(FATAL_ERROR "libamp_distributed does not export amp::distributed::found_inf_sync")
  endif()
elseif(EXISTS "${PREFIX}/include/amp/distributed.h")
  message(FATAL_ERROR "amp/distributed.h is installed without libamp_distributed")
endif()
message(STATUS "installed amp at ${PREFIX} is complete, relocatable and keeps fmt and its internals private")
