// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "sim/reflect.h"

namespace tpu::hw {

// What the host's software costs per training step: the estimated wall-clock timeline of
// trainer/host_timeline.h (trainer/README.md, "Host timeline"). The device never waits for these
// in the simulation; the estimate adds them on the host's side of PyTorch/XLA's asynchronous
// execution. Published figures are cited; the rest is marked (assumed).
#define TPU_RUNTIME_FIELDS(F, S)                                                                 \
    F(double, trace_op_us, 30, "us",                                                             \
      "host time to record one op into the step's lazy graph (assumed: pytorch/xla#3043 "        \
      "measured 24 ms to trace BERT-base's forward at batch 8, some hundreds of ops)",           \
      .min = 0)                                                                                  \
    F(double, step_overhead_us, 100, "us",                                                       \
      "fixed host time per step besides its ops: the training loop, the data loader's hand-"     \
      "off, hashing the graph at mark_step (assumed)",                                           \
      .min = 0)                                                                                  \
    F(double, compile_base_ms, 270, "ms",                                                        \
      "compiling a step's graph on a compile-cache miss, fixed part (jax#18224: ~270 ms to "     \
      "compile a trivial pmapped function for a TPU v3-32)",                                     \
      .min = 0)                                                                                  \
    F(double, compile_op_ms, 2, "ms", "compiling a step's graph, per op of the graph (assumed)", \
      .min = 0)                                                                                  \
    F(double, dispatch_us, 600, "us",                                                            \
      "handing one compiled program to the device (jax#18224: ~600 us of host dispatch per "     \
      "call on a TPU v3-32)",                                                                    \
      .min = 0)                                                                                  \
    F(double, host_read_us, 50, "us",                                                            \
      "a host read (.item()) besides waiting for the device and the host-link transfer: the "    \
      "runtime turning the device buffer into a host value (assumed)",                           \
      .min = 0)                                                                                  \
    F(double, cpu_fallback_us, 1000, "us",                                                       \
      "an op PyTorch/XLA runs on the CPU (an aten:: fallback): its inputs copied to the host, "  \
      "computed there and the result copied back, besides the device sync it forces (assumed)",  \
      .min = 0)

/// Host software costs of a training step, for the estimated wall-clock time beside the
/// simulated device time.
struct RuntimeConfig {
    TPU_REFLECT(TPU_RUNTIME_FIELDS)
};

}  // namespace tpu::hw
