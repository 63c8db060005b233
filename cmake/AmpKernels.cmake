# The CPU side of amp's kernel platform: element loops built once per instruction set.
#
# amp_isa_sources(<target> <impl header> [FLAGS <compile flags>...])
#   Compiles <impl header> (a path under src/) three times into <target>: for baseline x86-64,
#   for AVX2+FMA+F16C and for AVX-512 (F, BW, VL, DQ), through generated one-line sources. The
#   header names what it exports with AMP_ISA_FN(name), which becomes name_default, name_avx2 or
#   name_avx512; src/kernels/cpu_capability.h's CpuKernels picks among them at run time. FLAGS
#   apply to all three (e.g. -ffp-contract=off for bit-exact arithmetic). On another
#   architecture the three are the same baseline code, and only name_default is ever picked.
#
#   An impl header is compiled with instruction-set flags: it must define nothing that other
#   translation units also define (no non-static inline functions of its own, no templates of a
#   shared header instantiated with external linkage), or the linker could keep its AVX-512 copy
#   for every caller. Keep its helpers in an anonymous namespace and export only AMP_ISA_FN names.
set(_amp_isa_flags_default "")
set(_amp_isa_flags_avx2 "")
set(_amp_isa_flags_avx512 "")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(_amp_isa_flags_avx2 -mavx2 -mfma -mf16c)
  # GCC 12 warns about at::vec's AVX-512 masks it cannot follow (maybe-uninitialized).
  set(_amp_isa_flags_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
    -Wno-maybe-uninitialized)
endif()

function(amp_isa_sources target impl)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "" "FLAGS")
  get_filename_component(_stem "${impl}" NAME_WE)
  foreach(_isa IN ITEMS default avx2 avx512)
    set(AMP_ISA "${_isa}")
    set(AMP_ISA_IMPL "${impl}")
    set(_source "${CMAKE_CURRENT_BINARY_DIR}/isa/${_stem}_${_isa}.cpp")
    configure_file("${PROJECT_SOURCE_DIR}/cmake/isa_source.cpp.in" "${_source}" @ONLY)
    target_sources(${target} PRIVATE "${_source}")
    # No precompiled header: it was built without the instruction set's flags.
    set_source_files_properties("${_source}" PROPERTIES
      COMPILE_OPTIONS "${_amp_isa_flags_${_isa}};${ARG_FLAGS}" SKIP_PRECOMPILE_HEADERS ON)
  endforeach()
endfunction()
