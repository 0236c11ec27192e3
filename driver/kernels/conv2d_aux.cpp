// SPDX-License-Identifier: Apache-2.0
// conv2d's streaming helper kernels (Conv2dAuxKey): packing, im2col, col2im, zeroing.
#include <algorithm>
#include <array>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/stream_kernel.h"
#include "isa/builder.h"

namespace tpu::driver {
namespace {

using isa::imm;
using isa::Opcode;

uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

using streaming::Body;
using streaming::Operand;
using streaming::Param;
using streaming::Spec;
using streaming::Stream;

/// How one unit of a gather pack reaches the staging area: a strided fp32 DMA (rows of
/// row_bytes) at `vmem_offset` into it, or (zero) a copy of the zero area.
struct GatherClass {
    bool zero = false;  ///< copy the zero area instead of loading from HBM
    uint64_t hbm_offset = 0, vmem_offset = 0, rows = 0, row_bytes = 0, vstride = 0, hstride = 0;
};

/// Leaves the class index of the unit in `first` in b.tmp(1) and, for loading classes, the HBM
/// source address (before hbm_offset) in b.tmp(0); takes other registers from the builder.
using Decode = std::function<void(Body& b, const isa::Reg& first)>;

/// A gather pack: unit u of `units` is `vals` fp32 values gathered from HBM into the staging
/// area, rounded to bf16 and stored contiguously at dst + u vals 2 bytes. The staging area is
/// zero before every unit (zeroed once, then again after each conversion), so the zeros the
/// kernel layouts need (padding pixels and channels) are whatever a class does not load.
Spec gather_pack_spec(std::string name, uint64_t units, uint32_t vals,
                      std::vector<GatherClass> classes, Decode decode, const Operand& src,
                      const Operand& dst) {
    Spec sp;
    sp.fp.name = std::move(name);
    sp.fp.units = units;
    // A unit's source is not affine in its index across units, so every tile is one unit.
    sp.fp.max_tile_units = 1;
    sp.fp.areas = {vals / 2, vals};
    const bool zeros = std::any_of(classes.begin(), classes.end(), [](auto& g) { return g.zero; });
    if (zeros) sp.fp.fixed = {vals};
    const int64_t bytes = int64_t(vals) * 4;
    sp.ins = {Stream(
        src, 1,
        [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
            const isa::Flag& flag) {
            isa::Builder& bb = b.builder();
            decode(b, first);
            const isa::Label end = bb.label("gather_end");
            for (size_t c = 0; c < classes.size(); ++c) {
                const GatherClass& g = classes[c];
                const isa::Label next = bb.label("gather_next");
                b.emit(Opcode::Bne, {b.tmp(1), imm(int64_t(c)), next});
                if (g.zero) {
                    b.emit(Opcode::DmaVv, {b.at(slot, 1), b.f(0), imm(1), imm(bytes), imm(bytes),
                                           imm(bytes), flag});
                } else {
                    b.emit(Opcode::Add, {b.tmp(0), b.tmp(0), imm(int64_t(g.hbm_offset))});
                    b.emit(Opcode::DmaHv, {b.at(slot, 1) + int64_t(g.vmem_offset), b.tmp(0),
                                           imm(int64_t(g.rows)), imm(int64_t(g.row_bytes)),
                                           imm(int64_t(g.vstride)), imm(int64_t(g.hstride)), flag});
                }
                b.emit(Opcode::Jmp, {end});
                bb.bind(next);
            }
            bb.bind(end);
        })};
    sp.outs = {Stream(dst, 0)};
    sp.body = [=](Body& b) {
        b.vpu(Opcode::VF2Bf, {b.a(0), b.a(1), imm(vals)});
        b.vpu(Opcode::VCmpGt, {b.a(1), b.a(1), b.a(1), imm(vals)});
    };
    // Zeros: x > x is false for every x (NaN too), whatever VMEM held before.
    sp.prologue = [=](Body& b) {
        isa::CountedFlag zero(b.builder(), "zero", isa::Count::AtBuild, 5);
        for (int slot = 0; slot < 2; ++slot) {
            const isa::Arg z = b.slot(slot, 1);
            zero.issue(Opcode::VCmpGt, {z, z, z, imm(vals)});
        }
        if (zeros) zero.issue(Opcode::VCmpGt, {b.f(0), b.f(0), b.f(0), imm(vals)});
        zero.wait_all();
    };
    return sp;
}

/// The packing kernels' view of the implicit GEMM's layout (plan_conv2d's base tiling).
Conv2dTiling layout_of(const Conv2dShape& s, uint32_t R, uint32_t C) {
    Conv2dTiling t;
    t.R = R;
    t.C = C;
    t.CT = ceil_div(s.cin, R);
    if (C) t.NT = ceil_div(s.cout, C);
    t.phases = std::min(s.stride, s.kernel);
    if (s.stride) {
        const uint32_t qmax = (s.kernel - 1) / s.stride;
        t.Hq = s.out_height() + qmax;
        t.Wq = s.out_width() + qmax;
    }
    return t;
}

/// Whether helper `k` is the dense input packing (emit_dense_pack), not a streaming kernel.
bool dense_pack(const Conv2dAuxKey& k) {
    return k.kind == Conv2dAux::PackInput && conv2d_pixel_channels(k.shape, k.R) < k.R;
}

/// Plane rows whose copies one iteration of emit_dense_pack's loop issues.
constexpr uint32_t kUnrollRows = 8;

/// The dense packing of x (Cin < R: conv2d_pixel_channels) in chunks of plane rows. A gather
/// of plane rows from HBM (pack_input_spec) reads a pixel per request (Cin fp32 values at a
/// stride of s pixels: 12 bytes for RGB), so HBM serves Wq requests per plane row; this
/// packing reads whole input rows (one contiguous DMA of 512-byte requests per chunk) and
/// de-interleaves the stride phases in VMEM (dma.vv: a plane row's pixels from every s-th one),
/// then rounds to bf16 and stores each plane's rows with one DMA.
struct DensePack {
    uint32_t P = 0, s = 0, p = 0, H = 0, W = 0, K = 0, Hq = 0, Wq = 0;
    uint64_t pix4 = 0;             ///< bytes of one fp32 input pixel (Cin values)
    std::vector<uint32_t> j0, j1;  ///< per phase column b: plane columns read from the image

