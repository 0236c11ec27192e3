// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/stream_kernel.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "driver/device.h"

namespace tpu::driver::streaming {

using isa::imm;
using isa::Opcode;

namespace {

uint64_t round_up(uint64_t x, uint64_t m) {
    return (x + m - 1) / m * m;
}

/// Offsets of the slot areas from a slot base with `units` per tile, and the slot's bytes.
uint64_t slot_layout(const Footprint& fp, uint64_t units, std::vector<uint64_t>* off) {
    uint64_t at = 0;
    for (uint32_t v : fp.areas) {
        if (off) off->push_back(at);
        at += round_up(units * v * 4, kVmemAlign);
    }
    return at;
}

const char* kind_name(Operand::Kind k) {
    switch (k) {
        case Operand::Kind::Hbm:
            return "an HBM tensor";
        case Operand::Kind::Vmem:
            return "a VMEM tensor";
        case Operand::Kind::Scalar:
            return "a scalar";
    }
    return "?";
}

}  // namespace

std::vector<Operand> declare_args(isa::Builder& b, std::span<const Param> params,
                                  std::vector<isa::Reg>& regs) {
    std::vector<Operand> ops;
    for (const Param& p : params) {
        regs.push_back(b.arg(std::string(p.name)));
        ops.push_back(p.scalar ? Operand::scalar(regs.back()) : Operand::hbm(regs.back()));
    }
    return ops;
}

void check_operands(std::string_view kernel, std::span<const Param> params,
                    std::span<const Operand> ops) {
    if (ops.size() != params.size())
        throw isa::BuildError(fmt::format("kernel '{}': {} operands given; it takes {}", kernel,
                                          ops.size(), params.size()));
    for (size_t i = 0; i < ops.size(); ++i)
        if ((ops[i].kind == Operand::Kind::Scalar) != params[i].scalar)
            throw isa::BuildError(fmt::format("kernel '{}': operand {} ('{}') is {}; expected {}",
                                              kernel, i + 1, params[i].name, kind_name(ops[i].kind),
                                              params[i].scalar ? "a scalar" : "a tensor"));
}

std::vector<Operand> placeholders(std::span<const Param> params) {
    std::vector<Operand> ops;
    for (const Param& p : params)
        ops.push_back(p.scalar ? Operand::scalar(imm(0)) : Operand::hbm(imm(0)));
    return ops;
}

uint32_t plan(const Footprint& fp, uint64_t vmem_bytes) {
    uint64_t fixed_bytes = 0;
    for (uint32_t v : fp.fixed) fixed_bytes += round_up(uint64_t(v) * 4, kVmemAlign);
    uint64_t unit_bytes = 0;
    uint32_t widest = 1;
    for (uint32_t v : fp.areas) {
        unit_bytes += uint64_t(v) * 4;
        widest = std::max(widest, v);
    }
    // Two slots of one unit each plus the fixed areas.
    const uint64_t min_need = 2 * slot_layout(fp, 1, nullptr) + fixed_bytes;
    if (min_need > vmem_bytes)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: a row of {} values needs {} bytes of VMEM in two tile "
                                      "slots; the core has {}",
                                      fp.name, widest, min_need, vmem_bytes));
    // Each area rounds up by less than the alignment, so this many units always fit.
    const uint64_t fit =
        ((vmem_bytes - fixed_bytes) / 2 - fp.areas.size() * kVmemAlign) / unit_bytes;
    uint64_t t = std::min<uint64_t>(
        {fp.units, std::max<uint64_t>(1, kMaxTileValues / widest), std::max<uint64_t>(1, fit)});
    if (fp.max_tile_units) t = std::min(t, fp.max_tile_units);
    return static_cast<uint32_t>(t);
}

uint64_t slot_bytes(const Footprint& fp, uint32_t tile) {
    return slot_layout(fp, tile, nullptr);
}

// ---- Body ------------------------------------------------------------------------------------

/// The engine's layout and registers, as a body sees them.
struct Body::State {
    uint32_t tile = 0;
    std::vector<uint64_t> area_off;
    std::array<uint64_t, 2> slot_addr{};
    std::vector<uint64_t> fixed_addr;
    const isa::Reg* units = nullptr;
    const isa::Reg* first = nullptr;
    const isa::Reg* tile_index = nullptr;
    const isa::Reg* slot = nullptr;
    const isa::Reg* scratch = nullptr;
    std::array<const isa::Reg*, 2> tmp{};
    isa::CountedFlag* vpu = nullptr;
};

