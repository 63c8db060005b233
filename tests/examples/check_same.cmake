# Checks that an option leaves an example's numbers as they were (cmake -P; used by tests/examples):
# runs PROGRAM ARGS, then PROGRAM ARGS EXTRA, and requires the second run's output to match MARK
# (the option took effect) and both runs to print the same epoch lines (without their timings),
# character for character, and the same parameter fingerprint.
#   PROGRAM, ARGS and EXTRA ("|"-separated), MARK (a regex)
cmake_minimum_required(VERSION 3.25)

include("${CMAKE_CURRENT_LIST_DIR}/run_helpers.cmake")
string(REPLACE "|" ";" _extra "${EXTRA}")

run_program(_plain_stdout)
run_program(_with_stdout ${_extra})
epoch_lines(_plain "${_plain_stdout}" 0)
epoch_lines(_with "${_with_stdout}" 0)
require_match("${_with_stdout}" "${MARK}" "the run with ${EXTRA} does not print '${MARK}'")
if(_plain STREQUAL "")
  message(FATAL_ERROR "the runs printed no epoch lines")
endif()
require_same_runs("without ${EXTRA}" "${_plain}" "${_plain_params}" "with ${EXTRA}" "${_with}"
                  "${_with_params}")
message("-- the epoch lines and the final parameters are identical with ${EXTRA}")
