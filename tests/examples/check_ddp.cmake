# Runs mnist_ddp under torchrun and alone, and checks the data-parallel run; used by
# tests/examples/mnist_ddp.cmake (cmake -P).
#   TORCHRUN   torchrun of the project's venv
#   PROGRAM    mnist_ddp
#   RANKS      processes to start (--nproc-per-node)
#   ARGS       the program's arguments, separated by "|"
#   EPOCHS     the epoch lines rank 0 must print
#   BUCKETS    (optional) the DDP bucket count rank 0 must report
# Checks: both runs exit 0; every rank prints the same parameter fingerprint (bit-identical
# parameters); rank 0 prints EPOCHS epoch lines; the final test accuracy is within 0.5 points of
# the one-process run with the same global batch.
cmake_minimum_required(VERSION 3.25)

# Runs the command after <shown> (240 s at the most), prints "$ <shown>" with its output and exit
# code, fails unless it exits 0 ("expected exit code 0 from <what>"), and sets <out_var> to its
# standard output.
function(run_expecting_success out_var what shown)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 240)
  message("$ ${shown}\n${_out}${_err}-- exit code ${_rc}")
  if(NOT _rc STREQUAL "0")
    message(FATAL_ERROR "expected exit code 0 from ${what}, got ${_rc}")
  endif()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

string(REPLACE "|" ";" _args "${ARGS}")
run_expecting_success(_out torchrun
  "torchrun --no-python --nproc-per-node ${RANKS} ${PROGRAM} ${_args}"
  "${TORCHRUN}" --no-python --nproc-per-node ${RANKS} "${PROGRAM}" ${_args})

string(REGEX MATCHALL "rank [0-9]+ parameters: fingerprint [0-9a-f]+" _prints "${_out}")
list(LENGTH _prints _count)
if(NOT _count EQUAL RANKS)
  message(FATAL_ERROR "expected ${RANKS} fingerprint lines, found ${_count}")
endif()
set(_first "")
foreach(_line IN LISTS _prints)
  string(REGEX MATCH "[0-9a-f]+$" _print "${_line}")
  if(_first STREQUAL "")
    set(_first "${_print}")
  elseif(NOT _print STREQUAL _first)
    message(FATAL_ERROR "the ranks' parameters differ: ${_prints}")
  endif()
endforeach()

string(REGEX MATCHALL "epoch [0-9]+/[0-9]+: mean train loss [0-9.]+, test accuracy [0-9.]+%" _epochs "${_out}")
list(LENGTH _epochs _count)
if(NOT _count EQUAL EPOCHS)
  message(FATAL_ERROR "expected ${EPOCHS} epoch lines from rank 0, found ${_count}")
endif()
if(NOT _out MATCHES "mnist_ddp: ${RANKS} ranks \\(gloo\\)")
  message(FATAL_ERROR "rank 0 did not report ${RANKS} ranks on gloo")
endif()
string(REGEX MATCH "done: precision [a-z0-9]+, ${RANKS} ranks, test accuracy ([0-9.]+)%" _ "${_out}")
set(_parallel "${CMAKE_MATCH_1}")
if(DEFINED BUCKETS AND NOT _out MATCHES "DDP buckets ${BUCKETS}\n")
  message(FATAL_ERROR "rank 0 did not report ${BUCKETS} DDP buckets")
endif()

run_expecting_success(_single "the one-process run" "${PROGRAM} ${_args}" "${PROGRAM}" ${_args})
string(REGEX MATCH "done: precision [a-z0-9]+, 1 rank, test accuracy ([0-9.]+)%" _ "${_single}")
set(_one "${CMAKE_MATCH_1}")
if(_parallel STREQUAL "" OR _one STREQUAL "")
  message(FATAL_ERROR "a 'done: ...' line with the test accuracy is missing")
endif()
# Both are printed with two decimals: compare them in hundredths of a point.
string(REPLACE "." "" _parallel_hundredths "${_parallel}")
string(REPLACE "." "" _one_hundredths "${_one}")
math(EXPR _difference "${_parallel_hundredths} - ${_one_hundredths}")
if(_difference LESS -50 OR _difference GREATER 50)
  message(FATAL_ERROR "the ${RANKS}-rank accuracy ${_parallel}% is not within 0.5 points of the "
                      "one-process accuracy ${_one}%")
endif()
message("accuracy: ${RANKS} ranks ${_parallel}%, one process ${_one}%")