isa::Arg Body::a(int k) const {
    return *m_s.slot + static_cast<int64_t>(m_s.area_off.at(k));
}
isa::Arg Body::at(const isa::Reg& slot, int k) const {
    return slot + static_cast<int64_t>(m_s.area_off.at(k));
}
isa::Arg Body::slot(int which, int k) const {
    return imm(static_cast<int64_t>(m_s.slot_addr.at(which) + m_s.area_off.at(k)));
}
isa::Arg Body::f(int k) const {
    return imm(static_cast<int64_t>(m_s.fixed_addr.at(k)));
}
uint64_t Body::off(int k) const {
    return m_s.area_off.at(k);
}
uint32_t Body::tile_units() const {
    return m_s.tile;
}
const isa::Reg& Body::units() const {
    return *m_s.units;
}
const isa::Reg& Body::first() const {
    return *m_s.first;
}
isa::CountedFlag& Body::vpu_flag() const {
    return *m_s.vpu;
}
const isa::Reg& Body::tile() const {
    return *m_s.tile_index;
}
const isa::Reg& Body::scratch() const {
    return *m_s.scratch;
}
const isa::Reg& Body::tmp(int i) const {
    return *m_s.tmp.at(i);
}
void Body::vpu(Opcode op, std::initializer_list<isa::Arg> args) {
    m_s.vpu->issue(op, args);
}
void Body::emit(Opcode op, std::initializer_list<isa::Arg> args) {
    m_b.emit(op, args);
}

// ---- the engine ------------------------------------------------------------------------------

