# SPDX-License-Identifier: Apache-2.0
# Pod slices on MPI (hw/README.md, "Pod slices on MPI"): the same run in one process and on 2
# and 4 ranks gives byte-identical results, and a mismatched launch fails on every rank with
# its message instead of hanging. Labelled "mpi" (./tpusim keeps them out of the sanitizer run)
# and each under a timeout.
set(tpu_pod_config ${PROJECT_SOURCE_DIR}/configs/v3-32.json)
set(tpu_pod_mpirun ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG})
add_test(NAME Pod.TrainingIsTheSameOn1And2And4Ranks
         COMMAND ${CMAKE_COMMAND} -DTPUSIM=$<TARGET_FILE:tpusim_cli> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/pod_train -DNAME=train
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/pod/equivalence.cmake --
                 train --config ${tpu_pod_config} --devices 8 --num-nodes 4 --data synthetic
                 --max-steps 3 --limit-test-batches 2 --log-every-n-steps 1 --no-progress --json
                 --checkpoint @OUT@.ckpt)
add_test(NAME Pod.AllReduceIsTheSameOn1And2And4Ranks
         COMMAND ${CMAKE_COMMAND} -DTPUSIM=$<TARGET_FILE:tpusim_cli> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/pod_allreduce -DNAME=allreduce
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/pod/equivalence.cmake --
                 op allreduce --config ${tpu_pod_config} --cores all --elements 4194304 --json)
# TPU v4's 3-D torus and megacore (configs/v4-8.json) split over ranks: one chip per host so
# that its 4 chips make 4 hosts; a device is a chip, each chip's batch split over its 2 cores.
add_test(NAME Pod.MegacoreTorus3dTrainingIsTheSameOn1And2And4Ranks
         COMMAND ${CMAKE_COMMAND} -DTPUSIM=$<TARGET_FILE:tpusim_cli> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/pod_v4 -DNAME=v4
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/pod/equivalence.cmake --
                 train --config ${PROJECT_SOURCE_DIR}/configs/v4-8.json --set chips_per_host=1
                 --devices 1 --num-nodes 4 --data synthetic --max-steps 2 --log-every-n-steps 1
                 --no-progress --json)
# A last batch of 9 rows per device recompiles and warns: every rank records it, rank 0 prints.
add_test(NAME Pod.WarningsPrintOnceOn1And2And4Ranks
         COMMAND ${CMAKE_COMMAND} -DTPUSIM=$<TARGET_FILE:tpusim_cli> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/pod_warn -DNAME=warn -DEXPECT_WARNING=1
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/pod/equivalence.cmake --
                 train --config ${tpu_pod_config} --devices 8 --num-nodes 4 --data synthetic
                 --synthetic-count 800 --epochs 1 --limit-test-batches 1 --no-progress --json)
set_tests_properties(Pod.TrainingIsTheSameOn1And2And4Ranks Pod.AllReduceIsTheSameOn1And2And4Ranks
                     Pod.WarningsPrintOnceOn1And2And4Ranks
                     Pod.MegacoreTorus3dTrainingIsTheSameOn1And2And4Ranks
                     PROPERTIES LABELS "mpi;long" TIMEOUT 900 PROCESSORS 2
                                ENVIRONMENT "SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1")

# name; exit code; output regex; ranks; tpusim arguments
function(tpu_pod_error name code regex np)
    add_test(NAME Pod.${name}
             COMMAND ${CMAKE_COMMAND} -DEXPECT_CODE=${code} "-DEXPECT_OUTPUT=${regex}"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/mpi/expect_abort.cmake --
                     ${tpu_pod_mpirun} ${np} --oversubscribe --allow-run-as-root
                     $<TARGET_FILE:tpusim_cli> ${ARGN})
    set_tests_properties(Pod.${name} PROPERTIES LABELS mpi TIMEOUT 60 PROCESSORS 2
                         ENVIRONMENT "SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1")
endfunction()
tpu_pod_error(RanksThatDoNotDivideTheHostsAreAnError 1
              "3 MPI ranks do not divide the board's 4 TPU hosts" 3
              train --config ${tpu_pod_config} --devices 8 --num-nodes 4 --data synthetic
              --max-steps 1 --no-progress)
tpu_pod_error(DevicesTimesNodesMustBeTheCores 2
              "`devices=8` x `num_nodes=2` = 16 cores, but the board has 32 cores" 2
              train --config ${tpu_pod_config} --devices 8 --num-nodes 2 --data synthetic
              --max-steps 1 --no-progress)
tpu_pod_error(OneNodePerHost 2 "`num_nodes=2`: the board has 4 TPU hosts" 2
              train --config ${tpu_pod_config} --devices 16 --num-nodes 2 --data synthetic
              --max-steps 1 --no-progress)
tpu_pod_error(RanksNeedAHopLatency 1 "needs a hop latency of at least one cycle" 2
              gemm --config ${tpu_pod_config} --set ici.hop_latency_ns=0 --m 128 --k 128 --n 128)
tpu_pod_error(AFaultOnOneRankEndsEveryRank 1 "device fault on core 20 at pc 1 .*outside the program" 2
              run --config ${tpu_pod_config} --cores 20 ${CMAKE_CURRENT_SOURCE_DIR}/pod/fault.s)
tpu_pod_error(ADeadlockOverRanksIsReported 1 "deadlock at cycle" 2
              run --config ${tpu_pod_config} --cores 0,1
              ${PROJECT_SOURCE_DIR}/isa/examples/bad/deadlock.s)
tpu_pod_error(BenchRefusesToRunSplit 2 "bench measures the simulator in one process" 2
              bench --quick --filter gemm_256)
# Issue #30, class 2: each row of validate runs in a forked child, which a rank cannot do.
tpu_pod_error(ValidateRefusesToRunSplit 2 "validate runs each row on a board of its own" 2
              validate --config ${tpu_pod_config})
# Issue #30, class 7: the rank that did not fault is killed by mpirun's SIGTERM while writing
# its per-rank trace; neither rank's hidden temporary file survives the abort.
set(tpu_pod_abort_dir ${CMAKE_CURRENT_BINARY_DIR}/pod_abort_trace)
file(MAKE_DIRECTORY ${tpu_pod_abort_dir})
add_test(NAME Pod.AnAbortLeavesNoTemporaryTrace
         COMMAND ${CMAKE_COMMAND} -DEXPECT_CODE=1 "-DEXPECT_OUTPUT=device fault on core 20"
                 "-DEXPECT_NO_FILES=${tpu_pod_abort_dir}/.t*"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/mpi/expect_abort.cmake --
                 ${tpu_pod_mpirun} 2 --oversubscribe --allow-run-as-root
                 $<TARGET_FILE:tpusim_cli> run --config ${tpu_pod_config} --cores 20
                 --trace ${tpu_pod_abort_dir}/t.json ${CMAKE_CURRENT_SOURCE_DIR}/pod/fault.s)
set_tests_properties(Pod.AnAbortLeavesNoTemporaryTrace PROPERTIES LABELS mpi TIMEOUT 60
                     PROCESSORS 2 ENVIRONMENT "SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1")
