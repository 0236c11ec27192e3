# SPDX-License-Identifier: Apache-2.0
# cmake -DTPUSIM=BIN -DMPIEXEC=BIN -DWORK=DIR -DNAME=N -P equivalence.cmake -- ARGS...
# Runs `tpusim ARGS --stats ...` in one process and under mpirun with 2 and 4 ranks, and fails
# unless the three runs agree byte for byte: stdout without its host-time fields, the stats
# file, every other file named by a `@OUT@` argument (replaced by a per-run path), and the
# warnings on stderr (printed once, by rank 0). -DEXPECT_WARNING=1: the runs must warn.
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/script_args.cmake)
tpu_script_args(args)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
foreach(np 1 2 4)
    set(run_args)
    foreach(a IN LISTS args)
        string(REPLACE "@OUT@" "${WORK}/${NAME}.np${np}" a "${a}")
        list(APPEND run_args "${a}")
    endforeach()
    list(APPEND run_args --stats "${WORK}/${NAME}.np${np}.stats.json")
    if(np EQUAL 1)
        set(command "${TPUSIM}" ${run_args})
    else()
        set(command "${MPIEXEC}" -n ${np} --oversubscribe --allow-run-as-root "${TPUSIM}"
                    ${run_args})
    endif()
    string(TIMESTAMP t0 "%s")
    execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err TIMEOUT 280)
    string(TIMESTAMP t1 "%s")
    math(EXPR took "${t1} - ${t0}")
    message("${np} process(es): exit ${rc}, ${took} s\n${out}${err}")
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${NAME} with ${np} process(es) failed")
    endif()
    # Host time differs from run to run; everything simulated must not.
    string(REGEX REPLACE "\"host_seconds[a-z_]*\":[^,}]*,?" "" out "${out}")
    set(out_${np} "${out}")
    string(REGEX MATCHALL "warning:[^\n]*" warn_${np} "${err}")
endforeach()
if(EXPECT_WARNING AND NOT warn_1)
    message(FATAL_ERROR "${NAME}: expected a warning on stderr, got none")
endif()
foreach(np 2 4)
    if(NOT "${warn_${np}}" STREQUAL "${warn_1}")
        message(FATAL_ERROR "${NAME}: warnings with ${np} ranks differ from one process:\n"
                            "${warn_${np}}\nvs\n${warn_1}")
    endif()
    if(NOT out_${np} STREQUAL out_1)
        message(FATAL_ERROR "${NAME}: stdout with ${np} ranks differs from one process:\n"
                            "${out_${np}}\nvs\n${out_1}")
    endif()
    file(GLOB files RELATIVE "${WORK}" "${WORK}/${NAME}.np1.*")
    foreach(f IN LISTS files)
        string(REPLACE ".np1." ".np${np}." g "${f}")
        execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files "${WORK}/${f}" "${WORK}/${g}"
                        RESULT_VARIABLE same)
        if(NOT same EQUAL 0)
            message(FATAL_ERROR "${NAME}: ${g} differs from ${f} (one process)")
        endif()
        message("${g} == ${f}")
    endforeach()
endforeach()
