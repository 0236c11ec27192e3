// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

/// Output fusions: elementwise work an MXU kernel runs on each fp32 result tile in VMEM before
/// storing it (bias, activation, residual add, batch-norm inference affine, convert to bf16),
/// as XLA fuses a dot's or convolution's consumers into its output fusion
/// (/work/coord/COMPOSE.md, driver/README.md "Epilogues").
namespace tpu::driver {

/// A tensor the epilogue reads beside the result.
struct EpilogueSide {
    enum class Kind : uint8_t {
        Column,  ///< one fp32 value per output column (N), broadcast over rows: a bias
        Full,    ///< fp32, the output's shape and layout: a residual
    };
    Kind kind = Kind::Full;    ///< what it holds
    streaming::Operand place;  ///< where it lives (HBM address or VMEM region)
};

/// What the epilogue sees for one result tile: `rows` x `cols` fp32 values, row-major in VMEM
/// (row stride `cols`), and each side's matching tile.
class EpilogueTile {
public:
    /// Emits one counted VPU instruction (the kernel's VPU flag, waited before the store).
    using VpuFn = std::function<void(isa::Opcode op, std::initializer_list<isa::Arg> args)>;
    /// Made by the kernel for each tile.
    EpilogueTile(isa::Builder& b, isa::Arg out, std::vector<isa::Arg> sides, const isa::Reg& rows,
                 uint32_t cols, VpuFn vpu, uint32_t panel = 0,
                 std::function<void(const isa::Reg&)> row4 = {})
        : m_b(b),
          m_out(out),
          m_sides(std::move(sides)),
          m_rows(rows),
          m_cols(cols),
          m_vpu(std::move(vpu)),
          m_panel(panel),
          m_row4(std::move(row4)) {}

    /// The builder (labels, scalar arithmetic, registers from its pool).
    isa::Builder& builder() const { return m_b; }
    /// VMEM address of the result tile (fp32).
    isa::Arg out() const { return m_out; }
    /// VMEM address of side i's matching tile (fp32; Column sides: `cols` values).
    isa::Arg side(size_t i) const;
    /// Rows in this tile (the last tile of a block may be ragged).
    const isa::Reg& rows() const { return m_rows; }
    /// Columns (a compile-time constant).
    uint32_t cols() const { return m_cols; }
    /// A VPU instruction, counted on the kernel's flag that it waits for before the store.
    void vpu(isa::Opcode op, std::initializer_list<isa::Arg> args) { m_vpu(op, args); }
    /// The tile's column panel in its group (the RHS stationary: columns panel x the MXU's
    /// columns on from the group's first); each group's panels come in this order.
    uint32_t panel() const { return m_panel; }
    /// Emits `dst = 4 x` the tile's first row of C (Epilogue::position only).
    void row4(const isa::Reg& dst) const { m_row4(dst); }

private:
    isa::Builder& m_b;
    isa::Arg m_out;
    std::vector<isa::Arg> m_sides;
    const isa::Reg& m_rows;
    uint32_t m_cols;
    VpuFn m_vpu;
    uint32_t m_panel;
    std::function<void(const isa::Reg&)> m_row4;
};

/// Elementwise work on each result tile before it is stored.
struct Epilogue {
    std::vector<EpilogueSide> sides;          ///< loaded tile by tile with the result
    std::function<void(EpilogueTile&)> body;  ///< empty: no epilogue
    bool store_bf16 = false;                  ///< store the tile as bf16 (v.f2bf)
    /// The body reads which rows of C each tile holds (EpilogueTile::row4): the kernel keeps
    /// the pending group's first row in a word of scalar memory (its registers are all taken).
    bool position = false;
    /// Nothing to do: the kernel emits exactly what it emits without an epilogue.
    bool empty() const { return !body && sides.empty() && !store_bf16 && !position; }
    /// Sides of `kind`.
    uint32_t count(EpilogueSide::Kind kind) const;
};

}  // namespace tpu::driver