    DensePack(const Conv2dShape& sh, const Conv2dTiling& t)
        : P(t.phases),
          s(sh.stride),
          p(sh.pad),
          H(sh.height),
          W(sh.width),
          K(sh.cin),
          Hq(t.Hq),
          Wq(t.Wq),
          pix4(uint64_t(sh.cin) * 4) {
        for (uint32_t b = 0; b < P; ++b) {
            j0.push_back(range_begin(b));
            j1.push_back(range_end(W, Wq, b));
        }
    }
    /// First plane row (column) of phase a whose padded input row (column) i s + a is inside.
    uint32_t range_begin(uint32_t a) const { return p > a ? (p - a + s - 1) / s : 0; }
    /// One past the last such plane row (column) of phase a: the input's `extent` rows
    /// (columns), at most the plane's `planes`.
    uint32_t range_end(uint32_t extent, uint32_t planes, uint32_t a) const {
        const int64_t hi = int64_t(extent) - 1 + p - a;
        return hi < 0 ? 0 : std::min<uint32_t>(planes, uint32_t(hi / s) + 1);
    }
    /// One past the last plane row of phase a (at most Hq).
    uint32_t row_end(uint32_t a) const { return range_end(H, Hq, a); }
    /// Input rows a chunk of plane rows [i0, i0 + n) reads, at most.
    uint64_t input_rows(uint32_t n) const { return uint64_t(n - 1) * s + P; }
    /// VMEM bytes of a chunk of n plane rows: the input rows (fp32), the planes' rows in fp32
    /// and in bf16.
    uint64_t vmem_bytes(uint32_t n) const {
        const uint64_t vals = uint64_t(P) * P * n * Wq * K;
        return input_rows(n) * W * pix4 + vals * 4 + vals * 2 + 3 * streaming::kVmemAlign;
    }
    /// The most plane rows per chunk that fit in `vmem` (0 if not one).
    uint32_t plan(uint64_t vmem) const {
        uint32_t n = 0;
        while (n < Hq && vmem_bytes(n + 1) <= vmem) ++n;
        return n;
    }
};

/// Emits the dense packing of x into `packed` (Conv2dKey's planes), `rows` plane rows per
/// chunk (DensePack::plan): per image, per chunk, (1) zero the fp32 planes' rows (padding pixels
/// are what no copy writes), (2) one DMA of the chunk's input rows, (3) a dma.vv per plane row
/// of each phase (with stride 1, one for the chunk), (4) v.f2bf into the bf16 rows, (5) one
/// DMA of the rows of every plane, waited for before the next chunk's conversion reuses them.
void emit_dense_pack(isa::Builder& bld, const Conv2dShape& sh, const Conv2dTiling& t, uint32_t rows,
                     std::span<const Operand> o) {
    using enum isa::Opcode;
    const auto scope = bld.scope("conv2d_pack_x");
    const DensePack d(sh, t);
    const uint32_t P = d.P, K = d.K, Wq = d.Wq;
    const uint64_t plane_h = uint64_t(t.Hq) * Wq * K * 2, img_h = uint64_t(P) * P * plane_h;
    const uint64_t img_x = uint64_t(d.H) * d.W * d.pix4, row_x = uint64_t(d.W) * d.pix4;
    const uint64_t vals = uint64_t(P) * P * rows * Wq * K;
    const isa::Vmem va = bld.vmem("pack.rows", d.input_rows(rows) * row_x),
                    vf = bld.vmem("pack.f32", vals * 4), vb = bld.vmem("pack.bf16", vals * 2);
    const isa::Reg xi = bld.reg("pack.x"), oi = bld.reg("pack.out"), img = bld.reg("pack.image"),
                   dst = bld.reg("pack.dst"), src = bld.reg("pack.src"), i = bld.reg("pack.row");
    isa::CountedFlag load(bld, "pack.load", isa::Count::InRegister);
    isa::CountedFlag copy(bld, "pack.copy", isa::Count::InRegister);
    isa::CountedFlag vpu(bld, "pack.vpu", isa::Count::InRegister);
    isa::CountedFlag store(bld, "pack.store", isa::Count::InRegister);
    bld.emit(Add, {xi, o[0].value, imm(0)});
    bld.emit(Add, {oi, o[1].value, imm(0)});
    bld.loop(img, imm(0), imm(sh.batch), 1, [&] {
        for (uint32_t i0 = 0; i0 < t.Hq; i0 += rows) {
            const uint32_t n = std::min(rows, t.Hq - i0);
            const uint64_t nv = uint64_t(P) * P * n * Wq * K, plane_v = uint64_t(n) * Wq * K;
            vpu.issue(VCmpGt, {vf.at(0), vf.at(0), vf.at(0), imm(int64_t(nv))});
            // The chunk's input rows [r0, r1), clipped to the image.
            const int64_t r0 = std::max<int64_t>(0, int64_t(i0) * d.s - d.p);
            const int64_t r1 = std::min<int64_t>(d.H, int64_t(i0 + n - 1) * d.s + P - d.p);
            if (r0 < r1)
                load.issue(DmaHv, {va.at(0), xi + int64_t(uint64_t(r0) * row_x), imm(1),
                                   imm(int64_t(uint64_t(r1 - r0) * row_x)), imm(0), imm(0)});
            vpu.wait_all();
            load.wait_all();
            for (uint32_t a = 0; a < P && r0 < r1; ++a) {
                const uint32_t ia0 = std::max(i0, d.range_begin(a)),
                               ia1 = std::min(i0 + n, d.row_end(a));
                if (ia0 >= ia1) continue;
                for (uint32_t b = 0; b < P; ++b) {
                    const uint32_t j0 = d.j0[b], j1 = d.j1[b];
                    if (j0 >= j1) continue;
                    const uint64_t dst0 = vf.addr() +
                                          (uint64_t(a * P + b) * n + (ia0 - i0)) * Wq * K * 4 +
                                          uint64_t(j0) * K * 4;
                    const int64_t in0 = int64_t(ia0) * d.s + a - d.p - r0;  // first input row
                    const uint64_t src0 =
                        va.addr() + uint64_t(in0) * row_x + (uint64_t(j0) * d.s + b - d.p) * d.pix4;
                    const uint64_t pixels = j1 - j0;
                    if (d.s == 1) {  // each plane row is a contiguous run of its input row
                        copy.issue(DmaVv,
                                   {imm(int64_t(dst0)), imm(int64_t(src0)), imm(int64_t(ia1 - ia0)),
                                    imm(int64_t(pixels * d.pix4)),
                                    imm(int64_t(uint64_t(Wq) * K * 4)), imm(int64_t(row_x))});
                        continue;
                    }
                    // kUnrollRows copies a loop iteration: the sequencer then issues them
                    // about as fast as the DMA port moves a plane row (a loop of one copy
                    // takes 6 instructions a copy, twice as long).
                    const int64_t dstep = int64_t(uint64_t(Wq) * K * 4),
                                  sstep = int64_t(d.s * row_x);
                    const auto copies = [&](uint32_t rows_here) {
                        for (uint32_t r = 0; r < rows_here; ++r)
                            copy.issue_deferred(
                                DmaVv, {dst + r * dstep, src + r * sstep, imm(int64_t(pixels)),
                                        imm(int64_t(d.pix4)), imm(int64_t(d.pix4)),
                                        imm(int64_t(d.s * d.pix4))});
                        copy.count_deferred();
                    };
                    bld.emit(Li, {dst, imm(int64_t(dst0))});
                    bld.emit(Li, {src, imm(int64_t(src0))});
                    const uint32_t whole = (ia1 - ia0) / kUnrollRows * kUnrollRows;
                    if (whole)
                        bld.loop(i, imm(0), imm(whole), kUnrollRows, [&] {
                            copies(kUnrollRows);
                            bld.emit(Add, {dst, dst, imm(dstep * kUnrollRows)});
                            bld.emit(Add, {src, src, imm(sstep * kUnrollRows)});
                        });
                    if (ia1 - ia0 > whole) copies(ia1 - ia0 - whole);
                }
            }
            copy.wait_all();
            store.wait_all();  // the previous chunk's rows have left pack.bf16
            vpu.issue(VF2Bf, {vb.at(0), vf.at(0), imm(int64_t(nv))});
            vpu.wait_all();
            store.issue(DmaVh, {oi + int64_t(uint64_t(i0) * Wq * K * 2), vb.at(0),
                                imm(int64_t(P) * P), imm(int64_t(plane_v * 2)),
                                imm(int64_t(plane_h)), imm(int64_t(plane_v * 2))});
        }
        bld.emit(Add, {xi, xi, imm(int64_t(img_x))});
        bld.emit(Add, {oi, oi, imm(int64_t(img_h))});
    });
    store.wait_all();
}

/// Packs x (N H W x Cin fp32, NHWC) into the kernel's bf16 stride-phase planes (Conv2dKey).
/// One unit is one plane row (image, phase row a, phase column b, Cin tile, row i): Wq pixels
/// read from input row i s + a - pad at a stride of s pixels; rows in the padding are zeros.
Spec pack_input_spec(const Conv2dShape& sh, uint32_t R, std::span<const Operand> o) {
    const Conv2dTiling t = layout_of(sh, R, 0);
    const uint32_t P = t.phases, CT = t.CT, s = sh.stride, p = sh.pad;
    const uint32_t last = sh.cin - (CT - 1) * R;  // channels of the last Cin tile
    const uint64_t units = uint64_t(sh.batch) * P * P * CT * t.Hq;
    // Classes 2 b + (last Cin tile): columns j of phase b hold input column j s + b - pad.
    std::vector<GatherClass> cls;
    std::vector<bool> empty(P);
    for (uint32_t b = 0; b < P; ++b) {
        const uint32_t j0 = p > b ? (p - b + s - 1) / s : 0;
        const int64_t hi = (int64_t(sh.width) - 1 + p - b);
        const uint32_t j1 = hi < 0 ? 0 : std::min<uint32_t>(t.Wq, uint32_t(hi / s) + 1);
        empty[b] = j1 <= j0;
        for (uint32_t part = 0; part < 2; ++part) {
            GatherClass g;
            g.hbm_offset = (uint64_t(j0) * s + b - p) * sh.cin * 4;
            g.vmem_offset = uint64_t(j0) * R * 4;
            g.rows = empty[b] ? 1 : j1 - j0;
            g.row_bytes = uint64_t(part ? last : R) * 4;
            g.vstride = uint64_t(R) * 4;
            g.hstride = uint64_t(s) * sh.cin * 4;
            cls.push_back(g);
        }
    }
    GatherClass zero;
    zero.zero = true;
    const uint32_t kZero = static_cast<uint32_t>(cls.size());
    cls.push_back(zero);
    const Operand x = o[0];
    auto decode = [=](Body& b, const isa::Reg& u) {
        using enum isa::Opcode;
        isa::Builder& bb = b.builder();
        const isa::Reg i = bb.reg("row", 3), img = bb.reg("image", 4), ct = bb.reg("ct", 5),
                       pb = bb.reg("phase_col", 6), pa = bb.reg("phase_row", 7),
                       in = bb.reg("input_row", 8), tmp = bb.reg("tmp", 9);
        const isa::Reg &cls_reg = b.tmp(1), &addr = b.tmp(0);
        const isa::Label pz = bb.label("pack_zero"), pv = bb.label("pack_valid");
        b.emit(Remu, {i, u, imm(t.Hq)});
        b.emit(Divu, {img, u, imm(t.Hq)});
        b.emit(Remu, {ct, img, imm(CT)});
        b.emit(Divu, {img, img, imm(CT)});
        b.emit(Remu, {pb, img, imm(P)});
        b.emit(Divu, {img, img, imm(P)});
        b.emit(Remu, {pa, img, imm(P)});
        b.emit(Divu, {img, img, imm(P)});
        b.emit(Mul, {in, i, imm(s)});
        b.emit(Add, {in, in, pa});  // padded input row
        b.emit(Li, {cls_reg, imm(kZero)});
        b.emit(Bltu, {in, imm(p), pz});
        b.emit(Bltu, {in, imm(int64_t(sh.height) + p), pv});
        b.emit(Jmp, {pz});
        bb.bind(pv);
        for (uint32_t c = 0; c < P; ++c)
            if (empty[c]) b.emit(Beq, {pb, imm(c), pz});
        b.emit(Mul, {cls_reg, pb, imm(2)});
        b.emit(Sltu, {tmp, ct, imm(int64_t(CT) - 1)});
        b.emit(Add, {cls_reg, cls_reg, imm(1)});
        b.emit(Sub, {cls_reg, cls_reg, tmp});
        b.emit(Mul, {tmp, img, imm(sh.height)});
        b.emit(Add, {tmp, tmp, in});
        b.emit(Sub, {tmp, tmp, imm(p)});
        b.emit(Mul, {tmp, tmp, imm(int64_t(uint64_t(sh.width) * sh.cin * 4))});
        b.emit(Add, {addr, tmp, x.value});
        b.emit(Mul, {tmp, ct, imm(int64_t(R) * 4)});
        b.emit(Add, {addr, addr, tmp});
        bb.bind(pz);
    };
    return gather_pack_spec("conv2d_pack_x", units, t.Wq * R, cls, decode, o[0], o[1]);
}

/// Packs w (k k Cin x Cout fp32, HWIO) into the kernel's R x C bf16 tiles (Conv2dKey). One unit
/// is one tile (Cout tile, tap, Cin tile): its Cin rows x Cout columns at the row stride Cout.
Spec pack_weight_spec(const Conv2dShape& sh, uint32_t R, uint32_t C, std::span<const Operand> o) {
    const Conv2dTiling t = layout_of(sh, R, C);
    const uint32_t CT = t.CT, NT = t.NT, kk = sh.kernel * sh.kernel;
    const uint32_t last_r = sh.cin - (CT - 1) * R, last_c = sh.cout - (NT - 1) * C;
    std::vector<GatherClass> cls;
    for (uint32_t pr = 0; pr < 2; ++pr)
        for (uint32_t pc = 0; pc < 2; ++pc) {
            GatherClass g;
            g.rows = pr ? last_r : R;
            g.row_bytes = uint64_t(pc ? last_c : C) * 4;
            g.vstride = uint64_t(C) * 4;
            g.hstride = uint64_t(sh.cout) * 4;
            cls.push_back(g);
        }
    const Operand w = o[0];
    auto decode = [=](Body& b, const isa::Reg& u) {
        using enum isa::Opcode;
        isa::Builder& bb = b.builder();
        const isa::Reg ct = bb.reg("ct", 3), q = bb.reg("tile", 4), tap = bb.reg("tap", 5),
                       nt = bb.reg("nt", 6), lt = bb.reg("inner", 7), off = bb.reg("offset", 8),
                       tmp = bb.reg("tmp", 9);
        const isa::Reg &cls_reg = b.tmp(1), &addr = b.tmp(0);
        b.emit(Remu, {ct, u, imm(CT)});
        b.emit(Divu, {q, u, imm(CT)});
        b.emit(Remu, {tap, q, imm(kk)});
        b.emit(Divu, {nt, q, imm(kk)});
        b.emit(Sltu, {lt, ct, imm(int64_t(CT) - 1)});
        b.emit(Li, {cls_reg, imm(3)});
        b.emit(Sub, {cls_reg, cls_reg, lt});
        b.emit(Sub, {cls_reg, cls_reg, lt});
        b.emit(Sltu, {lt, nt, imm(int64_t(NT) - 1)});
        b.emit(Sub, {cls_reg, cls_reg, lt});
        b.emit(Mul, {off, tap, imm(sh.cin)});
        b.emit(Mul, {tmp, ct, imm(R)});
        b.emit(Add, {off, off, tmp});
        b.emit(Mul, {off, off, imm(int64_t(sh.cout) * 4)});
        b.emit(Mul, {tmp, nt, imm(int64_t(C) * 4)});
        b.emit(Add, {off, off, tmp});
        b.emit(Add, {addr, off, w.value});
    };
    return gather_pack_spec("conv2d_pack_w", uint64_t(NT) * kk * CT, R * C, cls, decode, o[0],
                            o[1]);
}

/// Leaves in b.tmp(0) the x address (base `x`) of the first pixel unit `u` moves under tap
/// (kh, kw) and in b.tmp(1) the column-buffer address (base `col`). Units are (image, output
/// row) over the tap's valid rows.
void emit_tap_addresses(Body& b, const isa::Reg& u, const Conv2dShape& s, const Conv2dTapRange& r,
                        uint32_t kh, uint32_t kw, isa::Arg x, isa::Arg col) {
    using enum isa::Opcode;
    isa::Builder& bb = b.builder();
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), kk = s.kernel * s.kernel;
    const uint64_t pix = uint64_t(s.cin) * 4;
    const isa::Reg y = bb.reg("out_row", 3), img = bb.reg("image", 4), in = bb.reg("input", 5),
                   at = bb.reg("col_row", 6);
    b.emit(Remu, {y, u, imm(r.ny)});
    b.emit(Add, {y, y, imm(r.y0)});  // output row
    b.emit(Divu, {img, u, imm(r.ny)});
    // Input pixel (image, y s + kh - pad, x0 s + kw - pad), both coordinates >= 0.
    b.emit(Mul, {in, y, imm(s.stride)});
    b.emit(Add, {in, in, imm(kh)});
    b.emit(Sub, {in, in, imm(s.pad)});
    b.emit(Mul, {at, img, imm(s.height)});
    b.emit(Add, {in, in, at});
    b.emit(Mul, {in, in, imm(s.width)});
    b.emit(Add, {in, in, imm(r.x0 * s.stride + kw - s.pad)});
    b.emit(Mul, {in, in, imm(int64_t(pix))});
    b.emit(Add, {b.tmp(0), in, x});
    // Column-buffer row (image, y, x0), columns from tap (kh k + kw) Cin.
    b.emit(Mul, {at, img, imm(Ho)});
    b.emit(Add, {at, at, y});
    b.emit(Mul, {at, at, imm(Wo)});
    b.emit(Add, {at, at, imm(r.x0)});
    b.emit(Mul, {at, at, imm(int64_t(kk * pix))});
    b.emit(Add, {at, at, imm(int64_t((kh * s.kernel + kw) * pix))});
    b.emit(Add, {b.tmp(1), at, col});
}

/// im2col of one tap: x -> the column buffer (N Ho Wo x k k Cin fp32). One unit per valid
/// (image, output row): nx pixels of Cin values at the input pixel stride s, stored at the
/// column buffer's row stride.
Spec im2col_tap_spec(const Conv2dShape& s, uint32_t kh, uint32_t kw, std::span<const Operand> o) {
    const Conv2dTapRange r = conv2d_tap_range(s, kh, kw);
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * s.kernel * s.kernel;
    const Operand x = o[0], col = o[1];
    Spec sp;
    sp.fp.name = "conv2d_im2col";
    sp.fp.units = uint64_t(s.batch) * r.ny;
    // Consecutive units are not one affine 2-D transfer, so every tile is one unit.
    sp.fp.max_tile_units = 1;
    sp.fp.areas = {r.nx * s.cin};
    sp.ins = {Stream(x, 0,
                     [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
                         const isa::Flag& flag) {
                         emit_tap_addresses(b, first, s, r, kh, kw, x.value, col.value);
                         b.emit(Opcode::DmaHv,
                                {b.at(slot, 0), b.tmp(0), imm(r.nx), imm(int64_t(pix)),
                                 imm(int64_t(pix)), imm(int64_t(pix * s.stride)), flag});
                     })};
    sp.outs = {Stream(col, 0,
                      [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
                          const isa::Flag& flag) {
                          emit_tap_addresses(b, first, s, r, kh, kw, x.value, col.value);
                          b.emit(Opcode::DmaVh,
                                 {b.tmp(1), b.at(slot, 0), imm(r.nx), imm(int64_t(pix)),
                                  imm(int64_t(row)), imm(int64_t(pix)), flag});
                      })};
    sp.body = [](Body&) {};
    return sp;
}

/// col2im of one tap: dx += the tap's columns of dcol, per valid (image, output row). A tap
/// maps distinct outputs to distinct input pixels, so its units never overlap.
Spec col2im_tap_spec(const Conv2dShape& s, uint32_t kh, uint32_t kw, std::span<const Operand> o) {
    const Conv2dTapRange r = conv2d_tap_range(s, kh, kw);
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * s.kernel * s.kernel;
    const uint32_t vals = r.nx * s.cin;
    const Operand dcol = o[0], dx = o[1];
    Spec sp;
    sp.fp.name = "conv2d_col2im";
    sp.fp.units = uint64_t(s.batch) * r.ny;
    sp.fp.max_tile_units = 1;
    sp.fp.areas = {vals, vals};
    auto load_dx = [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
                       const isa::Flag& flag) {
        emit_tap_addresses(b, first, s, r, kh, kw, dx.value, dcol.value);
        b.emit(Opcode::DmaHv, {b.at(slot, 0), b.tmp(0), imm(r.nx), imm(int64_t(pix)),
                               imm(int64_t(pix)), imm(int64_t(pix * s.stride)), flag});
    };
    auto load_dcol = [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
                         const isa::Flag& flag) {
        emit_tap_addresses(b, first, s, r, kh, kw, dx.value, dcol.value);
        b.emit(Opcode::DmaHv, {b.at(slot, 1), b.tmp(1), imm(r.nx), imm(int64_t(pix)),
                               imm(int64_t(pix)), imm(int64_t(row)), flag});
    };
    sp.ins = {Stream(dx, 0, load_dx), Stream(dcol, 1, load_dcol)};
    sp.outs = {Stream(dx, 0,
                      [=](Body& b, const isa::Reg& first, const isa::Reg&, const isa::Reg& slot,
                          const isa::Flag& flag) {
                          emit_tap_addresses(b, first, s, r, kh, kw, dx.value, dcol.value);
                          b.emit(Opcode::DmaVh,
                                 {b.tmp(0), b.at(slot, 0), imm(r.nx), imm(int64_t(pix)),
                                  imm(int64_t(pix * s.stride)), imm(int64_t(pix)), flag});
                      })};
    sp.body = [=](Body& b) { b.vpu(Opcode::VAdd, {b.a(0), b.a(0), b.a(1), imm(vals)}); };
    return sp;
}

/// Zeroes slot areas `areas` of both slots and every fixed area in the prologue (x > x is
/// false for every x, NaN too): the row kernels below leave whatever a unit does not load zero.
void zero_staging(Body& b, const std::vector<int>& areas, const std::vector<uint32_t>& area_vals,
                  const std::vector<uint32_t>& fixed_vals) {
    isa::CountedFlag zero(b.builder(), "zero", isa::Count::AtBuild, 5);
    for (int slot = 0; slot < 2; ++slot)
        for (int a : areas) {
            const isa::Arg z = b.slot(slot, a);
            zero.issue(Opcode::VCmpGt, {z, z, z, imm(area_vals[a])});
        }
    for (size_t f = 0; f < fixed_vals.size(); ++f) {
        const isa::Arg z = b.f(int(f));
        zero.issue(Opcode::VCmpGt, {z, z, z, imm(fixed_vals[f])});
    }
    zero.wait_all();
}

/// im2col with one unit per output row (image, y): the k input rows it reads come in as k
/// contiguous row DMAs (a zero copy for a padding row), each tap's pixels are gathered from
/// them into the tap's columns of a Wo x k k Cin staging row by a VMEM copy, and the row goes
/// out in one contiguous store. Gathering in VMEM keeps every HBM transfer a whole image row:
/// a per-tap DMA straight from HBM moves Cin values per request, which for a small Cin (an RGB
/// stem: 12 bytes) wastes most of each burst. Columns no tap reaches (horizontal padding) keep
/// the prologue's zeros.
Spec im2col_rows_spec(const Conv2dShape& s, std::span<const Operand> o) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel, kk = k * k;
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * kk, in_row = pix * s.width;
    const Operand x = o[0], col = o[1];
    Spec sp;
    sp.fp.name = "conv2d_im2col_rows";
    sp.fp.units = uint64_t(s.batch) * Ho;
    sp.fp.max_tile_units = 1;
    sp.fp.areas = {Wo * kk * s.cin};
    sp.fp.fixed = {s.width * s.cin};
    for (uint32_t kh = 0; kh < k; ++kh) {
        const Conv2dTapRange r =
            conv2d_tap_range(s, kh, 0);  // rows y0 .. y0 + ny read a real input row
        const int area = int(sp.fp.areas.size());
        sp.fp.areas.push_back(s.width * s.cin);
        sp.ins.push_back(
            Stream(x, area,
                   [=](Body& b, const isa::Reg& u, const isa::Reg&, const isa::Reg& slot,
                       const isa::Flag& flag) {
                       using enum isa::Opcode;
                       isa::Builder& bb = b.builder();
                       const isa::Reg y = bb.reg("out_row", 3), img = bb.reg("image", 4),
                                      in = bb.reg("input_row", 5), tmp = bb.reg("tmp", 6);
                       const isa::Label pad = bb.label("pad_row"), done = bb.label("row_done");
                       b.emit(Remu, {y, u, imm(Ho)});
                       b.emit(Divu, {img, u, imm(Ho)});
                       b.emit(Bltu, {y, imm(r.y0), pad});
                       b.emit(Bge, {y, imm(r.y0 + r.ny), pad});
                       b.emit(Mul, {in, y, imm(s.stride)});
                       b.emit(Add, {in, in, imm(kh)});
                       b.emit(Sub, {in, in, imm(s.pad)});
                       b.emit(Mul, {tmp, img, imm(s.height)});
                       b.emit(Add, {in, in, tmp});
                       b.emit(Mul, {in, in, imm(int64_t(in_row))});
                       b.emit(Add, {b.tmp(0), in, x.value});
                       const isa::Arg n = imm(int64_t(in_row));
                       b.emit(DmaHv, {b.at(slot, area), b.tmp(0), imm(1), n, n, n, flag});
                       b.emit(Jmp, {done});
                       bb.bind(pad);
                       b.emit(DmaVv, {b.at(slot, area), b.f(0), imm(1), n, n, n, flag});
                       bb.bind(done);
                   }));
    }
    sp.outs = {Stream(col, 0)};
    sp.body = [=](Body& b) {
        for (uint32_t t = 0; t < kk; ++t) {
            const uint32_t kh = t / k, kw = t % k;
            const Conv2dTapRange r = conv2d_tap_range(s, kh, kw);
            if (!r.ny || !r.nx) continue;  // never reads the image: stays zero
            const int64_t to = int64_t(r.x0 * row + t * pix);
            const int64_t from = int64_t((uint64_t(r.x0) * s.stride + kw - s.pad) * pix);
            b.vpu(Opcode::DmaVv,
                  {b.a(0) + to, b.a(1 + int(kh)) + from, imm(r.nx), imm(int64_t(pix)),
                   imm(int64_t(row)), imm(int64_t(pix * s.stride))});
        }
    };
    sp.prologue = [=](Body& b) { zero_staging(b, {0}, {Wo * kk * s.cin}, {s.width * s.cin}); };
    return sp;
}

