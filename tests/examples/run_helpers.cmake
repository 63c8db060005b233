# What the examples' check scripts share (include()d by check_same, check_resume, check_metrics,
# check_cross_language_resume):
# running PROGRAM with ARGS and reading its epoch lines and parameter fingerprint.
#   PROGRAM, ARGS ("|"-separated), in the including script's scope
string(REPLACE "|" ";" _args "${ARGS}")

# Runs PROGRAM with ARGS plus ARGN, echoing the command and what it printed; sets <out_var> to its
# stdout, failing the test on a non-zero exit code.
function(run_program out_var)
  execute_process(COMMAND "${PROGRAM}" ${_args} ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
  message("$ ${PROGRAM} ${_args} ${ARGN}\n${_stdout}${_stderr}-- exit code ${_rc}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "expected exit code 0, got ${_rc}")
  endif()
  set(${out_var} "${_stdout}" PARENT_SCOPE)
endfunction()

# Fails with "<what>" unless <text> matches the regular expression <regex>.
function(require_match text regex what)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${what}")
  endif()
endfunction()

# Sets <out_var> to the epoch lines of <stdout> numbered above <after> (0: all of them), each
# without its trailing ", T s" timing, and <out_var>_params to the parameter fingerprint.
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
  if(NOT stdout MATCHES "parameters: fingerprint ([0-9a-f]+)")
    message(FATAL_ERROR "the 'parameters: fingerprint ...' line is missing")
  endif()
  set(${out_var} "${_kept}" PARENT_SCOPE)
  set(${out_var}_params "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# Fails unless the runs named <name_a> and <name_b> (for the message) printed the same epoch lines
# <a> and <b>, character for character, and the same fingerprints <a_params> and <b_params>.
function(require_same_runs name_a a a_params name_b b b_params)
  if(NOT a STREQUAL b)
    string(REPLACE ";" "\n  " _a_text "${a}")
    string(REPLACE ";" "\n  " _b_text "${b}")
    message(FATAL_ERROR "the epochs differ:\n${name_a}:\n  ${_a_text}\n${name_b}:\n  ${_b_text}")
  endif()
  if(NOT a_params STREQUAL b_params)
    message(FATAL_ERROR "the final parameters differ: fingerprint ${a_params} for ${name_a}, "
                        "${b_params} for ${name_b}")
  endif()
endfunction()
