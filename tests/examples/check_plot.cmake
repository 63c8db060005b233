# Runs scripts/plot-metrics on a --metrics CSV and checks that it writes a PNG; used by
# tests/examples (cmake -P). Without matplotlib the script says so and the test is skipped.
#   PYTHON, SCRIPT, CSV, PNG
cmake_minimum_required(VERSION 3.25)

file(REMOVE "${PNG}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${CSV}" "${PNG}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
message("$ ${PYTHON} ${SCRIPT} ${CSV} ${PNG}\n${_stdout}${_stderr}-- exit code ${_rc}")
if(_stderr MATCHES "matplotlib is not installed")
  # Matched by the test's SKIP_REGULAR_EXPRESSION.
  message("SKIPPED: matplotlib is not installed in ${PYTHON}")
  return()
endif()
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "expected exit code 0, got ${_rc}")
endif()
if(NOT EXISTS "${PNG}")
  message(FATAL_ERROR "no file was written at ${PNG}")
endif()
file(READ "${PNG}" _signature LIMIT 8 HEX)
if(NOT _signature STREQUAL "89504e470d0a1a0a")
  message(FATAL_ERROR "${PNG} is not a PNG file (it starts with ${_signature})")
endif()
file(SIZE "${PNG}" _size)
if(_size LESS 10000)
  message(FATAL_ERROR "${PNG} is only ${_size} bytes: too small to hold the figure")
endif()
message("-- ${PNG}: a PNG of ${_size} bytes")
