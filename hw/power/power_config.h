// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "sim/reflect.h"

namespace tpu::hw {

// The energy estimate's coefficients (hw/README.md, "Power and energy"; the model is
// hw/power/power_model.h). Sources: NeuSim's TPU v3 chip (platformxlab/NeuSim,
// configs/chips/tpuv3.json, the power model of ReGate, MICRO '25), split per block of this board;
// Jouppi et al., "Ten Lessons From Three Generations Shaped Google's TPUv4i", ISCA 2021, Table 2
// (energy per 64-bit access). Everything is an estimate; values not published are (assumed).
#define TPU_POWER_FIELDS(F, S)                                                                  \
    F(double, mxu_static_w, 2.9867, "W",                                                        \
      "static power of one MXU (NeuSim TPU v3: static_power_W_per_sa)", .min = 0)               \
    F(double, vpu_alu_static_w, 0.7413, "W",                                                    \
      "static power of one VPU ALU of sublanes x lanes (NeuSim TPU v3: static_power_W_per_vu, " \
      "a vector unit of 8 x 128 ALUs)",                                                         \
      .min = 0)                                                                                 \
    F(double, vmem_static_w_per_mib, 0.4042, "W",                                               \
      "static power of VMEM per MiB (NeuSim TPU v3: static_power_vmem_W 12.93 W for 32 MB)",    \
      .min = 0)                                                                                 \
    F(double, hbm_static_w_per_channel, 0.315, "W",                                             \
      "static power of the HBM controller and PHY per channel (NeuSim TPU v3: 4.03 + 6.05 W "   \
      "for a chip's 32 channels)",                                                              \
      .min = 0)                                                                                 \
    F(double, ici_static_w_per_chip, 8.96, "W",                                                 \
      "static power of a chip's ICI ports (NeuSim TPU v3: static_power_ici_W)", .min = 0)       \
    F(double, other_static_w_per_chip, 37.113, "W",                                             \
      "static power of the rest of a chip: scalar units, control, clocks, host interface "      \
      "(NeuSim TPU v3: static_power_other_W)",                                                  \
      .min = 0)                                                                                 \
    F(double, clocked_idle_w_per_chip, 39.0006, "W",                                            \
      "power a powered, clocked chip draws besides leakage even when it runs nothing: clock "   \
      "tree, ICI SerDes and HBM PHY kept up (Cloud TPU v3's measured minimum chip power, 123 W, " \
      "less the static 83.9994 W above)",                                                       \
      .min = 0)                                                                                 \
    F(double, mxu_pj_per_mac, 1.967, "pJ",                                                      \
      "energy of one MXU multiply-accumulate (NeuSim TPU v3: 30.29 W per 128 x 128 MXU at "     \
      "full use, 940 MHz: 30.29 / (16384 x 0.94e9) J)",                                         \
      .min = 0)                                                                                 \
    F(double, vpu_pj_per_flop, 2.960, "pJ",                                                     \
      "energy of one VPU fp32 operation (NeuSim TPU v3: 2.849 W per 8 x 128-ALU vector unit "   \
      "at full use: 2.849 / (1024 x 0.94e9) J)",                                                \
      .min = 0)                                                                                 \
    F(double, vpu_vmem_bytes_per_flop, 12, "bytes",                                             \
      "VMEM bytes a VPU operation moves: two fp32 operands in, one out (assumed)", .min = 0)    \
    F(double, vmem_pj_per_byte, 4.19, "pJ",                                                     \
      "energy per VMEM byte read or written (Jouppi 2021 Table 2, 1 MB SRAM: 100 pJ per "       \
      "64-bit access at 45 nm, 14 pJ at 7 nm; at TPU v3's 16 nm interpolated on a log scale, "  \
      "33.5 pJ (assumed))",                                                                     \
      .min = 0)                                                                                 \
    F(double, hbm_pj_per_byte, 31.25, "pJ",                                                     \
      "energy per HBM byte read or written (Jouppi 2021 Table 2: HBM2 250-450 pJ per 64-bit "   \
      "access; the low end)",                                                                   \
      .min = 0)                                                                                 \
    F(double, ici_pj_per_byte, 24.70, "pJ",                                                     \
      "energy per byte sent over ICI (NeuSim TPU v3: dynamic_power_ici_W_per_GBps 0.0247)",     \
      .min = 0)                                                                                 \
    F(double, host_link_pj_per_byte, 40, "pJ",                                                  \
      "energy per byte over the host link, chip side (PCIe Gen3 PHY at 5 pJ/bit, assumed)",     \
      .min = 0)

/// Coefficients of the activity-based power and energy estimate.
struct PowerConfig {
    TPU_REFLECT(TPU_POWER_FIELDS)
};

}  // namespace tpu::hw
