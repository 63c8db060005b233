# Runs mnist_linear with --metrics and checks the CSV and the plain (not-a-terminal) output; used
# by tests/examples (cmake -P).
#   PROGRAM        the executable
#   ARGS           its arguments, separated by "|"; the script adds --metrics CSV
#   CSV            where the metrics go
#   EXPECT_ROWS    the number of data rows the CSV must have
#   EXPECT_EPOCHS  how many of them are epoch rows (with a test accuracy)
#   LAST_ROW       regular expression the last row must match
#   EXPECT_OUTPUT  regular expression that stdout must match (the summary line)
cmake_minimum_required(VERSION 3.25)

include("${CMAKE_CURRENT_LIST_DIR}/run_helpers.cmake")
get_filename_component(_csv_dir "${CSV}" DIRECTORY)
file(MAKE_DIRECTORY "${_csv_dir}")
file(REMOVE "${CSV}")
run_program(_stdout --metrics "${CSV}")
# ctest captures stdout through a pipe: the progress line must stay off, leaving plain lines.
string(FIND "${_stdout}" "\r" _carriage_return)
if(NOT _carriage_return EQUAL -1)
  message(FATAL_ERROR "the output is not a terminal but contains a carriage return (progress line)")
endif()
require_match("${_stdout}" "${EXPECT_OUTPUT}"
              "the output does not match the regular expression: ${EXPECT_OUTPUT}")

if(NOT EXISTS "${CSV}")
  message(FATAL_ERROR "--metrics ${CSV} wrote no file")
endif()
file(STRINGS "${CSV}" _lines)
list(POP_FRONT _lines _header)
set(_expected_header "precision,epoch,step,train_loss,loss_scale,skipped_steps,samples_per_s,epoch_train_loss,test_accuracy_percent")
if(NOT _header STREQUAL _expected_header)
  message(FATAL_ERROR "the CSV header is\n  ${_header}\nexpected\n  ${_expected_header}")
endif()
list(LENGTH _lines _rows)
if(NOT _rows EQUAL EXPECT_ROWS)
  message(FATAL_ERROR "the CSV has ${_rows} data rows, expected ${EXPECT_ROWS}")
endif()

# Every row: a precision, whole numbers for epoch, step and skipped steps, decimals for the rest;
# an epoch row also has the epoch's loss and the test accuracy, a step row leaves them empty.
set(_int "[0-9]+")
set(_dec "[0-9]+(\\.[0-9]+)?(e[-+][0-9]+)?")
set(_row "^(fp32|bf16|fp16),${_int},${_int},${_dec},${_dec},${_int},${_dec},")
set(_epochs 0)
set(_previous_step 0)
foreach(_line IN LISTS _lines)
  if(_line MATCHES "${_row}${_dec},${_dec}$")
    math(EXPR _epochs "${_epochs} + 1")
  elseif(NOT _line MATCHES "${_row},$")
    message(FATAL_ERROR "a CSV row does not parse: ${_line}")
  endif()
  string(REGEX MATCH "^[a-z0-9]+,[0-9]+,([0-9]+)," _ "${_line}")
  if(NOT CMAKE_MATCH_1 GREATER _previous_step)
    message(FATAL_ERROR "the step column does not increase: ${_previous_step} then ${_line}")
  endif()
  set(_previous_step "${CMAKE_MATCH_1}")
endforeach()
if(NOT _epochs EQUAL EXPECT_EPOCHS)
  message(FATAL_ERROR "the CSV has ${_epochs} epoch rows, expected ${EXPECT_EPOCHS}")
endif()
list(GET _lines -1 _last)
if(NOT _last MATCHES "${LAST_ROW}")
  message(FATAL_ERROR "the last CSV row\n  ${_last}\ndoes not match\n  ${LAST_ROW}")
endif()
message("-- ${_rows} rows, ${_epochs} of them epoch rows, all parse")
