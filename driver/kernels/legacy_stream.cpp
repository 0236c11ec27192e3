// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/legacy_stream.h"

#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "driver/kernels/stream_kernel.h"
#include "isa/assembler.h"

namespace tpu::driver::detail {

struct Layout {
    uint32_t tile_units = 0;         ///< units (elements or rows) per tile
    uint64_t slot_bytes = 0;         ///< one of the two tile slots
    std::vector<uint64_t> area_off;  ///< per slot area, bytes from the slot base
    std::vector<uint64_t> fixed_at;  ///< per fixed area, absolute VMEM address
    uint64_t end = 0;                ///< VMEM bytes used
};

std::string Body::a(int k) const {
    return fmt::format("[s19+{}]", m_l.area_off[k]);
}
std::string Body::at(const std::string& slot, int k) const {
    return fmt::format("[{}+{}]", slot, m_l.area_off[k]);
}
std::string Body::slot(int which, int k) const {
    return fmt::format("[{}]", uint64_t(which) * m_l.slot_bytes + m_l.area_off[k]);
}
std::string Body::f(int k) const {
    return fmt::format("[{}]", m_l.fixed_at[k]);
}
uint64_t Body::off(int k) const {
    return m_l.area_off[k];
}
uint64_t Body::fixed_addr(int k) const {
    return m_l.fixed_at[k];
}
uint32_t Body::tile_units() const {
    return m_l.tile_units;
}
void Body::vpu(const std::string& ins) {
    line(ins + ", f2");
    line("        add s26, s26, 1");
}
std::string Body::label(const std::string& name) const {
    return name + "_" + m_tag;
}
void Body::line(const std::string& text) {
    m_s += text;
    m_s += '\n';
}

namespace {

std::string cores_text(const std::vector<uint32_t>& cores) {
    return fmt::format("[{}]", fmt::join(cores, ", "));
}

uint32_t addr(const Buffer& b) {
    return static_cast<uint32_t>(b.addr);
}

streaming::Footprint footprint(const Spec& sp) {
    return {sp.name, sp.units, sp.areas, sp.fixed, sp.max_tile_units};
}

/// The tiling of streaming::plan, laid out as streaming::emit lays it out.
Layout plan(const Spec& sp, uint64_t vmem_bytes) {
    const streaming::Footprint fp = footprint(sp);
    Layout l;
    l.tile_units = streaming::plan(fp, vmem_bytes);
    uint64_t at = 0;
    for (uint32_t v : sp.areas) {
        l.area_off.push_back(at);
        at += (uint64_t(l.tile_units) * v * 4 + streaming::kVmemAlign - 1) / streaming::kVmemAlign *
              streaming::kVmemAlign;
    }
    l.slot_bytes = at;
    at = 2 * l.slot_bytes;
    for (uint32_t v : sp.fixed) {
        l.fixed_at.push_back(at);
        at += (uint64_t(v) * 4 + streaming::kVmemAlign - 1) / streaming::kVmemAlign *
              streaming::kVmemAlign;
    }
    l.end = at;
    return l;
}

isa::Program build(const Spec& sp, const Layout& l) {
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    Body body(s, l);
    const uint64_t U = sp.units, T = l.tile_units, tiles = (U + T - 1) / T;
    const size_t NI = sp.ins.size(), NO = sp.outs.size();
    // Per-slot flags: a banked HBM can finish a DMA before an earlier one, so a count over
    // both slots would not prove that this slot's transfers are done.
    const char* ld[2] = {"f1", "f8"};
    const char* st[2] = {"f3", "f9"};
    L("# {}: {} units, {} per tile, two slots of {} bytes at 0 and {}", sp.name, U, T, l.slot_bytes,
      l.slot_bytes);
    L("# s16 tile i, s17/s18/s19 its first unit, units and slot; s20/s21/s22 tile i+1;");
    L("# s23/s24/s25 tile i-1; s26 VPU ops issued; s29/s30 stores/loads to wait for.");
    L("# Flags: f1/f8 loads and f3/f9 stores of slot 0/1, f2 VPU, f4 fixed loads, f10 fixed");
    L("# stores. The loop is unrolled twice so that tile i (slot i & 1) uses fixed flags.");
    // One dma per stream: HBM address = base + first unit * per * 4, one row of units * per * 4.
    auto transfer = [&](const std::vector<Stream>& streams, bool in, const char* off,
                        const char* len, const char* slot, const char* flag) {
        for (const Stream& st : streams) {
            if (st.dma) {
                st.dma(body, off, len, slot, flag);
                continue;
            }
            const uint64_t per_bytes = uint64_t(sp.areas[st.area]) * 4;
            L("        mul s13, {}, {}", off, per_bytes);
            L("        add s13, s13, s{}", st.arg);
            L("        mul s14, {}, {}", len, per_bytes);
            if (in)
                L("        dma.hv [{}+{}], [s13], 1, s14, s14, s14, {}", slot, l.area_off[st.area],
                  flag);
            else
                L("        dma.vh [s13], [{}+{}], 1, s14, s14, s14, {}", slot, l.area_off[st.area],
                  flag);
        }
    };
    for (int r : {16, 17, 19, 26}) L("        li s{}, 0", r);
    L("        li s18, {}", std::min(U, T));
    if (sp.prologue) sp.prologue(body);
    for (const FixedIo& io : sp.fixed_ins) {
        const uint64_t b = uint64_t(sp.fixed[io.fixed]) * 4;
        L("        dma.hv [{}], [s{}], 1, {}, {}, {}, f4", l.fixed_at[io.fixed], io.arg, b, b, b);
    }
    transfer(sp.ins, true, "s17", "s18", "s19", ld[0]);
    if (!sp.fixed_ins.empty()) L("        wait f4, {}", sp.fixed_ins.size());
    for (int p = 0; p < 2; ++p) {
        body.set_tag(std::to_string(p));
        // (1) Store tile i-1 once its VPU work is done; that also frees its slot for tile i+1.
        L("loop_{}:", p);
        if (p == 0) L("        beq s16, 0, first_0");
        L("        wait f2, s26");
        transfer(sp.outs, false, "s23", "s24", "s25", st[1 - p]);
        // (2) Prefetch tile i+1 into the other slot while the VPU works on tile i.
        L("first_{}: add s20, s17, s18", p);
        L("        bge s20, {}, compute_{}", U, p);
        L("        sub s21, {}, s20", U);
        L("        bltu s21, {}, ragged_{}", T, p);
        L("        li s21, {}", T);
        L("ragged_{}: xor s22, s19, {}", p, l.slot_bytes);
        transfer(sp.ins, true, "s20", "s21", "s22", ld[1 - p]);
        // (3) Tile i's inputs are in (this slot has had i / 2 + 1 tiles loaded), and the stores
        // of tile i-2 (same slot, i / 2 tiles stored) have read its outputs.
        L("compute_{}: shr s30, s16, 1", p);
        L("        mul s29, s30, {}", NO);
        L("        add s30, s30, 1");
        L("        mul s30, s30, {}", NI);
        L("        wait {}, s30", ld[p]);
        L("        wait {}, s29", st[p]);
        sp.body(body);
        // (4) Rotate: i-1 <- i <- i+1.
        L("        add s23, s17, 0");
        L("        add s24, s18, 0");
        L("        add s25, s19, 0");
        L("        add s17, s20, 0");
        L("        add s18, s21, 0");
        L("        add s19, s22, 0");
        L("        add s16, s16, 1");
        L("        bltu s17, {}, loop_{}", U, 1 - p);
        if (p == 0) L("        jmp done");
    }
    // (5) Store the last tile and the fixed results, then wait for every store.
    L("done:   wait f2, s26");
    transfer(sp.outs, false, "s23", "s24", "s25", st[(tiles - 1) & 1]);
    for (const FixedIo& io : sp.fixed_outs) {
        const uint64_t b = uint64_t(sp.fixed[io.fixed]) * 4;
        L("        dma.vh [s{}], [{}], 1, {}, {}, {}, f10", io.arg, l.fixed_at[io.fixed], b, b, b);
    }
    if (NO) {
        L("        wait f3, {}", NO * ((tiles + 1) / 2));
        if (tiles > 1) L("        wait f9, {}", NO * (tiles / 2));
    }
    if (!sp.fixed_outs.empty()) L("        wait f10, {}", sp.fixed_outs.size());
    if (sp.epilogue) sp.epilogue(body);
    L("        halt");
    return isa::assemble(s, sp.name + ".s");
}

}  // namespace

Event run(Device& dev, ProgramCache& cache, const Spec& sp, const std::vector<uint32_t>& cores,
          const ArgsFn& args) {
    const Layout l = plan(sp, dev.config().core.vmem_bytes);
    std::string key = fmt::format("{} units{} tile{}", sp.name, sp.units, l.tile_units);
    for (uint32_t v : sp.areas) key += fmt::format(" {}", v);
    const isa::Program& prog = cache.get(key, [&] { return build(sp, l); });
    return dev.launch(cores, prog, args);
}

Event run(Device& dev, ProgramCache& cache, const Spec& sp,
          const std::vector<const Tensor*>& tensors, const std::vector<uint32_t>& scalars) {
    const Tensor& first = *tensors.front();
    for (const Tensor* t : tensors)
        if (t->bufs.size() != first.cores.size() || t->cores != first.cores)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("{}: tensors on different core sets ({} and {})", sp.name,
                                          cores_text(first.cores), cores_text(t->cores)));
    std::vector<uint32_t> a(tensors.size() + scalars.size());
    return run(dev, cache, sp, first.cores, [&](size_t i) {
        for (size_t k = 0; k < tensors.size(); ++k) a[k] = addr(tensors[k]->bufs[i]);
        std::copy(scalars.begin(), scalars.end(), a.begin() + tensors.size());
        return a;
    });
}

uint32_t tile_units(const Spec& sp, const hw::BoardConfig& cfg) {
    return plan(sp, cfg.core.vmem_bytes).tile_units;
}

}  // namespace tpu::driver::detail
