// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "hw/board_config.h"

namespace tpu::hw {

/// What the blocks did over an interval, read from the counters they keep anyway.
struct Activity {
    double mxu_macs = 0;    ///< useful MXU multiply-accumulates
    double vpu_flops = 0;   ///< VPU fp32 operations
    double hbm_bytes = 0;   ///< bytes DMA read from or wrote to HBM
    double ici_bytes = 0;   ///< bytes sent over ICI
    double host_bytes = 0;  ///< bytes over the host links, both ways

    Activity& operator+=(const Activity& o) {
        mxu_macs += o.mxu_macs;
        vpu_flops += o.vpu_flops;
        hbm_bytes += o.hbm_bytes;
        ici_bytes += o.ici_bytes;
        host_bytes += o.host_bytes;
        return *this;
    }
};

/// Joules per kind of block (an estimate).
struct Energy {
    double mxu = 0;        ///< MXUs: multiply-accumulates and leakage
    double vpu = 0;        ///< VPU ALUs
    double vmem = 0;       ///< VMEM reads and writes, and leakage
    double hbm = 0;        ///< HBM accesses, and the controller and PHY's leakage
    double ici = 0;        ///< ICI bytes, and the ports' leakage
    double host_link = 0;  ///< host-link bytes (chip side)
    double other = 0;      ///< the rest of each chip (static only)

    double total() const { return mxu + vpu + vmem + hbm + ici + host_link + other; }
    Energy& operator+=(const Energy& o) {
        mxu += o.mxu;
        vpu += o.vpu;
        vmem += o.vmem;
        hbm += o.hbm;
        ici += o.ici;
        host_link += o.host_link;
        other += o.other;
        return *this;
    }
};

/// The power and energy estimate: static power per block while the board is powered, plus an
/// energy per unit of activity, both from config().power (hw/README.md, "Power and energy").
///
///   E = sum over blocks of P_static x t  +  e_mac x MACs + e_vpu x VPU ops
///       + e_vmem x VMEM bytes + e_hbm x HBM bytes + e_ici x ICI bytes + e_host x host bytes
///
/// VMEM bytes are not counted by the blocks; they follow from what the units move through it:
/// every HBM byte a DMA reads lands in VMEM and every byte it writes came from there; an MXU
/// streams one LHS row of `mxu_rows` bf16 values in and one result row of `mxu_cols` fp32 values
/// out per rows x cols multiply-accumulates, i.e. 2 / cols + 4 / rows bytes per MAC; a VPU op
/// moves `vpu_vmem_bytes_per_flop`. Static power per core: MXUs x mxu_static_w + VPU ALUs x
/// vpu_alu_static_w + VMEM MiB x vmem_static_w_per_mib + HBM channels x hbm_static_w_per_
/// channel; per chip: ici_static_w_per_chip + other_static_w_per_chip + clocked_idle_w_per_chip
/// (what a clocked chip draws beyond leakage: its clock tree, SerDes and PHYs stay up whether or
/// not a unit works; counted in the "other" kind).
///
/// Worked example (default board, NeuSim's TPU v3 figures): a core's static power is 2 x 2.9867
/// + 2 x 0.7413 + 16 x 0.4042 + 16 x 0.315 = 18.96 W, a chip's leakage 2 x 18.96 + 8.96 +
/// 37.113 = 84.0 W (NeuSim: idle_power_W 84); with the clocked chip's 39.0 W an idle chip draws
/// 123.0 W, the minimum Cloud TPU v3 measures per chip. Both MXUs of a core at full use add 2 x 16384 MACs x
/// 1.967 pJ x 0.94 GHz = 60.6 W and stream (2 / 128 + 4 / 128) B x 32768 MAC x 0.94 GHz =
/// 1.44 TB/s through VMEM, 6.0 W.
///
/// Everything is linear in time and counts, so energies of disjoint intervals or disjoint
/// blocks add up: per-kernel energies plus the energy outside kernels are the run's total.
class PowerModel {
public:
    explicit PowerModel(const BoardConfig& cfg) : m_cfg(cfg) {}

    /// VMEM bytes implied by `a` (see the class comment).
    double vmem_bytes(const Activity& a) const {
        const PowerConfig& p = m_cfg.power;
        const double per_mac = 2.0 / m_cfg.core.mxu_cols + 4.0 / m_cfg.core.mxu_rows;
        return a.hbm_bytes + a.mxu_macs * per_mac + a.vpu_flops * p.vpu_vmem_bytes_per_flop;
    }

    /// Dynamic energy of `a`, in joules per block kind.
    Energy dynamic(const Activity& a) const {
        const PowerConfig& p = m_cfg.power;
        constexpr double kPico = 1e-12;
        Energy e;
        e.mxu = a.mxu_macs * p.mxu_pj_per_mac * kPico;
        e.vpu = a.vpu_flops * p.vpu_pj_per_flop * kPico;
        e.vmem = vmem_bytes(a) * p.vmem_pj_per_byte * kPico;
        e.hbm = a.hbm_bytes * p.hbm_pj_per_byte * kPico;
        e.ici = a.ici_bytes * p.ici_pj_per_byte * kPico;
        e.host_link = a.host_bytes * p.host_link_pj_per_byte * kPico;
        return e;
    }

    /// Static energy of cores powered for `core_cycles` cycles in all (summed over cores) and
    /// chips' shared blocks powered for `chip_cycles` (summed over chips).
    Energy static_energy(double core_cycles, double chip_cycles) const {
        const PowerConfig& p = m_cfg.power;
        const double core_s = m_cfg.clock().seconds(core_cycles);
        const double chip_s = m_cfg.clock().seconds(chip_cycles);
        Energy e;
        e.mxu = m_cfg.core.mxus * p.mxu_static_w * core_s;
        e.vpu = m_cfg.core.vpu_alus * p.vpu_alu_static_w * core_s;
        e.vmem = vmem_mib() * p.vmem_static_w_per_mib * core_s;
        e.hbm = m_cfg.hbm.channels * p.hbm_static_w_per_channel * core_s;
        e.ici = p.ici_static_w_per_chip * chip_s;
        e.other = (p.other_static_w_per_chip + p.clocked_idle_w_per_chip) * chip_s;
        return e;
    }

    /// Static power of one core's blocks (MXUs, VPU, VMEM, HBM interface), in watts.
    double core_static_w() const { return static_energy(m_cfg.clock().hz(), 0).total(); }
    /// Static power of one chip's shared blocks (ICI ports, the rest), in watts.
    double chip_static_w() const { return static_energy(0, m_cfg.clock().hz()).total(); }
    /// Static power of the whole board (an idle board's power), in watts.
    double board_static_w() const {
        return m_cfg.cores() * core_static_w() + m_cfg.chips * chip_static_w();
    }

    /// The whole board powered for `cycles` with activity `a`: static plus dynamic energy.
    Energy board_energy(const Activity& a, double cycles) const {
        Energy e = static_energy(cycles * m_cfg.cores(), cycles * m_cfg.chips);
        e += dynamic(a);
        return e;
    }

    /// Work of `cores` cores for `core_cycles` summed over them (a kernel's launches): its
    /// dynamic energy, its cores' static energy, and their share (1 / cores_per_chip per core)
    /// of their chips' shared static energy.
    Energy work_energy(const Activity& a, double core_cycles) const {
        Energy e = static_energy(core_cycles, core_cycles / m_cfg.cores_per_chip);
        e += dynamic(a);
        return e;
    }

private:
    double vmem_mib() const { return double(m_cfg.core.vmem_bytes) / double(1 << 20); }

    const BoardConfig& m_cfg;
};

}  // namespace tpu::hw