/// col2im with one unit per input row (image, iy): per tap, the dcol values that reach the
/// row are loaded at their pixels into the tap's W x Cin area (a zero copy when the tap does
/// not reach it; the pixels it never reaches stay zero), then dx = +0.0 + area_0, dx += area_t
/// in tap order, one contiguous store. Adding a +0.0 where the reference skips a tap is exact:
/// the sum starts at +0.0, so it is never -0.0.
Spec col2im_rows_spec(const Conv2dShape& s, std::span<const Operand> o) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel, kk = k * k;
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * kk;
    const uint32_t vals = s.width * s.cin;
    const Operand dcol = o[0], dx = o[1];
    Spec sp;
    sp.fp.name = "conv2d_col2im_rows";
    sp.fp.units = uint64_t(s.batch) * s.height;
    sp.fp.max_tile_units = 1;
    sp.fp.areas = {vals};
    sp.fp.fixed = {std::max(s.width, Wo) * s.cin};
    std::vector<int> tap_areas;
    for (uint32_t t = 0; t < kk; ++t) {
        const uint32_t kh = t / k, kw = t % k;
        const Conv2dTapRange r = conv2d_tap_range(s, kh, kw);
        if (!r.ny || !r.nx) continue;
        const int area = int(sp.fp.areas.size());
        sp.fp.areas.push_back(vals);
        tap_areas.push_back(area);
        sp.ins.push_back(
            Stream(dcol, area,
                   [=](Body& b, const isa::Reg& u, const isa::Reg&, const isa::Reg& slot,
                       const isa::Flag& flag) {
                       using enum isa::Opcode;
                       isa::Builder& bb = b.builder();
                       const isa::Reg iy = bb.reg("input_row", 3), img = bb.reg("image", 4),
                                      y = bb.reg("out_row", 5), tmp = bb.reg("tmp", 6);
                       const isa::Label miss = bb.label("tap_misses"), done = bb.label("tap_done");
                       const isa::Arg at =
                           b.at(slot, area) + int64_t((r.x0 * s.stride + kw - s.pad) * pix);
                       b.emit(Remu, {iy, u, imm(s.height)});
                       b.emit(Divu, {img, u, imm(s.height)});
                       // Output row y = (iy + pad - kh) / stride when exact and inside 0 .. Ho.
                       b.emit(Add, {y, iy, imm(s.pad)});
                       b.emit(Bltu, {y, imm(kh), miss});
                       b.emit(Sub, {y, y, imm(kh)});
                       b.emit(Remu, {tmp, y, imm(s.stride)});
                       b.emit(Bne, {tmp, imm(0), miss});
                       b.emit(Divu, {y, y, imm(s.stride)});
                       b.emit(Bge, {y, imm(Ho), miss});
                       b.emit(Mul, {tmp, img, imm(Ho)});
                       b.emit(Add, {y, y, tmp});
                       b.emit(Mul, {y, y, imm(Wo)});
                       b.emit(Add, {y, y, imm(r.x0)});
                       b.emit(Mul, {y, y, imm(int64_t(row))});
                       b.emit(Add, {y, y, imm(int64_t(t * pix))});
                       b.emit(Add, {b.tmp(0), y, dcol.value});
                       b.emit(DmaHv, {at, b.tmp(0), imm(r.nx), imm(int64_t(pix)),
                                      imm(int64_t(pix * s.stride)), imm(int64_t(row)), flag});
                       b.emit(Jmp, {done});
                       bb.bind(miss);
                       b.emit(DmaVv, {at, b.f(0), imm(r.nx), imm(int64_t(pix)),
                                      imm(int64_t(pix * s.stride)), imm(int64_t(pix)), flag});
                       bb.bind(done);
                   }));
    }
    sp.outs = {Stream(dx, 0)};
    sp.body = [=](Body& b) {
        for (size_t i = 0; i < tap_areas.size(); ++i)
            b.vpu(Opcode::VAdd, {b.a(0), i ? b.a(0) : b.f(0), b.a(tap_areas[i]), imm(vals)});
    };
    const std::vector<uint32_t> area_vals = sp.fp.areas;
    sp.prologue = [=](Body& b) {
        zero_staging(b, tap_areas, area_vals, {std::max(s.width, Wo) * s.cin});
    };
    return sp;
}

