# Checks that mlp_fashion interrupted by --stop-after and continued with --resume prints the same
# later epochs and ends with the same parameters as a run that was never interrupted (cmake -P).
#   PROGRAM, ARGS ("|"-separated, without --epochs/--checkpoint), EPOCHS, STOP_AFTER, WORK_DIR
cmake_minimum_required(VERSION 3.25)

string(REPLACE "|" ";" _args "${ARGS}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs the program with the common arguments plus ARGN; sets <out_var> to its stdout.
function(run out_var)
  execute_process(COMMAND "${PROGRAM}" ${_args} --epochs ${EPOCHS} ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
  message("$ ${PROGRAM} ${_args} --epochs ${EPOCHS} ${ARGN}\n${_stdout}${_stderr}-- exit code ${_rc}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "expected exit code 0, got ${_rc}")
  endif()
  set(${out_var} "${_stdout}" PARENT_SCOPE)
endfunction()

# Sets <out_var> to <stdout>'s epoch lines after epoch STOP_AFTER, without their timings, and
# <out_var>_params to its parameter fingerprint.
function(later_epochs out_var stdout)
  string(REGEX MATCHALL "epoch [0-9]+/[0-9]+: [^\n]*" _lines "${stdout}")
  set(_kept "")
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "^epoch ([0-9]+)/" _ "${_line}")
    if(CMAKE_MATCH_1 GREATER STOP_AFTER)
      string(REGEX REPLACE ", [0-9.]+ s$" "" _line "${_line}")
      list(APPEND _kept "${_line}")
    endif()
  endforeach()
  if(NOT stdout MATCHES "parameters: fingerprint ([0-9a-f]+)")
    message(FATAL_ERROR "the 'parameters: fingerprint ...' line is missing")
  endif()
  set(${out_var} "${_kept}" PARENT_SCOPE)
  set(${out_var}_params "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

run(_whole --checkpoint "${WORK_DIR}/whole.pt")
run(_first --checkpoint "${WORK_DIR}/split.pt" --stop-after ${STOP_AFTER})
if(NOT _first MATCHES "stopped after epoch ${STOP_AFTER} of ${EPOCHS} \\(--stop-after\\)")
  message(FATAL_ERROR "the interrupted run does not say it stopped after epoch ${STOP_AFTER}")
endif()
run(_rest --checkpoint "${WORK_DIR}/split.pt" --resume)
if(NOT _rest MATCHES "resumed from [^\n]*split.pt after epoch ${STOP_AFTER}\n")
  message(FATAL_ERROR "the continued run does not say it resumed after epoch ${STOP_AFTER}")
endif()

later_epochs(_expected "${_whole}")
later_epochs(_actual "${_rest}")
list(LENGTH _expected _count)
math(EXPR _want "${EPOCHS} - ${STOP_AFTER}")
if(NOT _count EQUAL _want)
  message(FATAL_ERROR "the uninterrupted run printed ${_count} epoch lines after epoch "
                      "${STOP_AFTER}, expected ${_want}")
endif()
if(NOT _actual STREQUAL _expected)
  string(REPLACE ";" "\n  " _expected "${_expected}")
  string(REPLACE ";" "\n  " _actual "${_actual}")
  message(FATAL_ERROR "the resumed epochs differ:\nuninterrupted:\n  ${_expected}\n"
                      "resumed:\n  ${_actual}")
endif()
if(NOT _actual_params STREQUAL _expected_params)
  message(FATAL_ERROR "the final parameters differ: fingerprint ${_expected_params} "
                      "uninterrupted, ${_actual_params} resumed")
endif()
message("-- epochs after ${STOP_AFTER} and the final parameters are identical")
