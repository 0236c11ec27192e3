# SPDX-License-Identifier: Apache-2.0
# For test scripts run as `cmake -D... -P SCRIPT -- ARGS...`: sets `out` to the list of ARGS
# (everything after the "--").
macro(tpu_script_args out)
    set(${out})
    set(_tpu_after_separator FALSE)
    math(EXPR _tpu_last "${CMAKE_ARGC} - 1")
    foreach(_tpu_i RANGE 1 ${_tpu_last})
        if(_tpu_after_separator)
            list(APPEND ${out} "${CMAKE_ARGV${_tpu_i}}")
        elseif(CMAKE_ARGV${_tpu_i} STREQUAL "--")
            set(_tpu_after_separator TRUE)
        endif()
    endforeach()
endmacro()
