# Runs one of amp's examples and checks what it did (cmake -P; used by tests/examples_more).
#   PROGRAM         the executable
#   ARGS            its arguments, separated by "|" (CTest splits a ";" list into separate args)
#   EXPECT_EXIT     the exit code it must return
#   EXPECT_OUTPUT   optional regular expression that stdout + stderr must match
#   EPOCHS          optional: mlp_fashion's epoch lines must number EPOCHS, each with a finite
#                   mean training loss lower than the epoch before
#   MIN_ACCURACY    optional (with EPOCHS): the last epoch's test accuracy, in percent, must reach it
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
if(NOT DEFINED EPOCHS)
  return()
endif()

set(_number "[0-9]+\\.[0-9]+")
string(REGEX MATCHALL "epoch [0-9]+/[0-9]+: mean train loss ${_number}, test accuracy ${_number}%"
  _lines "${_stdout}")
list(LENGTH _lines _count)
if(NOT _count EQUAL EPOCHS)
  message(FATAL_ERROR "expected ${EPOCHS} lines 'epoch i/n: mean train loss L, test accuracy A%' "
                      "with finite numbers, found ${_count}")
endif()
set(_previous "")
foreach(_line IN LISTS _lines)
  string(REGEX MATCH "loss (${_number}), test accuracy (${_number})%" _ "${_line}")
  if(NOT _previous STREQUAL "" AND NOT CMAKE_MATCH_1 LESS _previous)
    message(FATAL_ERROR "the mean training loss did not decrease: ${_previous} then ${CMAKE_MATCH_1}")
  endif()
  set(_previous "${CMAKE_MATCH_1}")
  set(_accuracy "${CMAKE_MATCH_2}")
endforeach()
if(DEFINED MIN_ACCURACY AND _accuracy LESS MIN_ACCURACY)
  message(FATAL_ERROR "the final test accuracy ${_accuracy}% is below ${MIN_ACCURACY}%")
endif()
