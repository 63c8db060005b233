# Finds amp's dependencies: LibTorch (from the project's .venv unless told otherwise), the CUDA
# toolkit; then decides AMP_WITH_CUDA.
include_guard(GLOBAL)

# ---- LibTorch ----
# The PyPI torch wheel in .venv carries LibTorch. Ask that Python where its CMake package lives,
# unless the caller already pointed CMake at a Torch (Torch_DIR or CMAKE_PREFIX_PATH).
set(AMP_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python whose torch provides LibTorch and serves as the reference in parity tests")
if(NOT Torch_DIR AND EXISTS "${AMP_PYTHON}")
  execute_process(
    COMMAND "${AMP_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE _amp_torch_prefix RESULT_VARIABLE _amp_rc ERROR_QUIET)
  if(_amp_rc EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH "${_amp_torch_prefix}")
  endif()
endif()

# A CUDA build of LibTorch enables CUDA itself and needs nvcc even without a GPU. Point CMake at
# the toolkit in its usual place when nothing else was chosen.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
endif()
# Torch turns this list into -gencode flags. 9.0 is the H200; PTX keeps newer GPUs working.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0+PTX" CACHE STRING "CUDA architectures to compile amp's kernels for")
endif()

find_package(Torch REQUIRED)
include(ampTorchWheel)
if(Torch_VERSION VERSION_LESS 2.11)
  message(FATAL_ERROR "amp needs LibTorch 2.11 or newer; found ${Torch_VERSION} at ${Torch_DIR}. "
                      "Install a newer torch (scripts/setup installs the pinned one).")
endif()

# ---- CUDA ----
set(_amp_torch_has_cuda OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(_amp_torch_has_cuda ON)
endif()
find_package(CUDAToolkit QUIET)
set(_amp_cuda_default OFF)
if(CUDAToolkit_FOUND AND _amp_torch_has_cuda)
  set(_amp_cuda_default ON)
endif()
option(AMP_WITH_CUDA "Compile amp's CUDA code (needs a CUDA toolkit and a CUDA build of LibTorch)"
       ${_amp_cuda_default})
if(AMP_WITH_CUDA)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "AMP_WITH_CUDA is ON but no CUDA toolkit was found. Install one (nvcc) or "
                        "configure with -DAMP_WITH_CUDA=OFF.")
  endif()
  if(NOT _amp_torch_has_cuda)
    message(FATAL_ERROR "AMP_WITH_CUDA is ON but LibTorch at ${Torch_DIR} was built without CUDA. "
                        "Use a CUDA build of torch or configure with -DAMP_WITH_CUDA=OFF.")
  endif()
  enable_language(CUDA)
endif()
message(STATUS "amp: LibTorch ${Torch_VERSION} at ${Torch_DIR}; AMP_WITH_CUDA=${AMP_WITH_CUDA}")

# c10d (amp::distributed): LibTorch's process groups, Gloo on the CPU and NCCL on CUDA. The torch
# wheel compiles Gloo in (USE_C10D_GLOO) and ships the c10d headers, but not gloo's own headers,
# which ProcessGroupGloo.hpp includes: Debian's libgloo-dev provides them (scripts/setup). amp
# links no gloo library: libtorch_cpu carries gloo. On by default when all three are present.
set(_amp_distributed_default OFF)
set(_amp_distributed_missing "")
get_target_property(_amp_torch_cpu_defs torch_cpu INTERFACE_COMPILE_DEFINITIONS)
if(NOT _amp_torch_cpu_defs MATCHES "USE_C10D_GLOO")
  list(APPEND _amp_distributed_missing "a LibTorch with Gloo (USE_C10D_GLOO)")
endif()
if(NOT EXISTS "${TORCH_INSTALL_PREFIX}/include/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
  list(APPEND _amp_distributed_missing "LibTorch's c10d headers")
endif()
find_path(AMP_GLOO_INCLUDE_DIR gloo/rendezvous/store.h
          DOC "Folder holding gloo's headers (Debian: libgloo-dev), for ProcessGroupGloo.hpp")
if(NOT AMP_GLOO_INCLUDE_DIR)
  list(APPEND _amp_distributed_missing "gloo's headers (Debian's libgloo-dev)")
endif()
if(NOT _amp_distributed_missing)
  set(_amp_distributed_default ON)
endif()
option(AMP_WITH_DISTRIBUTED "Build amp::distributed (c10d process groups under torchrun)"
       ${_amp_distributed_default})
if(AMP_WITH_DISTRIBUTED AND _amp_distributed_missing)
  list(JOIN _amp_distributed_missing ", " _amp_missing_text)
  message(FATAL_ERROR "AMP_WITH_DISTRIBUTED is ON but this is missing: ${_amp_missing_text}. "
                      "Install Debian's libgloo-dev (scripts/setup does) or configure with "
                      "-DAMP_WITH_DISTRIBUTED=OFF.")
endif()
# NCCL groups (CUDA builds): compiled against the wheel's NCCL headers, which must come before
# the CUDA toolkit's older nccl.h; the version LibTorch reports is checked at compile time.
set(AMP_DISTRIBUTED_NCCL_INCLUDE_DIR "")
set(AMP_TORCH_NCCL_VERSION_CODE "")
if(AMP_WITH_DISTRIBUTED AND AMP_WITH_CUDA)
  get_filename_component(_amp_site "${Torch_DIR}/../../../.." ABSOLUTE)
  if(EXISTS "${_amp_site}/nvidia/nccl/include/nccl.h" AND EXISTS "${AMP_PYTHON}")
    execute_process(
      COMMAND "${AMP_PYTHON}" -c
              "import torch; v = torch.cuda.nccl.version(); print(v[0]*10000 + v[1]*100 + v[2], end='')"
      OUTPUT_VARIABLE _amp_nccl_code RESULT_VARIABLE _amp_rc ERROR_QUIET)
    if(_amp_rc EQUAL 0 AND _amp_nccl_code MATCHES "^[0-9]+$")
      set(AMP_DISTRIBUTED_NCCL_INCLUDE_DIR "${_amp_site}/nvidia/nccl/include")
      set(AMP_TORCH_NCCL_VERSION_CODE "${_amp_nccl_code}")
    endif()
  endif()
endif()
if(_amp_distributed_missing)
  list(JOIN _amp_distributed_missing ", " _amp_missing_text)
  set(_amp_distributed_note " (missing: ${_amp_missing_text})")
elseif(AMP_DISTRIBUTED_NCCL_INCLUDE_DIR)
  set(_amp_distributed_note " (NCCL ${AMP_TORCH_NCCL_VERSION_CODE} headers from ${AMP_DISTRIBUTED_NCCL_INCLUDE_DIR})")
else()
  set(_amp_distributed_note " (Gloo only)")
endif()
message(STATUS "amp: AMP_WITH_DISTRIBUTED=${AMP_WITH_DISTRIBUTED}${_amp_distributed_note}")