void emit(isa::Builder& b, const Spec& sp, uint32_t tile) {
    const Footprint& fp = sp.fp;
    if (tile == 0 || fp.units == 0)
        throw isa::BuildError(
            fmt::format("kernel '{}': {} units in tiles of {}", fp.name, fp.units, tile));
    const auto scope = b.scope(fp.name);
    const uint64_t U = fp.units, T = tile, tiles = (U + T - 1) / T;
    const size_t NI = sp.ins.size(), NO = sp.outs.size();
    Body::State st;
    st.tile = tile;
    const uint64_t slot_size = slot_layout(fp, tile, &st.area_off);

    // Resources, with the numbers of the text kernel this engine replaced as hints: s16 tile i,
    // s17/s18/s19 its first unit, units and slot; s20/s21/s22 tile i+1; s23/s24/s25 tile i-1;
    // s26 VPU ops issued; s29/s30 stores/loads to wait for; s13/s14 transfer arithmetic, s15
    // the body's. Flags: f1/f8 loads and f3/f9 stores of slot 0/1, f2 VPU, f4 fixed loads, f10
    // fixed stores.
    isa::DoubleBuffer db(b, "tiles", slot_size, {1, 8, 3, 9});
    std::vector<isa::Vmem> fixed;
    for (size_t k = 0; k < fp.fixed.size(); ++k) {
        fixed.push_back(b.vmem(fmt::format("fixed{}", k), uint64_t(fp.fixed[k]) * 4, kVmemAlign));
        st.fixed_addr.push_back(fixed.back().addr());
    }
    st.slot_addr = {db.slot(0).addr(), db.slot(1).addr()};
    const isa::Reg t0 = b.reg("tmp0", 13), t1 = b.reg("tmp1", 14), scratch = b.reg("scratch", 15);
    const isa::Reg i = b.reg("tile", 16), first = b.reg("first", 17), units = b.reg("units", 18),
                   slot = b.reg("slot", 19);
    const isa::Reg next_first = b.reg("next.first", 20), next_units = b.reg("next.units", 21),
                   next_slot = b.reg("next.slot", 22);
    const isa::Reg prev_first = b.reg("prev.first", 23), prev_units = b.reg("prev.units", 24),
                   prev_slot = b.reg("prev.slot", 25);
    const isa::Reg stores = b.reg("stores.due", 29), loads = b.reg("loads.due", 30);
    std::optional<isa::CountedFlag> fixed_loads, fixed_stores;
    if (!sp.fixed_ins.empty()) fixed_loads.emplace(b, "fixed.loads", isa::Count::AtBuild, 4);
    if (!sp.fixed_outs.empty()) fixed_stores.emplace(b, "fixed.stores", isa::Count::AtBuild, 10);

    b.emit(Opcode::Li, {i, imm(0)});
    b.emit(Opcode::Li, {first, imm(0)});
    b.emit(Opcode::Li, {slot, db.slot(0)});
    isa::CountedFlag vpu(b, "vpu", isa::Count::InRegister, 2, 26);
    b.emit(Opcode::Li, {units, imm(static_cast<int64_t>(std::min(U, T)))});
    st.units = &units;
    st.first = &first;
    st.tile_index = &i;
    st.slot = &slot;
    st.scratch = &scratch;
    st.tmp = {&t0, &t1};
    st.vpu = &vpu;
    Body body(b, st);

    auto need_tensor = [&](const Operand& o) {
        if (o.kind == Operand::Kind::Scalar)
            throw b.error("a streamed or fixed operand must be a tensor, not a scalar");
    };
    // One DMA per stream: address = base + first unit * per * 4, one row of units * per * 4.
    auto transfer = [&](const std::vector<Stream>& streams, bool in, const isa::Reg& off,
                        const isa::Reg& len, const isa::Reg& base, const isa::Flag& flag) {
        for (const Stream& s : streams) {
            need_tensor(s.place);
            if (s.custom) {
                if (s.place.kind != Operand::Kind::Hbm)
                    throw b.error("a custom transfer needs its tensor in HBM");
                s.custom(body, off, len, base, flag);
                continue;
            }
            const int64_t per_bytes = int64_t(fp.areas.at(s.area)) * 4;
            const isa::Arg area = base + static_cast<int64_t>(st.area_off.at(s.area));
            b.emit(Opcode::Mul, {t0, off, imm(per_bytes)});
            isa::Arg mem = t0;
            if (s.place.kind == Operand::Kind::Hbm)
                b.emit(Opcode::Add, {t0, t0, s.place.value});
            else
                mem = t0 + s.place.value.imm;
            b.emit(Opcode::Mul, {t1, len, imm(per_bytes)});
            const bool hbm = s.place.kind == Operand::Kind::Hbm;
            if (in)
                b.emit(hbm ? Opcode::DmaHv : Opcode::DmaVv, {area, mem, imm(1), t1, t1, t1, flag});
            else
                b.emit(hbm ? Opcode::DmaVh : Opcode::DmaVv, {mem, area, imm(1), t1, t1, t1, flag});
        }
    };
    auto fixed_io = [&](const FixedIo& io, bool in) {
        need_tensor(io.place);
        const int64_t bytes = int64_t(io.values ? io.values : fp.fixed.at(io.fixed)) * 4;
        const isa::Arg area = imm(static_cast<int64_t>(st.fixed_addr.at(io.fixed)));
        const bool hbm = io.place.kind == Operand::Kind::Hbm;
        const isa::Arg n = imm(bytes);
        if (io.rows > 1 && (!io.values || uint64_t(io.rows) * io.area_row > fp.fixed.at(io.fixed) ||
                            io.area_row < io.values))
            throw b.error(fmt::format("{} rows of {} values, {} apart, in a fixed area of {}",
                                      io.rows, io.values, io.area_row, fp.fixed.at(io.fixed)));
        const isa::Arg rows = imm(io.rows), stride = imm(int64_t(io.area_row) * 4);
        if (in)
            fixed_loads->issue(hbm ? Opcode::DmaHv : Opcode::DmaVv,
                               {area, io.place.value, rows, n, io.rows > 1 ? stride : n, n});
        else
            fixed_stores->issue(hbm ? Opcode::DmaVh : Opcode::DmaVv,
                                {io.place.value, area, rows, n, n, io.rows > 1 ? stride : n});
    };

    if (sp.prologue) sp.prologue(body);
    for (const FixedIo& io : sp.fixed_ins) fixed_io(io, true);
    transfer(sp.ins, true, first, units, slot, db.loads(0));
    if (fixed_loads) fixed_loads->wait_all();
    // The loop is unrolled twice so that tile i (slot i & 1) names its slot's flags.
    const std::array<isa::Label, 2> top = {b.label("loop_0"), b.label("loop_1")};
    const isa::Label done = b.label("done");
    const auto uimm = imm(static_cast<int64_t>(U));
    for (int p = 0; p < 2; ++p) {
        // (1) Store tile i-1 once its VPU work is done; that also frees its slot for tile i+1.
        b.bind(top[p]);
        const isa::Label first_tile = b.label(fmt::format("first_{}", p));
        if (p == 0) b.emit(Opcode::Beq, {i, imm(0), first_tile});
        vpu.wait_all();
        transfer(sp.outs, false, prev_first, prev_units, prev_slot, db.stores(1 - p));
        // (2) Prefetch tile i+1 into the other slot while the VPU works on tile i.
        b.bind(first_tile);
        const isa::Label compute = b.label(fmt::format("compute_{}", p));
        const isa::Label ragged = b.label(fmt::format("ragged_{}", p));
        b.emit(Opcode::Add, {next_first, first, units});
        b.emit(Opcode::Bge, {next_first, uimm, compute});
        b.emit(Opcode::Sub, {next_units, uimm, next_first});
        b.emit(Opcode::Bltu, {next_units, imm(static_cast<int64_t>(T)), ragged});
        b.emit(Opcode::Li, {next_units, imm(static_cast<int64_t>(T))});
        b.bind(ragged);
        b.emit(Opcode::Xor, {next_slot, slot, imm(static_cast<int64_t>(db.toggle()))});
        transfer(sp.ins, true, next_first, next_units, next_slot, db.loads(1 - p));
        // (3) Tile i's inputs are in (this slot has had i / 2 + 1 tiles loaded), and the stores
        // of tile i-2 (same slot, i / 2 tiles stored) have read its outputs.
        b.bind(compute);
        b.emit(Opcode::Shr, {loads, i, imm(1)});
        b.emit(Opcode::Mul, {stores, loads, imm(static_cast<int64_t>(NO))});
        b.emit(Opcode::Add, {loads, loads, imm(1)});
        b.emit(Opcode::Mul, {loads, loads, imm(static_cast<int64_t>(NI))});
        b.emit(Opcode::Wait, {db.loads(p), loads});
        b.emit(Opcode::Wait, {db.stores(p), stores});
        sp.body(body);
        // (4) Rotate: i-1 <- i <- i+1.
        b.emit(Opcode::Add, {prev_first, first, imm(0)});
        b.emit(Opcode::Add, {prev_units, units, imm(0)});
        b.emit(Opcode::Add, {prev_slot, slot, imm(0)});
        b.emit(Opcode::Add, {first, next_first, imm(0)});
        b.emit(Opcode::Add, {units, next_units, imm(0)});
        b.emit(Opcode::Add, {slot, next_slot, imm(0)});
        b.emit(Opcode::Add, {i, i, imm(1)});
        b.emit(Opcode::Bltu, {first, uimm, top[1 - p]});
        if (p == 0) b.emit(Opcode::Jmp, {done});
    }
    // (5) Store the last tile and the fixed results, then wait for every store.
    b.bind(done);
    vpu.wait_all();
    transfer(sp.outs, false, prev_first, prev_units, prev_slot, db.stores((tiles - 1) & 1));
    if (sp.finish) {
        sp.finish(body);
        vpu.wait_all();
    }
    for (const FixedIo& io : sp.fixed_outs) fixed_io(io, false);
    if (NO) {
        b.emit(Opcode::Wait, {db.stores(0), imm(static_cast<int64_t>(NO * ((tiles + 1) / 2)))});
        if (tiles > 1)
            b.emit(Opcode::Wait, {db.stores(1), imm(static_cast<int64_t>(NO * (tiles / 2)))});
    }
    if (fixed_stores) fixed_stores->wait_all();
    if (sp.epilogue) sp.epilogue(body);
}

isa::Program standalone(const std::string& name, std::span<const Param> params, uint32_t tile,
                        const std::function<Spec(std::span<const Operand>)>& spec) {
    isa::Builder b(name);
    std::vector<isa::Reg> args;
    const std::vector<Operand> ops = declare_args(b, params, args);
    emit(b, spec(ops), tile);
    b.emit(Opcode::Halt, {});
    return b.finish();
}

}  // namespace tpu::driver::streaming