/// t = +0.0 in place: x > x is false for every x (NaN too), whatever the memory held.
Spec zero_spec(uint64_t units, std::span<const Operand> o) {
    Spec sp;
    sp.fp.name = "conv2d_grad_zero";
    sp.fp.units = units;
    sp.fp.areas = {1};
    sp.ins = {Stream(o[0], 0)};
    sp.outs = {Stream(o[0], 0)};
    sp.body = [](Body& b) { b.vpu(Opcode::VCmpGt, {b.a(0), b.a(0), b.a(0), b.units()}); };
    return sp;
}

Spec aux_spec(const Conv2dAuxKey& k, std::span<const Operand> o) {
    switch (k.kind) {
        case Conv2dAux::PackInput:
            return pack_input_spec(k.shape, k.R, o);
        case Conv2dAux::PackWeight:
            return pack_weight_spec(k.shape, k.R, k.C, o);
        case Conv2dAux::Im2colTap:
            return im2col_tap_spec(k.shape, k.kh, k.kw, o);
        case Conv2dAux::Col2imTap:
            return col2im_tap_spec(k.shape, k.kh, k.kw, o);
        case Conv2dAux::Im2colRows:
            return im2col_rows_spec(k.shape, o);
        case Conv2dAux::Col2imRows:
            return col2im_rows_spec(k.shape, o);
        case Conv2dAux::Zero:
            return zero_spec(k.units, o);
    }
    throw std::logic_error("conv2d: unknown helper kernel");
}

}  // namespace

