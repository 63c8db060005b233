# Runs an example program and checks its exit code and output; used by tests/examples
# (cmake -P).
#   PROGRAM        the executable
#   ARGS           its arguments, separated by "|" (CTest would split a ";" list)
#   EXPECT_EXIT    the exit code it must return
#   EXPECT_OUTPUT  optional regular expression that stdout + stderr must match
#   EPOCHS         optional: parse the per-epoch lines (mnist_linear's format, which mlp_fashion
#                  extends) and require this many, each with a finite loss lower than the epoch
#                  before
#   MIN_ACCURACY   optional (with EPOCHS): the last epoch's test accuracy in percent must reach it
#   SCALER         optional (with EPOCHS): ON requires every epoch line to report the loss scale
#                  and the skipped steps (fp16), OFF requires that none does (fp32, bf16)
cmake_minimum_required(VERSION 3.25)

string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND "${PROGRAM}" ${_args}
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
set(_output "${_stdout}${_stderr}")
message("$ ${PROGRAM} ${_args}\n${_output}-- exit code ${_rc}")

if(NOT "${_rc}" STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT}, got ${_rc}")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT _output MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "the output does not match the regular expression: ${EXPECT_OUTPUT}")
endif()

if(DEFINED EPOCHS)
  set(_number "[0-9]+\\.[0-9]+")
  string(REGEX MATCHALL
    "epoch [0-9]+/[0-9]+: mean train loss ${_number}, test accuracy ${_number}%[^\n]*"
    _lines "${_stdout}")
  list(LENGTH _lines _count)
  if(NOT _count EQUAL EPOCHS)
    message(FATAL_ERROR "expected ${EPOCHS} lines 'epoch i/n: mean train loss L, test accuracy A%' "
                        "with finite numbers, found ${_count}")
  endif()
  set(_previous "")
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "loss (${_number}), test accuracy (${_number})%" _ "${_line}")
    set(_loss "${CMAKE_MATCH_1}")
    set(_accuracy "${CMAKE_MATCH_2}")
    if(NOT _previous STREQUAL "" AND NOT _loss LESS _previous)
      message(FATAL_ERROR "the mean training loss did not decrease: ${_previous} then ${_loss}")
    endif()
    set(_previous "${_loss}")
    set(_scaler_regex ", loss scale [0-9]+(\\.[0-9]+)?(e[-+][0-9]+)?, skipped steps [0-9]+ of [0-9]+, ")
    if(SCALER AND NOT _line MATCHES "${_scaler_regex}")
      message(FATAL_ERROR "the epoch line does not report the loss scale and skipped steps: ${_line}")
    elseif(DEFINED SCALER AND NOT SCALER AND _line MATCHES "loss scale")
      message(FATAL_ERROR "the epoch line reports a loss scale without loss scaling: ${_line}")
    endif()
  endforeach()
  if(DEFINED MIN_ACCURACY AND _accuracy LESS MIN_ACCURACY)
    message(FATAL_ERROR "final test accuracy ${_accuracy}% is below ${MIN_ACCURACY}%")
  endif()
  if(NOT _stdout MATCHES "done: precision [a-z0-9]+, test accuracy ${_number}%, training ${_number} s")
    message(FATAL_ERROR "the closing 'done: ...' line is missing")
  endif()
endif()
