# Checks that an option leaves an example's numbers as they were (cmake -P; used by tests/examples):
# runs PROGRAM ARGS, then PROGRAM ARGS EXTRA, and requires the second run's output to match MARK
# (the option took effect) and both runs to print the same epoch lines (without their timings),
# character for character, and the same parameter fingerprint.
#   PROGRAM, ARGS and EXTRA ("|"-separated), MARK (a regex)
cmake_minimum_required(VERSION 3.25)

string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _extra "${EXTRA}")

# Runs the program with ARGS plus ARGN; sets <out_var> to its epoch lines without timings and
# <out_var>_params to its parameter fingerprint, <out_var>_stdout to its output.
function(run_program out_var)
  execute_process(COMMAND "${PROGRAM}" ${_args} ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
  message("$ ${PROGRAM} ${_args} ${ARGN}\n${_stdout}${_stderr}-- exit code ${_rc}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "expected exit code 0, got ${_rc}")
  endif()
  string(REGEX MATCHALL "epoch [0-9]+/[0-9]+: [^\n]*" _lines "${_stdout}")
  list(TRANSFORM _lines REPLACE ", [0-9]+\\.[0-9]+ s$" "")
  if(NOT _stdout MATCHES "parameters: fingerprint ([0-9a-f]+)")
    message(FATAL_ERROR "the 'parameters: fingerprint ...' line is missing")
  endif()
  set(${out_var} "${_lines}" PARENT_SCOPE)
  set(${out_var}_params "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${out_var}_stdout "${_stdout}" PARENT_SCOPE)
endfunction()

run_program(_plain)
run_program(_with ${_extra})
if(NOT _with_stdout MATCHES "${MARK}")
  message(FATAL_ERROR "the run with ${EXTRA} does not print '${MARK}'")
endif()
if(_plain STREQUAL "")
  message(FATAL_ERROR "the runs printed no epoch lines")
endif()
if(NOT _with STREQUAL _plain)
  string(REPLACE ";" "\n  " _plain_text "${_plain}")
  string(REPLACE ";" "\n  " _with_text "${_with}")
  message(FATAL_ERROR "the epochs differ with ${EXTRA}:\nwithout:\n  ${_plain_text}\n"
                      "with:\n  ${_with_text}")
endif()
if(NOT _with_params STREQUAL _plain_params)
  message(FATAL_ERROR "the final parameters differ: fingerprint ${_plain_params} without "
                      "${EXTRA}, ${_with_params} with it")
endif()
message("-- the epoch lines and the final parameters are identical with ${EXTRA}")
