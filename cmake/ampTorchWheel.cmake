# Link fix-up for LibTorch from a PyPI torch wheel, shared by amp's build and its installed package.
#
# The wheel's CUDA libraries (libtorch_cuda.so, ...) find their NVIDIA dependencies (NCCL, cuDNN,
# cuBLAS, ...) in sibling site-packages/nvidia/*/lib folders through $ORIGIN RPATHs. The dynamic
# loader follows those at run time, but GNU ld does not when it checks a shared library's own
# dependencies at link time: it falls back to ld.so.conf, where a system CUDA's older copy (e.g.
# /usr/local/cuda/lib/libnccl.so.2) may lack symbols and fail the link. Pointing -rpath-link at
# the wheel's folders makes link time agree with run time. The folders are derived from the
# Torch found at configure time, so nothing of the build machine is baked into installed files.
include_guard(GLOBAL)

function(amp_torch_wheel_link_options out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(NOT Torch_DIR OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  # Torch_DIR is site-packages/torch/share/cmake/Torch.
  get_filename_component(_site "${Torch_DIR}/../../../.." ABSOLUTE)
  file(GLOB _dirs LIST_DIRECTORIES true "${_site}/nvidia/*/lib")
  if(_dirs)
    list(JOIN _dirs ":" _joined)
    set(${out_var} "LINKER:-rpath-link,${_joined}" PARENT_SCOPE)
  endif()
endfunction()

# Adds the link options a program using the installed amp::amp needs to the imported target:
# - the -rpath-link fix above;
# - --disable-new-dtags, so the program's run-time search path is a DT_RPATH rather than a
#   DT_RUNPATH. An installed libamp carries no search path to LibTorch (LibTorch's place differs
#   on every machine, and no path of the build machine may be baked in), so its own dependencies
#   (libc10_cuda.so, libtorch.so, ...) are found through the program's search path, which CMake
#   fills with LibTorch's folder. A DT_RUNPATH only serves the program's direct dependencies; a
#   DT_RPATH serves libamp's too.
function(amp_apply_torch_wheel_link_options target)
  amp_torch_wheel_link_options(_options)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    list(APPEND _options "LINKER:--disable-new-dtags")
  endif()
  if(_options)
    set_property(TARGET ${target} APPEND PROPERTY INTERFACE_LINK_OPTIONS "${_options}")
  endif()
endfunction()
