# Checks that an example resumed from a checkpoint continues exactly as an uninterrupted run
# (cmake -P; used by tests/examples). Runs, in WORK_DIR:
#   1. PROGRAM ARGS --epochs EPOCHS --checkpoint whole.pt                    (uninterrupted)
#   2. the same run stopped after epoch STOP_AFTER, saving to split.pt, by STOP_WITH:
#      "epochs":     PROGRAM ARGS --epochs STOP_AFTER --checkpoint split.pt  (a shorter run)
#      "stop-after": PROGRAM ARGS --epochs EPOCHS --checkpoint split.pt --stop-after STOP_AFTER
#                    (the full run's schedule, interrupted)
#   3. PROGRAM ARGS --epochs EPOCHS --checkpoint split.pt --resume          (continued)
# and requires run 3's epoch lines (without their timings) to equal run 1's for the epochs after
# STOP_AFTER, character for character, and both runs to print the same parameter fingerprint;
# then checks that resuming with another --batch-size is refused. split.pt is left for other tests.
#   PROGRAM, ARGS ("|"-separated, without --epochs/--checkpoint), EPOCHS, STOP_AFTER, STOP_WITH,
#   WORK_DIR
cmake_minimum_required(VERSION 3.25)

string(REPLACE "|" ";" _args "${ARGS}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs the program with ARGS plus ARGN; sets <out_var> to its stdout, failing the test on a
# non-zero exit code.
function(run_program out_var)
  execute_process(COMMAND "${PROGRAM}" ${_args} ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
  message("$ ${PROGRAM} ${_args} ${ARGN}\n${_stdout}${_stderr}-- exit code ${_rc}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "expected exit code 0, got ${_rc}")
  endif()
  set(${out_var} "${_stdout}" PARENT_SCOPE)
endfunction()

# Sets <out_var> to the epoch lines of <stdout> numbered above STOP_AFTER, each without its
# trailing ", T s" timing, and <out_var>_params to its parameter fingerprint.
function(later_epochs out_var stdout)
  string(REGEX MATCHALL "epoch [0-9]+/[0-9]+: [^\n]*" _lines "${stdout}")
  set(_kept "")
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "^epoch ([0-9]+)/" _ "${_line}")
    if(CMAKE_MATCH_1 GREATER STOP_AFTER)
      string(REGEX REPLACE ", [0-9]+\\.[0-9]+ s$" "" _line "${_line}")
      list(APPEND _kept "${_line}")
    endif()
  endforeach()
  if(NOT stdout MATCHES "parameters: fingerprint ([0-9a-f]+)")
    message(FATAL_ERROR "the 'parameters: fingerprint ...' line is missing")
  endif()
  set(${out_var} "${_kept}" PARENT_SCOPE)
  set(${out_var}_params "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

set(_split "${WORK_DIR}/split.pt")
run_program(_whole --epochs ${EPOCHS} --checkpoint "${WORK_DIR}/whole.pt")
if(STOP_WITH STREQUAL "epochs")
  run_program(_first --epochs ${STOP_AFTER} --checkpoint "${_split}")
elseif(STOP_WITH STREQUAL "stop-after")
  run_program(_first --epochs ${EPOCHS} --checkpoint "${_split}" --stop-after ${STOP_AFTER})
  if(NOT _first MATCHES "stopped after epoch ${STOP_AFTER} of ${EPOCHS} \\(--stop-after\\)")
    message(FATAL_ERROR "the interrupted run does not say it stopped after epoch ${STOP_AFTER}")
  endif()
else()
  message(FATAL_ERROR "STOP_WITH is '${STOP_WITH}'; set it to epochs or stop-after")
endif()
run_program(_rest --epochs ${EPOCHS} --checkpoint "${_split}" --resume)
if(NOT _rest MATCHES "resumed from [^\n]*split.pt after epoch ${STOP_AFTER}\n")
  message(FATAL_ERROR "the resumed run does not say it resumed after epoch ${STOP_AFTER}")
endif()

later_epochs(_expected "${_whole}")
later_epochs(_actual "${_rest}")
list(LENGTH _expected _count)
math(EXPR _want "${EPOCHS} - ${STOP_AFTER}")
if(NOT _count EQUAL _want)
  message(FATAL_ERROR "the uninterrupted run printed ${_count} lines for epochs after "
                      "${STOP_AFTER}, expected ${_want}")
endif()
if(NOT _actual STREQUAL _expected)
  string(REPLACE ";" "\n  " _expected_text "${_expected}")
  string(REPLACE ";" "\n  " _actual_text "${_actual}")
  message(FATAL_ERROR "the resumed run's epochs differ from the uninterrupted run's:\n"
                      "uninterrupted:\n  ${_expected_text}\nresumed:\n  ${_actual_text}")
endif()
if(NOT _actual_params STREQUAL _expected_params)
  message(FATAL_ERROR "the final parameters differ: fingerprint ${_expected_params} "
                      "uninterrupted, ${_actual_params} resumed")
endif()
# A checkpoint only continues the run it came from: other settings are refused, naming both.
execute_process(COMMAND "${PROGRAM}" ${_args} --epochs ${EPOCHS} --checkpoint "${_split}"
    --resume --batch-size 7
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
if(NOT _rc EQUAL 1 OR NOT _stderr MATCHES "was written with batch-size [0-9]+ but this run has batch-size 7; resume with the checkpoint's settings")
  message(FATAL_ERROR "resuming with another --batch-size gave exit code ${_rc} and:\n${_stderr}")
endif()
message("-- epochs ${STOP_AFTER}+1..${EPOCHS} and the final parameters are identical")