std::string Conv2dAuxKey::name() const {
    switch (kind) {
        case Conv2dAux::PackInput:
            return "conv2d_pack_x";
        case Conv2dAux::PackWeight:
            return "conv2d_pack_w";
        case Conv2dAux::Im2colTap:
            return "conv2d_im2col";
        case Conv2dAux::Col2imTap:
            return "conv2d_col2im";
        case Conv2dAux::Im2colRows:
            return "conv2d_im2col_rows";
        case Conv2dAux::Col2imRows:
            return "conv2d_col2im_rows";
        case Conv2dAux::Zero:
            return "conv2d_grad_zero";
    }
    return "conv2d_aux";
}

size_t hash_value(const Conv2dAuxKey& k) {
    const Conv2dShape& s = k.shape;
    return hash_fields(k.kind, s.batch, s.height, s.width, s.cin, s.cout, s.kernel, s.stride, s.pad,
                       k.R, k.C, k.kh, k.kw, k.units, k.tile);
}

std::span<const Param> conv2d_aux_params(Conv2dAux kind) {
    static const std::array<Param, 2> kPackX = {{{"x"}, {"packed"}}},
                                      kPackW = {{{"w"}, {"packed"}}}, kIm2col = {{{"x"}, {"col"}}},
                                      kCol2im = {{{"dcol"}, {"dx"}}};
    static const std::array<Param, 1> kZero = {{{"t"}}};
    switch (kind) {
        case Conv2dAux::PackInput:
            return kPackX;
        case Conv2dAux::PackWeight:
            return kPackW;
        case Conv2dAux::Im2colTap:
        case Conv2dAux::Im2colRows:
            return kIm2col;
        case Conv2dAux::Col2imTap:
        case Conv2dAux::Col2imRows:
            return kCol2im;
        case Conv2dAux::Zero:
            return kZero;
    }
    return {};
}

