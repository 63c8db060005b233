# Checks that mnist_linear resumed from a checkpoint continues exactly as an uninterrupted run
# (cmake -P; used by tests/examples). Runs, in WORK_DIR:
#   1. PROGRAM ARGS --epochs EPOCHS --checkpoint full.pt              (uninterrupted)
#   2. PROGRAM ARGS --epochs STOP_AFTER --checkpoint resumed.pt       (stopped early)
#   3. PROGRAM ARGS --epochs EPOCHS --checkpoint resumed.pt --resume  (continued)
# and requires run 3's epoch lines (without their timings) to equal run 1's for the epochs after
# STOP_AFTER, character for character, and both runs to print the same parameter fingerprint;
# then checks that resuming with another --batch-size is refused.
#   PROGRAM, ARGS ("|"-separated), EPOCHS, STOP_AFTER, WORK_DIR
cmake_minimum_required(VERSION 3.25)

string(REPLACE "|" ";" _args "${ARGS}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs the program; sets <out_var> to its stdout, failing the test on a non-zero exit code.
function(run_program out_var)
  execute_process(COMMAND "${PROGRAM}" ${_args} ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
  message("$ ${PROGRAM} ${_args} ${ARGN}\n${_stdout}${_stderr}-- exit code ${_rc}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "expected exit code 0, got ${_rc}")
  endif()
  set(${out_var} "${_stdout}" PARENT_SCOPE)
endfunction()

# Sets <out_var> to the list of epoch lines of <stdout> numbered above <after>, each without its
# trailing ", T s" timing.
function(epoch_lines out_var stdout after)
  string(REGEX MATCHALL "epoch [0-9]+/[0-9]+: [^\n]*" _lines "${stdout}")
  set(_kept "")
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "^epoch ([0-9]+)/" _ "${_line}")
    if(CMAKE_MATCH_1 GREATER after)
      string(REGEX REPLACE ", [0-9]+\\.[0-9]+ s$" "" _line "${_line}")
      list(APPEND _kept "${_line}")
    endif()
  endforeach()
  set(${out_var} "${_kept}" PARENT_SCOPE)
endfunction()

function(fingerprint out_var stdout)
  if(NOT stdout MATCHES "parameters: fingerprint ([0-9a-f]+)")
    message(FATAL_ERROR "the 'parameters: fingerprint ...' line is missing")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

run_program(_full --epochs ${EPOCHS} --checkpoint "${WORK_DIR}/full.pt")
run_program(_first --epochs ${STOP_AFTER} --checkpoint "${WORK_DIR}/resumed.pt")
run_program(_rest --epochs ${EPOCHS} --checkpoint "${WORK_DIR}/resumed.pt" --resume)

if(NOT _rest MATCHES "resumed from [^\n]*resumed.pt after epoch ${STOP_AFTER}\n")
  message(FATAL_ERROR "the resumed run does not say it resumed after epoch ${STOP_AFTER}")
endif()
epoch_lines(_expected "${_full}" ${STOP_AFTER})
epoch_lines(_actual "${_rest}" ${STOP_AFTER})
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
fingerprint(_full_params "${_full}")
fingerprint(_rest_params "${_rest}")
if(NOT _full_params STREQUAL _rest_params)
  message(FATAL_ERROR "the final parameters differ: fingerprint ${_full_params} uninterrupted, "
                      "${_rest_params} resumed")
endif()
# A checkpoint only continues the run it came from: other settings are refused, naming both.
execute_process(COMMAND "${PROGRAM}" ${_args} --epochs ${EPOCHS} --checkpoint
    "${WORK_DIR}/resumed.pt" --resume --batch-size 7
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
if(NOT _rc EQUAL 1 OR NOT _stderr MATCHES "was written with batch-size [0-9]+ but this run has batch-size 7; resume with the checkpoint's settings")
  message(FATAL_ERROR "resuming with another --batch-size gave exit code ${_rc} and:\n${_stderr}")
endif()
message("-- epochs ${STOP_AFTER}+1..${EPOCHS} and the final parameters are identical")
