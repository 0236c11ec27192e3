# SPDX-License-Identifier: Apache-2.0
# cmake -DEXPECT_CODE=N -DEXPECT_OUTPUT=REGEX [-DEXPECT_NO_FILES=GLOB] -P expect_abort.cmake --
#       COMMAND ARGS...
# Runs the command and fails unless it exits with EXPECT_CODE and its output (stdout and stderr
# together) matches EXPECT_OUTPUT. PASS_REGULAR_EXPRESSION alone would ignore the exit code.
# With EXPECT_NO_FILES it also fails when a file matching GLOB (hidden files included) is left.
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/script_args.cmake)
tpu_script_args(command)
if(NOT command)
    message(FATAL_ERROR "usage: cmake -DEXPECT_CODE=N -DEXPECT_OUTPUT=REGEX -P ${CMAKE_SCRIPT_MODE_FILE} -- COMMAND...")
endif()
# Below the test's own timeout, so a hang is reported here with the output so far.
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT 50)
message("${out}")
if(NOT rc STREQUAL "${EXPECT_CODE}")
    message(FATAL_ERROR "exit code '${rc}', expected ${EXPECT_CODE}")
endif()
if(NOT out MATCHES "${EXPECT_OUTPUT}")
    message(FATAL_ERROR "the output does not match '${EXPECT_OUTPUT}'")
endif()
if(DEFINED EXPECT_NO_FILES)
    file(GLOB left LIST_DIRECTORIES false "${EXPECT_NO_FILES}")
    if(left)
        message(FATAL_ERROR "files left behind: ${left}")
    endif()
endif()
