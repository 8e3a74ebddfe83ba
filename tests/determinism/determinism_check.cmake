# tests/determinism/determinism_check.cmake (cmake -P): runs the determinism probes and asserts
# that every run printed the same hash.
#
#   -DPROBE_O3=... -DPROBE_O2=... -DPROBE_O0=...  the probe executables
#   -DORACLE_DIR=...                              golden/oracle
#   -DPROMPT_LEN=N                                prompt tokens every run uses
#
# Runs: O3 with DSV41_THREADS=1, O3 with 2, O2 with 2, O0 with 2 (one after the other; each probe
# runs the forward on its thread count). Prints every probe's line and time; fails on a probe
# error, a malformed line, or any two hashes that differ.
cmake_minimum_required(VERSION 3.24)

foreach(_v PROBE_O3 PROBE_O2 PROBE_O0 ORACLE_DIR PROMPT_LEN)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "determinism_check.cmake: -D${_v}=... is required")
  endif()
endforeach()

set(_runs O3:1 O3:2 O2:2 O0:2)   # level:threads
set(_first "")
set(_failed FALSE)
foreach(_run IN LISTS _runs)
  string(REPLACE ":" ";" _run "${_run}")
  list(GET _run 0 _level)
  list(GET _run 1 _threads)
  string(TIMESTAMP _t0 "%s")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env DSV41_THREADS=${_threads} ${PROBE_${_level}} ${ORACLE_DIR} ${PROMPT_LEN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
  string(TIMESTAMP _t1 "%s")
  math(EXPR _secs "${_t1} - ${_t0}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "probe ${_level}, DSV41_THREADS=${_threads}: exit ${_rc}\n${_out}\n${_err}")
  endif()
  if(NOT _out MATCHES "^fnv1a64=([0-9a-f]+) threads=([0-9]+) variant=${_level} prompt=${PROMPT_LEN} decode=8$")
    message(FATAL_ERROR "probe ${_level}, DSV41_THREADS=${_threads}: unexpected output '${_out}'\n${_err}")
  endif()
  set(_hash ${CMAKE_MATCH_1})
  if(NOT CMAKE_MATCH_2 STREQUAL _threads)
    message(FATAL_ERROR "probe ${_level}: ran on ${CMAKE_MATCH_2} threads, DSV41_THREADS=${_threads}")
  endif()
  message(STATUS "${_out}   (${_err}; ~${_secs} s process)")
  if(_first STREQUAL "")
    set(_first ${_hash})
    set(_first_run "${_level} threads=${_threads}")
  elseif(NOT _hash STREQUAL _first)
    message(SEND_ERROR "hash differs: ${_level} threads=${_threads} gave ${_hash}, ${_first_run} gave ${_first}")
    set(_failed TRUE)
  endif()
endforeach()

if(_failed)
  message(FATAL_ERROR "the reference's bits depend on the thread count or the optimisation level")
endif()
message(STATUS "all 4 runs: fnv1a64=${_first}")
