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

include("${CMAKE_CURRENT_LIST_DIR}/run_helpers.cmake")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(_split "${WORK_DIR}/split.pt")
run_program(_whole --epochs ${EPOCHS} --checkpoint "${WORK_DIR}/whole.pt")
if(STOP_WITH STREQUAL "epochs")
  run_program(_first --epochs ${STOP_AFTER} --checkpoint "${_split}")
elseif(STOP_WITH STREQUAL "stop-after")
  run_program(_first --epochs ${EPOCHS} --checkpoint "${_split}" --stop-after ${STOP_AFTER})
  require_match("${_first}" "stopped after epoch ${STOP_AFTER} of ${EPOCHS} \\(--stop-after\\)"
                "the interrupted run does not say it stopped after epoch ${STOP_AFTER}")
else()
  message(FATAL_ERROR "STOP_WITH is '${STOP_WITH}'; set it to epochs or stop-after")
endif()
run_program(_rest --epochs ${EPOCHS} --checkpoint "${_split}" --resume)
require_match("${_rest}" "resumed from [^\n]*split.pt after epoch ${STOP_AFTER}\n"
              "the resumed run does not say it resumed after epoch ${STOP_AFTER}")

epoch_lines(_expected "${_whole}" ${STOP_AFTER})
epoch_lines(_actual "${_rest}" ${STOP_AFTER})
list(LENGTH _expected _count)
math(EXPR _want "${EPOCHS} - ${STOP_AFTER}")
if(NOT _count EQUAL _want)
  message(FATAL_ERROR "the uninterrupted run printed ${_count} lines for epochs after "
                      "${STOP_AFTER}, expected ${_want}")
endif()
require_same_runs("uninterrupted" "${_expected}" "${_expected_params}" "resumed" "${_actual}"
                  "${_actual_params}")
# A checkpoint only continues the run it came from: other settings are refused, naming both.
execute_process(COMMAND "${PROGRAM}" ${_args} --epochs ${EPOCHS} --checkpoint "${_split}"
    --resume --batch-size 7
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
if(NOT _rc EQUAL 1 OR NOT _stderr MATCHES "was written with batch-size [0-9]+ but this run has batch-size 7; resume with the checkpoint's settings")
  message(FATAL_ERROR "resuming with another --batch-size gave exit code ${_rc} and:\n${_stderr}")
endif()
message("-- epochs ${STOP_AFTER}+1..${EPOCHS} and the final parameters are identical")