Conv2dAuxKey plan_conv2d_aux(Conv2dAux kind, const Conv2dShape& s, uint32_t R, uint32_t C,
                             uint32_t kh, uint32_t kw, uint64_t units, uint64_t vmem_bytes) {
    Conv2dAuxKey k;
    k.kind = kind;
    // Only the fields the kernel reads, so that shapes differing elsewhere share its program.
    switch (kind) {
        case Conv2dAux::PackWeight:
            k.shape.kernel = s.kernel;
            k.shape.cin = s.cin;
            k.shape.cout = s.cout;
            k.R = R;
            k.C = C;
            break;
        case Conv2dAux::Zero:
            k.units = units;
            break;
        default:
            k.shape = s;
            k.shape.cout = 0;
            if (kind == Conv2dAux::PackInput) k.R = R;
            if (kind == Conv2dAux::Im2colTap || kind == Conv2dAux::Col2imTap) {
                k.kh = kh;
                k.kw = kw;
            }
            break;
    }
    if (dense_pack(k)) {
        const DensePack d(k.shape, layout_of(k.shape, R, 0));
        k.tile = d.plan(vmem_bytes);
        if (k.tile == 0)
            throw DeviceError(ErrorKind::Usage,
                              fmt::format("conv2d_pack_x: one plane row of {} pixels ({} bytes "
                                          "with its input rows) does not fit in {} bytes of VMEM",
                                          d.Wq, d.vmem_bytes(1), vmem_bytes));
        return k;
    }
    k.tile = streaming::plan(aux_spec(k, streaming::placeholders(conv2d_aux_params(kind))).fp,
                             vmem_bytes);
    return k;
}

void emit(isa::Builder& b, const Conv2dAuxKey& k, std::span<const Operand> ops) {
    streaming::check_operands(k.name(), conv2d_aux_params(k.kind), ops);
    if (dense_pack(k)) return emit_dense_pack(b, k.shape, layout_of(k.shape, k.R, 0), k.tile, ops);
    streaming::emit(b, aux_spec(k, ops), k.tile);
}

isa::Program generate(const Conv2dAuxKey& k) {
    if (dense_pack(k)) {
        isa::Builder b(k.name());
        std::vector<isa::Reg> args;
        const std::vector<Operand> ops =
            streaming::declare_args(b, conv2d_aux_params(k.kind), args);
        emit(b, k, ops);
        b.emit(Opcode::Halt, {});
        return b.finish();
    }
    return streaming::standalone(k.name(), conv2d_aux_params(k.kind), k.tile,
                                 [&](std::span<const Operand> o) { return aux_spec(k, o); });
}

}  // namespace tpu::driver
