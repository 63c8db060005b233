# Checks that mlp_fashion and its Python twin (examples/mlp_fashion/train.py) continue each other's
# runs exactly through the Python-format checkpoint (cmake -P; used by tests/examples). In
# WORK_DIR, both ways:
#   1. the uninterrupted run of EPOCHS epochs, in each language;
#   2. a run stopped after STOP_AFTER epochs in one language (--stop-after, saving split.pt);
#   3. the other language resuming split.pt (--resume) to the end;
# and requires run 3's epoch lines after STOP_AFTER (without their timings) and its parameter
# fingerprint to equal those of the other language's uninterrupted run, and the two uninterrupted
# runs to agree with each other in every epoch.
#   PROGRAM (mlp_fashion), PYTHON, SCRIPT (train.py), ARGS ("|"-separated, without --epochs,
#   --checkpoint and --checkpoint-format), EPOCHS, STOP_AFTER, WORK_DIR; optionally EXPECT, a
#   regex both uninterrupted runs' output must match (so a case shows it exercised what it names)
cmake_minimum_required(VERSION 3.25)

include("${CMAKE_CURRENT_LIST_DIR}/run_helpers.cmake")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
string(REPLACE "|" ";" _common "${ARGS}")

# run_program with the C++ program or the Python script (run_helpers reads PROGRAM and _args).
function(run_in language out_var)
  if(language STREQUAL "python")
    set(PROGRAM "${PYTHON}")
    set(_args "${SCRIPT}" ${_common})
  else()
    set(_args ${_common} --checkpoint-format python)
  endif()
  run_program(_out ${ARGN})
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

foreach(_language IN ITEMS cpp python)
  run_in(${_language} _whole_${_language} --epochs ${EPOCHS}
         --checkpoint "${WORK_DIR}/whole_${_language}.pt")
  if(DEFINED EXPECT)
    require_match("${_whole_${_language}}" "${EXPECT}"
                  "the ${_language} run's output does not match '${EXPECT}':\n${_whole_${_language}}")
  endif()
  epoch_lines(_lines_${_language} "${_whole_${_language}}" ${STOP_AFTER})
  set(_params_${_language} "${_lines_${_language}_params}")
  epoch_lines(_all_${_language} "${_whole_${_language}}" 0)
endforeach()
# Every epoch, the first ones too (fp16's skipped steps are all in epoch 1).
require_same_runs("C++ uninterrupted" "${_all_cpp}" "${_params_cpp}" "Python uninterrupted"
                  "${_all_python}" "${_params_python}")

foreach(_pair IN ITEMS "python;cpp" "cpp;python")
  list(GET _pair 0 _first)
  list(GET _pair 1 _second)
  set(_split "${WORK_DIR}/split_from_${_first}.pt")
  run_in(${_first} _ --epochs ${EPOCHS} --checkpoint "${_split}" --stop-after ${STOP_AFTER})
  run_in(${_second} _rest --epochs ${EPOCHS} --checkpoint "${_split}" --resume)
  require_match("${_rest}" "resumed from [^\n]*split_from_${_first}.pt after epoch ${STOP_AFTER}\n"
                "the ${_second} run does not say it resumed after epoch ${STOP_AFTER}")
  epoch_lines(_resumed "${_rest}" ${STOP_AFTER})
  require_same_runs("${_second} uninterrupted" "${_lines_${_second}}" "${_params_${_second}}"
                    "${_second} resumed from ${_first}" "${_resumed}" "${_resumed_params}")
endforeach()
message("-- C++ and Python continue each other's runs: epochs ${STOP_AFTER}+1..${EPOCHS} and the "
        "final parameters are identical both ways")
