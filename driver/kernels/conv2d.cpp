// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/conv2d.h"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "driver/kernels/launch_group.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/legacy_stream.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"
#include "isa/assembler.h"
#include "sim/metrics.h"

namespace tpu::driver {
namespace {

uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

/// Most matmuls one step's body may hold: the body is unrolled (its addresses are immediates),
/// and two bodies plus the per-image epilogues must fit in instruction memory (8192 words).
constexpr uint32_t kMaxRunsPerStep = 1024;
/// Most images per block: each adds an unrolled epilogue to the last step's body.
constexpr uint32_t kMaxBlockImages = 64;

/// Derived sizes of one core's kernel.
struct Geometry {
    uint32_t k, s, Ho, Wo, qmax, hb, hin, G, runs, run_rows, S, nbands, nm;
    uint64_t pix;      // bytes of one input pixel of one Cin tile (R bf16)
    uint64_t plane_h;  // HBM bytes of one (phase, Cin tile) plane
    uint64_t plane_v;  // VMEM bytes of a block's part of one plane (hin rows)
    uint64_t xv_img, yv_img, x_img_h;
    // VMEM map: two X slots, two Y slots, two W slots, the bias.
    uint64_t vx, vy, vw, vb, vend;
};

Geometry geometry(const Conv2dShape& s, const Conv2dTiling& t) {
    Geometry g{};
    g.k = s.kernel;
    g.s = s.stride;
    g.Ho = s.out_height();
    g.Wo = s.out_width();
    g.qmax = (g.k - 1) / g.s;
    g.hb = t.band_rows;
    g.hin = g.hb + g.qmax;
    g.G = t.block_images;
    // Without halo columns (Wq == Wo) a band's rows are contiguous in every plane, so one
    // matmul streams the whole band; otherwise each output row is its own run of Wo rows.
    g.runs = t.Wq == g.Wo ? 1 : g.hb;
    g.run_rows = t.Wq == g.Wo ? g.hb * g.Wo : g.Wo;
    g.S = g.k * g.k * t.CT;
    g.nbands = g.Ho / g.hb;
    g.nm = std::min(t.mxus, g.G * g.runs);
    g.pix = uint64_t(t.R) * 2;
    g.plane_h = uint64_t(t.Hq) * t.Wq * g.pix;
    g.plane_v = uint64_t(g.hin) * t.Wq * g.pix;
    g.xv_img = uint64_t(t.phases) * t.phases * t.CT * g.plane_v;
    g.x_img_h = uint64_t(t.phases) * t.phases * t.CT * g.plane_h;
    g.yv_img = uint64_t(g.hb) * g.Wo * t.C * 4;
    g.vx = 0;
    g.vy = g.vx + 2 * g.G * g.xv_img;
    g.vw = g.vy + 2 * g.G * g.yv_img;
    g.vb = g.vw + 2 * uint64_t(t.R) * t.C * 2;
    g.vend = g.vb + uint64_t(t.NT) * t.C * 4;
    return g;
}

}  // namespace

bool conv2d_folds_taps(const Conv2dShape& s, uint32_t R) {
    const uint64_t taps = uint64_t(s.kernel) * s.kernel;
    return 4 * ceil_div(uint32_t(taps * s.cin), R) <= taps * ceil_div(s.cin, R);
}

uint64_t Conv2dShape::macs() const {
    return uint64_t(batch) * out_height() * out_width() * kernel * kernel * cin * cout;
}

void Conv2dShape::validate() const {
    const std::pair<const char*, uint32_t> sizes[] = {
        {"batch", batch}, {"height", height}, {"width", width},   {"cin", cin},
        {"cout", cout},   {"kernel", kernel}, {"stride", stride},
    };
    for (const auto& [name, v] : sizes)
        if (v == 0)
            throw DeviceError(ErrorKind::Usage, fmt::format("conv2d: {} must be at least 1", name));
    // Every size in 64 bits: in 32, 2 x pad wraps and a huge padding looks like none.
    const uint64_t ph = uint64_t(height) + 2 * uint64_t(pad),
                   pw = uint64_t(width) + 2 * uint64_t(pad);
    if (kernel > ph || kernel > pw)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("conv2d: kernel {} is larger than the padded input {}x{} "
                                      "(height {} + 2 x pad {}, width {} + 2 x pad {})",
                                      kernel, ph, pw, height, pad, width, pad));
    // The kernels address HBM with 32-bit offsets, and the padded planes' sizes travel in
    // 32-bit fields.
    const uint64_t limit = uint64_t(1) << 32;
    const uint64_t ho = (ph - kernel) / stride + 1, wo = (pw - kernel) / stride + 1;
    const auto bytes = [&](std::initializer_list<uint64_t> factors) {
        uint64_t p = 1;
        for (const uint64_t f : factors) p = f != 0 && p > limit / f ? limit : p * f;
        return p;
    };
    const uint64_t x = bytes({batch, ph + stride, pw + stride, (cin + 127ull) / 128 * 128, 2});
    const uint64_t y = bytes({batch, ho, wo, cout, 4});
    if (ph + stride >= limit || pw + stride >= limit || x >= limit || y >= limit)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("conv2d: the padded input ({}{} bytes) or output ({}{} "
                                      "bytes) exceeds the 4 GiB a kernel addresses; use a smaller "
                                      "batch, image or padding",
                                      x >= limit ? "over " : "", x, y >= limit ? "over " : "", y));
}

Conv2dTiling plan_conv2d(const hw::BoardConfig& cfg, const Conv2dShape& s, uint32_t images) {
    s.validate();
    Conv2dTiling base;
    base.R = cfg.core.mxu_rows;
    base.C = cfg.core.mxu_cols;
    base.CT = ceil_div(s.cin, base.R);
    base.NT = ceil_div(s.cout, base.C);
    base.phases = std::min(s.stride, s.kernel);
    const uint32_t qmax = (s.kernel - 1) / s.stride;
    base.Hq = s.out_height() + qmax;
    base.Wq = s.out_width() + qmax;
    base.images = images;
    base.mxus = std::min<uint32_t>(cfg.core.mxus, 2);
    auto fits = [&](Conv2dTiling t) {
        const Geometry g = geometry(s, t);
        return g.vend <= cfg.core.vmem_bytes && uint64_t(g.G) * g.runs <= kMaxRunsPerStep;
    };
    const uint32_t Ho = s.out_height();
    base.band_rows = Ho;
    base.block_images = 1;
    if (fits(base)) {
        // Every image of a block streams through each loaded weight tile, so the drain of a
        // tile swap is paid once per block: take the largest block that divides the images.
        for (uint32_t G = std::min(images, kMaxBlockImages); G >= 1; --G) {
            Conv2dTiling t = base;
            t.block_images = G;
            if (images % G == 0 && fits(t)) return t;
        }
    }
    for (uint32_t hb = Ho; hb >= 1; --hb) {
        Conv2dTiling t = base;
        t.band_rows = hb;
        if (Ho % hb == 0 && fits(t)) return t;
    }
    throw DeviceError(ErrorKind::Usage,
                      fmt::format("conv2d: one output row of {} pixels with {} input channels "
                                  "does not fit in {} bytes of VMEM (core.vmem_bytes)",
                                  s.out_width(), s.cin, cfg.core.vmem_bytes));
}

std::string conv2d_key(const Conv2dShape& s, const Conv2dTiling& t) {
    return fmt::format(
        "conv2d N{} H{} W{} Cin{} Cout{} k{} s{} p{} R{} C{} images{} G{} hb{} mxus{}", s.batch,
        s.height, s.width, s.cin, s.cout, s.kernel, s.stride, s.pad, t.R, t.C, t.images,
        t.block_images, t.band_rows, t.mxus);
}

isa::Program conv2d_program(const Conv2dShape& sh, const Conv2dTiling& t) {
    const Geometry g = geometry(sh, t);
    const uint32_t R = t.R, C = t.C, NT = t.NT, S = g.S, G = g.G, nm = g.nm;
    const uint64_t wtile = uint64_t(R) * C * 2;
    const uint64_t y_pix_h = uint64_t(sh.cout) * 4;  // bytes of one output pixel in HBM
    const uint64_t y_img_h = uint64_t(g.Ho) * g.Wo * y_pix_h;
    const uint32_t y_rows = g.hb * g.Wo;  // output pixels of one image of a block
    std::string s;
    auto L = [&]<class... A>(fmt::format_string<A...> f, A&&... a) {
        s += fmt::format(f, std::forward<A>(a)...);
        s += '\n';
    };
    L("# conv2d (implicit GEMM): k={} stride={} CT={} NT={} G={} band={} runs={}x{} mxus={}", g.k,
      g.s, t.CT, NT, G, g.hb, g.runs, g.run_rows, nm);
    L("# s1 X, s2 W, s3 bias, s4 Y (HBM), s5 blocks; s6 block, s7 Cout tile, s8 step of the");
    L("# group, s9 step overall, s10 tap's LHS base, s11-s18 temporaries, s19 accumulate, s20 X");
    L("# slot, s21 Y slot, s22/s23 lw issued, s24/s25 flagged mm issued (MXU 0/1), s26/s27 W");
    L("# tiles into slot 0/1, s28/s29 X blocks into slot 0/1, s30/s31 Y stores from slot 0/1");
    L("# flags: f1/f8 W slot 0/1 in, f2/f3 lw done, f4/f5 mm done, f6 VPU, f9/f10 X slot 0/1");
    L("# in, f11/f12 Y slot 0/1 out, f13 bias in");
    // Scalar memory words: VPU ops issued, the group's HBM output base, its row bytes, its Y
    // slot and bias address, and the image whose epilogue waits for the next step (pending:
    // flag, Y address, HBM address, mm counts of MXU 0/1, row bytes, slot, bias).
    constexpr int kVpu = 0, kYdst = 4, kYBytes = 8, kYSlot = 12, kYBias = 16, kPend = 20, kPY = 24,
                  kPD = 28, kPC0 = 32, kPC1 = 36, kPBytes = 40, kPSlot = 44, kPBias = 48;
    // Scalar memory keeps its words across launches.
    L("        sw s0, [{}]", kVpu);
    L("        sw s0, [{}]", kPend);
    for (int r = 22; r <= 31; ++r) L("        li s{}, 0", r);

    // Runs the code `f(slot)` for the slot in register `reg` (0 or 1): flags are per slot
    // because the banked HBM can finish a DMA before an earlier one, so only a count of one
    // slot's transfers proves that slot complete.
    int uniq = 0;
    auto by_slot = [&](const char* reg, const std::function<void(int)>& f) {
        const int id = uniq++;
        L("        bne {}, 0, sl1_{}", reg, id);
        f(0);
        L("        jmp sld_{}", id);
        L("sl1_{}:", id);
        f(1);
        L("sld_{}:", id);
    };
    // The X block in register `breg` into the X slot (breg & 1).
    auto x_load = [&](const char* breg) {
        if (g.nbands == 1) {
            L("        mul s11, {}, {}", breg, uint64_t(G) * g.x_img_h);
        } else {
            L("        divu s11, {}, {}", breg, g.nbands);
            L("        mul s11, s11, {}", g.x_img_h);
            L("        remu s12, {}, {}", breg, g.nbands);
            L("        mul s12, s12, {}", uint64_t(g.hb) * t.Wq * g.pix);
            L("        add s11, s11, s12");
        }
        L("        add s11, s11, s1");
        L("        and s12, {}, 1", breg);
        L("        mul s13, s12, {}", uint64_t(G) * g.xv_img);
        by_slot("s12", [&](int slot) {
            if (g.nbands == 1)  // whole images: one contiguous run
                L("        dma.hv [s13+{}], [s11], 1, {}, {}, {}, f{}", g.vx, G * g.x_img_h,
                  G * g.x_img_h, G * g.x_img_h, 9 + slot);
            else  // a band: hin rows of every plane
                L("        dma.hv [s13+{}], [s11], {}, {}, {}, {}, f{}", g.vx,
                  t.phases * t.phases * t.CT, g.plane_v, g.plane_v, g.plane_h, 9 + slot);
            L("        add s{}, s{}, 1", 28 + slot, 28 + slot);
        });
    };
    // The epilogue of one image: s11 Y address, s12 HBM address, s13/s14 the mm counts that
    // complete it, s15 row bytes, s16 Y slot, s17 bias address. Bias add on the VPU, then the
    // store (NHWC rows of the tile's channels).
    auto finish = [&] {
        for (uint32_t m = 0; m < nm; ++m) L("        wait f{}, s{}", 4 + m, 13 + m);
        L("        v.addrow [s11], [s11], [s17], {}, {}, f6", y_rows, C);
        L("        lw s18, [{}]", kVpu);
        L("        add s18, s18, 1");
        L("        sw s18, [{}]", kVpu);
        L("        wait f6, s18");
        by_slot("s16", [&](int slot) {
            if (NT == 1 && sh.cout == C)  // the tile is the whole pixel: one contiguous run
                L("        dma.vh [s12], [s11], 1, {}, {}, {}, f{}", uint64_t(y_rows) * C * 4,
                  uint64_t(y_rows) * C * 4, uint64_t(y_rows) * C * 4, 11 + slot);
            else
                L("        dma.vh [s12], [s11], {}, s15, {}, {}, f{}", y_rows, y_pix_h, C * 4,
                  11 + slot);
            L("        add s{}, s{}, 1", 30 + slot, 30 + slot);
        });
    };
    auto flush_pending = [&] {
        const int id = uniq++;
        L("        lw s11, [{}]", kPend);
        L("        beq s11, 0, nop_{}", id);
        L("        lw s11, [{}]", kPY);
        L("        lw s12, [{}]", kPD);
        L("        lw s13, [{}]", kPC0);
        L("        lw s14, [{}]", kPC1);
        L("        lw s15, [{}]", kPBytes);
        L("        lw s16, [{}]", kPSlot);
        L("        lw s17, [{}]", kPBias);
        finish();
        L("        sw s0, [{}]", kPend);
        L("nop_{}:", id);
    };
    // Registers s11..s17 of image `img` of the current group; `cnt` = its mm counts per MXU
    // past s24/s25.
    auto image_regs = [&](uint32_t img, const uint32_t cnt[2]) {
        L("        add s11, s21, {}", img * g.yv_img);
        L("        lw s12, [{}]", kYdst);
        L("        add s12, s12, {}", uint64_t(img) * y_rows * y_pix_h);
        L("        add s13, s24, {}", cnt[0]);
        L("        add s14, s25, {}", cnt[1]);
        L("        lw s15, [{}]", kYBytes);
        L("        lw s16, [{}]", kYSlot);
        L("        lw s17, [{}]", kYBias);
    };

    // Weight tile of step s9 + `ahead` (the tile index wraps per block) into its slot, unless
    // the kernel has no such step. The slot was last read by the lw of step s9 + ahead - 2.
    auto w_prefetch = [&](int ahead) {
        const int id = uniq++;
        L("        add s11, s9, {}", ahead);
        L("        mul s12, s5, {}", NT * S);
        L("        bge s11, s12, nopf_{}", id);
        L("        remu s13, s11, {}", NT * S);
        L("        mul s13, s13, {}", wtile);
        L("        add s13, s13, s2");
        L("        and s14, s11, 1");
        by_slot("s14", [&](int slot) {
            L("        dma.hv [{}], [s13], 1, {}, {}, {}, f{}", g.vw + slot * wtile, wtile, wtile,
              wtile, slot ? 8 : 1);
            L("        add s{}, s{}, 1", 26 + slot, 26 + slot);
        });
        L("nopf_{}:", id);
    };
    // The lw of step s9 + `ahead` into every MXU's shadow weights, once its tile is in.
    auto w_load = [&](int ahead) {
        const int id = uniq++;
        L("        add s11, s9, {}", ahead);
        L("        mul s12, s5, {}", NT * S);
        L("        bge s11, s12, nolw_{}", id);
        L("        and s14, s11, 1");
        by_slot("s14", [&](int slot) { L("        wait f{}, s{}", slot ? 8 : 1, 26 + slot); });
        L("        mul s14, s14, {}", wtile);
        for (uint32_t m = 0; m < nm; ++m) {
            L("        mxu.lw {}, [s14+{}], {}, {}, f{}", m, g.vw, R, C, 2 + m);
            L("        add s{}, s{}, 1", 22 + m, 22 + m);
        }
        L("nolw_{}:", id);
    };

    // Prologue: the bias, the first two weight tiles (ahead of the X block in the in-order DMA
    // queue: the first matmul needs both), the first X block, the first lw.
    L("        dma.hv [{}], [s3], 1, {}, {}, {}, f13", g.vb, NT * C * 4, NT * C * 4, NT * C * 4);
    L("        li s9, 0");
    w_prefetch(0);
    w_prefetch(1);
    L("        li s6, 0");
    x_load("s6");
    w_load(0);
    L("        wait f13, 1");

    L("block:  and s11, s6, 1");
    L("        mul s20, s11, {}", uint64_t(G) * g.xv_img);
    L("        add s20, s20, {}", g.vx);
    L("        li s7, 0");
    // Per group: its Y slot (group index b NT + nt, parity), HBM output base, row bytes, bias.
    L("group:  mul s11, s6, {}", NT);
    L("        add s11, s11, s7");
    L("        and s11, s11, 1");
    L("        sw s11, [{}]", kYSlot);
    L("        mul s21, s11, {}", uint64_t(G) * g.yv_img);
    L("        add s21, s21, {}", g.vy);
    if (g.nbands == 1) {
        L("        mul s12, s6, {}", uint64_t(G) * y_img_h);
    } else {
        L("        divu s12, s6, {}", g.nbands);
        L("        mul s12, s12, {}", y_img_h);
        L("        remu s13, s6, {}", g.nbands);
        L("        mul s13, s13, {}", uint64_t(y_rows) * y_pix_h);
        L("        add s12, s12, s13");
    }
    L("        add s12, s12, s4");
    L("        mul s13, s7, {}", C * 4);
    L("        add s12, s12, s13");
    L("        sw s12, [{}]", kYdst);
    L("        li s14, {}", C * 4);
    L("        bne s7, {}, rb_ok", NT - 1);
    L("        li s14, {}", (sh.cout - (NT - 1) * C) * 4);
    L("rb_ok:  sw s14, [{}]", kYBytes);
    L("        add s13, s13, {}", g.vb);
    L("        sw s13, [{}]", kYBias);
    L("        li s8, 0");

    // One K step: tap (kh, kw) and Cin tile ct of step s8, Cout tile s7. (1) prefetch the
    // weight tile two steps ahead, so it is not queued behind the stores of a group's images in
    // the in-order DMA queue; (2) stream every run of every image of the block through the
    // loaded tile, then queue the next step's lw at once (the matmul after an lw swaps the new
    // tile in, so the lw cannot go earlier; the R-cycle load hides in the array's drain).
    // `last` (the group's last step) flags every matmul and stores each image as soon as the
    // next one is queued, so stores overlap the matmuls; the last image's epilogue waits until
    // the next step has queued its first image (pending), so the MXUs never run dry.
    auto step = [&](bool last) {
        const int id = uniq++;
        // (1) This step's lw was issued in the previous step; once it is done its slot takes
        // the tile after next.
        for (uint32_t m = 0; m < nm; ++m) L("        wait f{}, s{}", 2 + m, 22 + m);
        w_prefetch(2);
        // A group's first step waits until its Y slot is stored; a block's first, for its X.
        L("        bne s8, 0, w_ok_{}", id);
        L("        lw s11, [{}]", kYSlot);
        by_slot("s11", [&](int slot) { L("        wait f{}, s{}", 11 + slot, 30 + slot); });
        L("        bne s7, 0, w_ok_{}", id);
        L("        and s11, s6, 1");
        by_slot("s11", [&](int slot) { L("        wait f{}, s{}", 9 + slot, 28 + slot); });
        L("w_ok_{}:", id);
        // (2) The tap's LHS base: plane (phase (kh % s, kw % s), ct), shifted by (kh / s,
        // kw / s) pixels.
        L("        divu s11, s8, {}", t.CT);  // tap
        L("        remu s12, s8, {}", t.CT);  // ct
        L("        divu s13, s11, {}", g.k);  // kh
        L("        remu s14, s11, {}", g.k);  // kw
        L("        remu s15, s13, {}", g.s);  // phase row
        L("        mul s15, s15, {}", t.phases);
        L("        remu s16, s14, {}", g.s);  // phase column
        L("        add s15, s15, s16");
        L("        mul s15, s15, {}", t.CT);
        L("        add s15, s15, s12");
        L("        mul s15, s15, {}", g.plane_v);
        L("        divu s13, s13, {}", g.s);
        L("        mul s13, s13, {}", t.Wq);
        L("        divu s14, s14, {}", g.s);
        L("        add s13, s13, s14");
        L("        mul s13, s13, {}", g.pix);
        L("        add s10, s15, s13");
        L("        add s10, s10, s20");
        L("        sltu s19, 0, s8");
        uint32_t cnt[2] = {0, 0};
        for (uint32_t img = 0; img < G; ++img) {
            for (uint32_t r = 0; r < g.runs; ++r) {
                const uint32_t p = img * g.runs + r, m = p % nm;
                const bool flag = last || p + nm >= G * g.runs;
                if (flag) ++cnt[m];
                L("        mxu.mm {}, [s21+{}], [s10+{}], {}, s19{}", m,
                  img * g.yv_img + uint64_t(r) * g.run_rows * C * 4,
                  img * g.xv_img + uint64_t(r) * t.Wq * g.pix, g.run_rows,
                  flag ? fmt::format(", f{}", 4 + m) : "");
                if (p + 1 == G * g.runs) w_load(1);
            }
            if (img == 0) {
                flush_pending();
                // A block's first step: every matmul of the previous block is done (the
                // pending image was its last), so the next block's X may replace it.
                const int xid = uniq++;
                L("        bne s8, 0, nox_{}", xid);
                L("        bne s7, 0, nox_{}", xid);
                L("        add s18, s6, 1");
                L("        bge s18, s5, nox_{}", xid);
                x_load("s18");
                L("nox_{}:", xid);
            }
            if (last && img > 0) {
                uint32_t prev[2] = {0, 0};
                for (uint32_t p = 0; p < img * g.runs; ++p) ++prev[p % nm];
                image_regs(img - 1, prev);
                finish();
            }
        }
        if (last) {
            image_regs(G - 1, cnt);
            L("        sw s11, [{}]", kPY);
            L("        sw s12, [{}]", kPD);
            L("        sw s13, [{}]", kPC0);
            L("        sw s14, [{}]", kPC1);
            L("        sw s15, [{}]", kPBytes);
            L("        sw s16, [{}]", kPSlot);
            L("        sw s17, [{}]", kPBias);
            L("        li s18, 1");
            L("        sw s18, [{}]", kPend);
        }
        for (uint32_t m = 0; m < nm; ++m) L("        add s{}, s{}, {}", 24 + m, 24 + m, cnt[m]);
        L("        add s8, s8, 1");
        L("        add s9, s9, 1");
    };
    if (S > 1) {
        L("kstep:");
        step(false);
        L("        bltu s8, {}, kstep", S - 1);
    }
    step(true);
    L("        add s7, s7, 1");
    L("        bltu s7, {}, group", NT);
    L("        add s6, s6, 1");
    L("        blt s6, s5, block");
    flush_pending();
    L("        wait f11, s30");
    L("        wait f12, s31");
    L("        halt");
    return isa::assemble(s, "conv2d.s");
}

namespace {

using detail::Body;

/// bf16 bits of x (round to nearest even).
uint16_t bf16(float x) {
    return hw::f32_to_bf16(x);
}

uint32_t addr(const Buffer& b) {
    return static_cast<uint32_t>(b.addr);
}

/// How one unit of a gather pack reaches the staging area: a strided fp32 DMA (rows of
/// row_bytes) at `vmem_offset` into it, or (zero) a copy of the zero area.
struct GatherClass {
    bool zero = false;  ///< copy the zero area instead of loading from HBM
    uint64_t hbm_offset = 0, vmem_offset = 0, rows = 0, row_bytes = 0, vstride = 0, hstride = 0;
};

/// A gather pack: unit u of `units` is `vals` fp32 values gathered from HBM (s1) into the
/// staging area, rounded to bf16 and stored contiguously at s2 + u vals 2 bytes. The staging
/// area is zero before every unit (zeroed once, then again after each conversion), so the zeros
/// the kernel layouts need (padding pixels and channels) are whatever a class does not load.
/// `decode(unit register)` leaves the class index in s14 and, for loading classes, the HBM
/// source address (before hbm_offset) in s13; it may use s3..s12.
detail::Spec gather_pack_spec(std::string name, uint64_t units, uint32_t vals,
                              std::vector<GatherClass> classes,
                              std::function<void(Body&, const std::string&)> decode) {
    detail::Spec sp;
    sp.name = std::move(name);
    sp.units = units;
    // A unit's source is not affine in its index across units, so every tile is one unit.
    sp.max_tile_units = 1;
    sp.areas = {vals / 2, vals};
    const bool zeros = std::any_of(classes.begin(), classes.end(), [](auto& g) { return g.zero; });
    if (zeros) sp.fixed = {vals};
    const uint64_t bytes = uint64_t(vals) * 4;
    auto uniq = std::make_shared<int>(0);
    sp.ins = {detail::Stream(
        1, 1,
        [=](Body& b, const std::string& first, const std::string&, const std::string& slot,
            const std::string& flag) {
            const int id = (*uniq)++;
            decode(b, first);
            for (size_t c = 0; c < classes.size(); ++c) {
                const GatherClass& g = classes[c];
                const uint64_t at = b.off(1);
                b.line(fmt::format("        bne s14, {}, gp_{}_{}", c, id, c));
                if (g.zero) {
                    b.line(fmt::format("        dma.vv [{}+{}], {}, 1, {}, {}, {}, {}", slot, at,
                                       b.f(0), bytes, bytes, bytes, flag));
                } else {
                    b.line(fmt::format("        add s13, s13, {}", g.hbm_offset));
                    b.line(fmt::format("        dma.hv [{}+{}], [s13], {}, {}, {}, {}, {}", slot,
                                       at + g.vmem_offset, g.rows, g.row_bytes, g.vstride,
                                       g.hstride, flag));
                }
                b.line(fmt::format("        jmp gp_{}_end", id));
                b.line(fmt::format("gp_{}_{}:", id, c));
            }
            b.line(fmt::format("gp_{}_end:", id));
        })};
    sp.outs = {{2, 0}};
    sp.body = [=](Body& b) {
        b.vpu(fmt::format("        v.f2bf {}, {}, {}", b.a(0), b.a(1), vals));
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, {}", b.a(1), b.a(1), b.a(1), vals));
    };
    // Zeros: x > x is false for every x (NaN too), whatever VMEM held before.
    sp.prologue = [=](Body& b) {
        for (int slot = 0; slot < 2; ++slot) {
            const std::string z = b.slot(slot, 1);
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", z, z, z, vals));
        }
        if (zeros)
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", b.f(0), b.f(0), b.f(0), vals));
        b.line(fmt::format("        wait f5, {}", zeros ? 3 : 2));
    };
    return sp;
}

/// Packs x (N H W x Cin fp32, NHWC) into the kernel's bf16 stride-phase planes (conv2d.h). One
/// unit is one plane row (image, phase row a, phase column b, Cin tile, row i): Wq pixels read
/// from input row i s + a - pad at a stride of s pixels; rows in the padding are zeros.
detail::Spec pack_input_spec(const Conv2dShape& sh, const Conv2dTiling& t) {
    const uint32_t P = t.phases, R = t.R, CT = t.CT, s = sh.stride, p = sh.pad;
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
    auto uniq = std::make_shared<int>(0);  // the decoder is emitted several times per program
    auto decode = [=](Body& b, const std::string& u) {
        const int k = (*uniq)++;
        b.line(fmt::format("        remu s3, {}, {}", u, t.Hq));  // i
        b.line(fmt::format("        divu s4, {}, {}", u, t.Hq));
        b.line(fmt::format("        remu s5, s4, {}", CT));  // ct
        b.line(fmt::format("        divu s4, s4, {}", CT));
        b.line(fmt::format("        remu s6, s4, {}", P));  // b
        b.line(fmt::format("        divu s4, s4, {}", P));
        b.line(fmt::format("        remu s7, s4, {}", P));  // a
        b.line(fmt::format("        divu s4, s4, {}", P));  // image
        b.line(fmt::format("        mul s8, s3, {}", s));
        b.line("        add s8, s8, s7");  // padded input row
        b.line(fmt::format("        li s14, {}", kZero));
        b.line(fmt::format("        bltu s8, {}, pz_{}", p, k));
        b.line(fmt::format("        bltu s8, {}, pv_{}", sh.height + p, k));
        b.line(fmt::format("        jmp pz_{}", k));
        b.line(fmt::format("pv_{}:", k));
        for (uint32_t c = 0; c < P; ++c)
            if (empty[c]) b.line(fmt::format("        beq s6, {}, pz_{}", c, k));
        b.line("        mul s14, s6, 2");
        b.line(fmt::format("        sltu s9, s5, {}", CT - 1));
        b.line("        add s14, s14, 1");
        b.line("        sub s14, s14, s9");
        b.line(fmt::format("        mul s9, s4, {}", sh.height));
        b.line("        add s9, s9, s8");
        b.line(fmt::format("        sub s9, s9, {}", p));
        b.line(fmt::format("        mul s9, s9, {}", uint64_t(sh.width) * sh.cin * 4));
        b.line("        add s13, s9, s1");
        b.line(fmt::format("        mul s9, s5, {}", uint64_t(R) * 4));
        b.line("        add s13, s13, s9");
        b.line(fmt::format("pz_{}:", k));
    };
    return gather_pack_spec(fmt::format("conv2d_pack_x N{} H{} W{} Cin{} k{} s{} p{} R{}", sh.batch,
                                        sh.height, sh.width, sh.cin, sh.kernel, s, p, R),
                            units, t.Wq * R, cls, decode);
}

/// Packs w (k k Cin x Cout fp32, HWIO) into the kernel's R x C bf16 tiles (conv2d.h). One unit
/// is one tile (Cout tile, tap, Cin tile): its Cin rows x Cout columns at the row stride Cout.
detail::Spec pack_weight_spec(const Conv2dShape& sh, const Conv2dTiling& t) {
    const uint32_t R = t.R, C = t.C, CT = t.CT, NT = t.NT, kk = sh.kernel * sh.kernel;
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
    auto decode = [=](Body& b, const std::string& u) {
        b.line(fmt::format("        remu s3, {}, {}", u, CT));  // ct
        b.line(fmt::format("        divu s4, {}, {}", u, CT));
        b.line(fmt::format("        remu s5, s4, {}", kk));  // tap
        b.line(fmt::format("        divu s6, s4, {}", kk));  // Cout tile
        b.line(fmt::format("        sltu s7, s3, {}", CT - 1));
        b.line("        li s14, 3");
        b.line("        sub s14, s14, s7");
        b.line("        sub s14, s14, s7");
        b.line(fmt::format("        sltu s7, s6, {}", NT - 1));
        b.line("        sub s14, s14, s7");
        b.line(fmt::format("        mul s8, s5, {}", sh.cin));
        b.line(fmt::format("        mul s9, s3, {}", R));
        b.line("        add s8, s8, s9");
        b.line(fmt::format("        mul s8, s8, {}", uint64_t(sh.cout) * 4));
        b.line(fmt::format("        mul s9, s6, {}", uint64_t(C) * 4));
        b.line("        add s8, s8, s9");
        b.line("        add s13, s8, s1");
    };
    return gather_pack_spec(
        fmt::format("conv2d_pack_w k{} Cin{} Cout{} R{} C{}", sh.kernel, sh.cin, sh.cout, R, C),
        uint64_t(NT) * kk * CT, R * C, cls, decode);
}

/// The kernel's operands of one group of cores (one replica each) in scratch HBM.
struct Packed {
    std::vector<Buffer> x, w, b;
    Tensor bias;  ///< the bias padded to NT C values (when Cout is not a multiple of C)
    Event event;  ///< the packing launches, merged
};

void free_packed(Device& dev, Packed& p) {
    for (auto* v : {&p.x, &p.w})
        for (const Buffer& b : *v) dev.free(b);
    p.x.clear();
    p.w.clear();
    if (!p.bias.bufs.empty()) free_tensor(dev, p.bias);
    p.b.clear();
}

/// Packs x, w and bias (device Tensors over one core set) into the kernel's layouts.
Packed pack_operands(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Conv2dTiling& t,
                     const Tensor& x, const Tensor& w, const Tensor& bias) {
    Packed p;
    try {
        const uint64_t x_bytes =
            uint64_t(s.batch) * t.phases * t.phases * t.CT * t.Hq * t.Wq * t.R * 2;
        const uint64_t w_bytes = uint64_t(t.NT) * s.kernel * s.kernel * t.CT * t.R * t.C * 2;
        for (uint32_t core : x.cores) {
            p.x.push_back(dev.alloc(x_bytes, core));
            p.w.push_back(dev.alloc(w_bytes, core));
        }
        std::vector<Event> evs;
        evs.push_back(detail::run(dev, cache, pack_input_spec(s, t), x.cores, [&](size_t i) {
            return std::vector<uint32_t>{addr(x.bufs[i]), addr(p.x[i])};
        }));
        evs.push_back(detail::run(dev, cache, pack_weight_spec(s, t), x.cores, [&](size_t i) {
            return std::vector<uint32_t>{addr(w.bufs[i]), addr(p.w[i])};
        }));
        if (s.cout % t.C) {
            // The kernel loads NT C bias values; the padding columns only reach output
            // channels that are never stored.
            p.bias = alloc_tensor(dev, x.cores, 1, t.NT * t.C);
            evs.push_back(copy_into_columns(dev, cache, bias, p.bias, 0));
            p.b = p.bias.bufs;
        } else {
            p.b = bias.bufs;
        }
        p.event = detail::merge(evs);
    } catch (...) {
        free_packed(dev, p);
        throw;
    }
    return p;
}

/// Starts the kernel on the group's cores: packed operands in, y (N Ho Wo x Cout fp32) out.
LaunchHandle launch_conv(Device& dev, ProgramCache& cache, const Conv2dShape& s,
                         const Conv2dTiling& t, const Packed& p, const Tensor& y) {
    const uint32_t blocks = t.images / t.block_images * (s.out_height() / t.band_rows);
    const isa::Program& prog = cache.get(conv2d_key(s, t), [&] { return conv2d_program(s, t); });
    return dev.launch_async(y.cores, prog, [&, blocks](size_t j) {
        return std::vector<uint32_t>{addr(p.x[j]), addr(p.w[j]), addr(p.b[j]), addr(y.bufs[j]),
                                     blocks};
    });
}

void check_operands(const Conv2dShape& s, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y) {
    s.validate();
    const uint32_t k = s.kernel;
    check_tensor(w, k * k * s.cin, s.cout, x, "conv2d", "w");
    check_tensor(bias, 1, s.cout, x, "conv2d", "bias");
    check_tensor(y, s.batch * s.out_height() * s.out_width(), s.cout, x, "conv2d", "y");
    check_tensor(x, s.batch * s.height * s.width, s.cin, x, "conv2d", "x");
}

/// The output rows y0 .. y0 + ny and columns x0 .. x0 + nx whose input pixel under tap
/// (kh, kw) lies inside the image (the others read padding).
struct TapRange {
    uint32_t y0 = 0, ny = 0, x0 = 0, nx = 0;
};

TapRange tap_range(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    auto span = [&](uint32_t size, uint32_t out, uint32_t kpos, uint32_t& first, uint32_t& n) {
        first = s.pad > kpos ? (s.pad - kpos + s.stride - 1) / s.stride : 0;
        const int64_t hi = int64_t(size) - 1 + s.pad - kpos;
        const uint32_t end = hi < 0 ? 0 : std::min<uint32_t>(out, uint32_t(hi / s.stride) + 1);
        n = end > first ? end - first : 0;
    };
    TapRange r;
    span(s.height, s.out_height(), kh, r.y0, r.ny);
    span(s.width, s.out_width(), kw, r.x0, r.nx);
    return r;
}

/// Leaves in s13 the x address (base in s{x_arg}) of the first pixel unit u moves under tap
/// (kh, kw) and in s14 the column-buffer address (base in s{col_arg}). Units are (image, output
/// row) over the tap's valid rows.
void emit_tap_addresses(Body& b, const std::string& u, const Conv2dShape& s, const TapRange& r,
                        uint32_t kh, uint32_t kw, int x_arg, int col_arg) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), kk = s.kernel * s.kernel;
    const uint64_t pix = uint64_t(s.cin) * 4;
    b.line(fmt::format("        remu s3, {}, {}", u, r.ny));
    b.line(fmt::format("        add s3, s3, {}", r.y0));      // output row
    b.line(fmt::format("        divu s4, {}, {}", u, r.ny));  // image
    // Input pixel (image, y s + kh - pad, x0 s + kw - pad), both coordinates >= 0.
    b.line(fmt::format("        mul s5, s3, {}", s.stride));
    b.line(fmt::format("        add s5, s5, {}", kh));
    b.line(fmt::format("        sub s5, s5, {}", s.pad));
    b.line(fmt::format("        mul s6, s4, {}", s.height));
    b.line("        add s5, s5, s6");
    b.line(fmt::format("        mul s5, s5, {}", s.width));
    b.line(fmt::format("        add s5, s5, {}", r.x0 * s.stride + kw - s.pad));
    b.line(fmt::format("        mul s5, s5, {}", pix));
    b.line(fmt::format("        add s13, s5, s{}", x_arg));
    // Column-buffer row (image, y, x0), columns from tap (kh k + kw) Cin.
    b.line(fmt::format("        mul s6, s4, {}", Ho));
    b.line("        add s6, s6, s3");
    b.line(fmt::format("        mul s6, s6, {}", Wo));
    b.line(fmt::format("        add s6, s6, {}", r.x0));
    b.line(fmt::format("        mul s6, s6, {}", kk * pix));
    b.line(fmt::format("        add s6, s6, {}", (kh * s.kernel + kw) * pix));
    b.line(fmt::format("        add s14, s6, s{}", col_arg));
}

std::string shape_key(const Conv2dShape& s) {
    return fmt::format("N{} H{} W{} Cin{} k{} s{} p{}", s.batch, s.height, s.width, s.cin, s.kernel,
                       s.stride, s.pad);
}

/// im2col of one tap: s1 = x, s2 = the column buffer (N Ho Wo x k k Cin fp32). One unit per
/// valid (image, output row): nx pixels of Cin values at the input pixel stride s, stored at
/// the column buffer's row stride.
detail::Spec im2col_tap_spec(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    const TapRange r = tap_range(s, kh, kw);
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * s.kernel * s.kernel;
    detail::Spec sp;
    sp.name = fmt::format("conv2d_im2col {} tap {} {}", shape_key(s), kh, kw);
    sp.units = uint64_t(s.batch) * r.ny;
    // Consecutive units are not one affine 2-D transfer, so every tile is one unit.
    sp.max_tile_units = 1;
    sp.areas = {r.nx * s.cin};
    sp.ins = {detail::Stream(1, 0,
                             [=](Body& b, const std::string& first, const std::string&,
                                 const std::string& slot, const std::string& flag) {
                                 emit_tap_addresses(b, first, s, r, kh, kw, 1, 2);
                                 b.line(fmt::format("        dma.hv {}, [s13], {}, {}, {}, {}, {}",
                                                    b.at(slot, 0), r.nx, pix, pix, pix * s.stride,
                                                    flag));
                             })};
    sp.outs = {detail::Stream(2, 0,
                              [=](Body& b, const std::string& first, const std::string&,
                                  const std::string& slot, const std::string& flag) {
                                  emit_tap_addresses(b, first, s, r, kh, kw, 1, 2);
                                  b.line(fmt::format("        dma.vh [s14], {}, {}, {}, {}, {}, {}",
                                                     b.at(slot, 0), r.nx, pix, row, pix, flag));
                              })};
    sp.body = [](Body&) {};
    return sp;
}

/// col2im of one tap: dx (s2) += the tap's columns of dcol (s1), per valid (image, output
/// row). A tap maps distinct outputs to distinct input pixels, so its units never overlap.
detail::Spec col2im_tap_spec(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    const TapRange r = tap_range(s, kh, kw);
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * s.kernel * s.kernel;
    const uint32_t vals = r.nx * s.cin;
    detail::Spec sp;
    sp.name = fmt::format("conv2d_col2im {} tap {} {}", shape_key(s), kh, kw);
    sp.units = uint64_t(s.batch) * r.ny;
    sp.max_tile_units = 1;
    sp.areas = {vals, vals};
    auto load_dx = [=](Body& b, const std::string& first, const std::string&,
                       const std::string& slot, const std::string& flag) {
        emit_tap_addresses(b, first, s, r, kh, kw, 2, 1);
        b.line(fmt::format("        dma.hv {}, [s13], {}, {}, {}, {}, {}", b.at(slot, 0), r.nx, pix,
                           pix, pix * s.stride, flag));
    };
    auto load_dcol = [=](Body& b, const std::string& first, const std::string&,
                         const std::string& slot, const std::string& flag) {
        emit_tap_addresses(b, first, s, r, kh, kw, 2, 1);
        b.line(fmt::format("        dma.hv {}, [s14], {}, {}, {}, {}, {}", b.at(slot, 1), r.nx, pix,
                           pix, row, flag));
    };
    sp.ins = {detail::Stream(2, 0, load_dx), detail::Stream(1, 1, load_dcol)};
    sp.outs = {detail::Stream(2, 0,
                              [=](Body& b, const std::string& first, const std::string&,
                                  const std::string& slot, const std::string& flag) {
                                  emit_tap_addresses(b, first, s, r, kh, kw, 2, 1);
                                  b.line(fmt::format("        dma.vh [s13], {}, {}, {}, {}, {}, {}",
                                                     b.at(slot, 0), r.nx, pix, pix * s.stride, pix,
                                                     flag));
                              })};
    sp.body = [=](Body& b) {
        b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.a(0), b.a(0), b.a(1), vals));
    };
    return sp;
}

/// Zeroes slot areas `areas` of both slots and every fixed area in the prologue (x > x is
/// false for every x, NaN too): the row kernels below leave whatever a unit does not load zero.
void zero_staging(Body& b, const std::vector<int>& areas, const std::vector<uint32_t>& area_vals,
                  const std::vector<uint32_t>& fixed_vals) {
    int n = 0;
    for (int slot = 0; slot < 2; ++slot)
        for (int a : areas) {
            const std::string z = b.slot(slot, a);
            b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", z, z, z, area_vals[a]));
            ++n;
        }
    for (size_t f = 0; f < fixed_vals.size(); ++f) {
        const std::string z = b.f(int(f));
        b.line(fmt::format("        v.cmpgt {}, {}, {}, {}, f5", z, z, z, fixed_vals[f]));
        ++n;
    }
    b.line(fmt::format("        wait f5, {}", n));
}

/// im2col with one unit per output row (image, y): the k input rows it reads come in as k
/// contiguous row DMAs (a zero copy for a padding row), each tap's pixels are gathered from
/// them into the tap's columns of a Wo x k k Cin staging row by a VMEM copy, and the row goes
/// out in one contiguous store. Gathering in VMEM keeps every HBM transfer a whole image row:
/// a per-tap DMA straight from HBM moves Cin values per request, which for a small Cin (an RGB
/// stem: 12 bytes) wastes most of each burst. Columns no tap reaches (horizontal padding) keep
/// the prologue's zeros. s1 = x, s2 = the column buffer.
detail::Spec im2col_rows_spec(const Conv2dShape& s) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel, kk = k * k;
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * kk, in_row = pix * s.width;
    detail::Spec sp;
    sp.name = fmt::format("conv2d_im2col_rows {}", shape_key(s));
    sp.units = uint64_t(s.batch) * Ho;
    sp.max_tile_units = 1;
    sp.areas = {Wo * kk * s.cin};
    sp.fixed = {s.width * s.cin};
    auto uniq = std::make_shared<int>(0);
    for (uint32_t kh = 0; kh < k; ++kh) {
        const TapRange r = tap_range(s, kh, 0);  // rows y0 .. y0 + ny read a real input row
        const int area = int(sp.areas.size());
        sp.areas.push_back(s.width * s.cin);
        sp.ins.push_back(detail::Stream(
            1, area,
            [=](Body& b, const std::string& u, const std::string&, const std::string& slot,
                const std::string& flag) {
                const int id = (*uniq)++;
                b.line(fmt::format("        remu s3, {}, {}", u, Ho));  // y
                b.line(fmt::format("        divu s4, {}, {}", u, Ho));  // image
                b.line(fmt::format("        bltu s3, {}, ic_z{}", r.y0, id));
                b.line(fmt::format("        bge s3, {}, ic_z{}", r.y0 + r.ny, id));
                b.line(fmt::format("        mul s5, s3, {}", s.stride));
                b.line(fmt::format("        add s5, s5, {}", kh));
                b.line(fmt::format("        sub s5, s5, {}", s.pad));
                b.line(fmt::format("        mul s6, s4, {}", s.height));
                b.line("        add s5, s5, s6");
                b.line(fmt::format("        mul s5, s5, {}", in_row));
                b.line("        add s13, s5, s1");
                b.line(fmt::format("        dma.hv {}, [s13], 1, {}, {}, {}, {}", b.at(slot, area),
                                   in_row, in_row, in_row, flag));
                b.line(fmt::format("        jmp ic_e{}", id));
                b.line(fmt::format("ic_z{}:", id));
                b.line(fmt::format("        dma.vv {}, {}, 1, {}, {}, {}, {}", b.at(slot, area),
                                   b.f(0), in_row, in_row, in_row, flag));
                b.line(fmt::format("ic_e{}:", id));
            }));
    }
    sp.outs = {{2, 0}};
    sp.body = [=](Body& b) {
        for (uint32_t t = 0; t < kk; ++t) {
            const uint32_t kh = t / k, kw = t % k;
            const TapRange r = tap_range(s, kh, kw);
            if (!r.ny || !r.nx) continue;  // never reads the image: stays zero
            const uint64_t to = b.off(0) + r.x0 * row + t * pix;
            const uint64_t from =
                b.off(1 + int(kh)) + (uint64_t(r.x0) * s.stride + kw - s.pad) * pix;
            b.vpu(fmt::format("        dma.vv [s19+{}], [s19+{}], {}, {}, {}, {}", to, from, r.nx,
                              pix, row, pix * s.stride));
        }
    };
    sp.prologue = [=](Body& b) { zero_staging(b, {0}, {Wo * kk * s.cin}, {s.width * s.cin}); };
    return sp;
}

/// col2im with one unit per input row (image, iy): per tap, the dcol values that reach the
/// row are loaded at their pixels into the tap's W x Cin area (a zero copy when the tap does
/// not reach it; the pixels it never reaches stay zero), then dx = +0.0 + area_0, dx += area_t
/// in tap order, one contiguous store. Adding a +0.0 where the reference skips a tap is exact:
/// the sum starts at +0.0, so it is never -0.0. s1 = dcol, s2 = dx.
detail::Spec col2im_rows_spec(const Conv2dShape& s) {
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel, kk = k * k;
    const uint64_t pix = uint64_t(s.cin) * 4, row = pix * kk;
    const uint32_t vals = s.width * s.cin;
    detail::Spec sp;
    sp.name = fmt::format("conv2d_col2im_rows {}", shape_key(s));
    sp.units = uint64_t(s.batch) * s.height;
    sp.max_tile_units = 1;
    sp.areas = {vals};
    sp.fixed = {std::max(s.width, Wo) * s.cin};
    auto uniq = std::make_shared<int>(0);
    std::vector<int> tap_areas;
    for (uint32_t t = 0; t < kk; ++t) {
        const uint32_t kh = t / k, kw = t % k;
        const TapRange r = tap_range(s, kh, kw);
        if (!r.ny || !r.nx) continue;
        const int area = int(sp.areas.size());
        sp.areas.push_back(vals);
        tap_areas.push_back(area);
        sp.ins.push_back(detail::Stream(
            1, area,
            [=](Body& b, const std::string& u, const std::string&, const std::string& slot,
                const std::string& flag) {
                const int id = (*uniq)++;
                const uint64_t at = b.off(area) + uint64_t(r.x0 * s.stride + kw - s.pad) * pix;
                b.line(fmt::format("        remu s3, {}, {}", u, s.height));  // iy
                b.line(fmt::format("        divu s4, {}, {}", u, s.height));  // image
                // Output row y = (iy + pad - kh) / stride when exact and inside 0 .. Ho.
                b.line(fmt::format("        add s5, s3, {}", s.pad));
                b.line(fmt::format("        bltu s5, {}, cc_z{}", kh, id));
                b.line(fmt::format("        sub s5, s5, {}", kh));
                b.line(fmt::format("        remu s6, s5, {}", s.stride));
                b.line(fmt::format("        bne s6, 0, cc_z{}", id));
                b.line(fmt::format("        divu s5, s5, {}", s.stride));
                b.line(fmt::format("        bge s5, {}, cc_z{}", Ho, id));
                b.line(fmt::format("        mul s6, s4, {}", Ho));
                b.line("        add s5, s5, s6");
                b.line(fmt::format("        mul s5, s5, {}", Wo));
                b.line(fmt::format("        add s5, s5, {}", r.x0));
                b.line(fmt::format("        mul s5, s5, {}", row));
                b.line(fmt::format("        add s5, s5, {}", t * pix));
                b.line("        add s13, s5, s1");
                b.line(fmt::format("        dma.hv [{}+{}], [s13], {}, {}, {}, {}, {}", slot, at,
                                   r.nx, pix, pix * s.stride, row, flag));
                b.line(fmt::format("        jmp cc_e{}", id));
                b.line(fmt::format("cc_z{}:", id));
                b.line(fmt::format("        dma.vv [{}+{}], {}, {}, {}, {}, {}, {}", slot, at,
                                   b.f(0), r.nx, pix, pix * s.stride, pix, flag));
                b.line(fmt::format("cc_e{}:", id));
            }));
    }
    sp.outs = {{2, 0}};
    sp.body = [=](Body& b) {
        for (size_t i = 0; i < tap_areas.size(); ++i)
            b.vpu(fmt::format("        v.add {}, {}, {}, {}", b.a(0), i ? b.a(0) : b.f(0),
                              b.a(tap_areas[i]), vals));
    };
    std::vector<uint32_t> area_vals = sp.areas;
    sp.prologue = [=](Body& b) {
        zero_staging(b, tap_areas, area_vals, {std::max(s.width, Wo) * s.cin});
    };
    return sp;
}

/// Whether a kernel's staging fits VMEM (else conv2d_grad uses the per-tap kernels).
bool fits(const detail::Spec& sp, const hw::BoardConfig& cfg) {
    try {
        return detail::tile_units(sp, cfg) >= 1;
    } catch (const DeviceError&) {
        return false;
    }
}

/// t = +0.0 in place: x > x is false for every x (NaN too), whatever the memory held.
Event zero_tensor(Device& dev, ProgramCache& cache, const Tensor& t) {
    detail::Spec sp;
    sp.name = "conv2d_grad_zero";
    sp.units = t.elements();
    sp.areas = {1};
    sp.ins = {{1, 0}};
    sp.outs = {{1, 0}};
    sp.body = [](Body& b) {
        b.vpu(fmt::format("        v.cmpgt {}, {}, {}, s18", b.a(0), b.a(0), b.a(0)));
    };
    return detail::run(dev, cache, sp, {&t});
}

/// col = im2col(x) (N Ho Wo x k k Cin fp32) on x's cores: one row kernel (im2col_rows_spec)
/// when its staging fits VMEM, else one kernel per tap over zeroed padding.
std::vector<Event> im2col(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Tensor& x,
                          const Tensor& col) {
    const detail::Spec rows = im2col_rows_spec(s);
    if (fits(rows, dev.config())) return {detail::run(dev, cache, rows, {&x, &col})};
    const uint32_t k = s.kernel;
    std::vector<TapRange> taps;
    bool partial = false;
    for (uint32_t t = 0; t < k * k; ++t) {
        taps.push_back(tap_range(s, t / k, t % k));
        partial |= taps.back().ny < s.out_height() || taps.back().nx < s.out_width();
    }
    std::vector<Event> evs;
    // Padding pixels are what no tap writes: zero them once.
    if (partial) evs.push_back(zero_tensor(dev, cache, col));
    for (uint32_t t = 0; t < k * k; ++t)
        if (taps[t].ny && taps[t].nx)
            evs.push_back(detail::run(dev, cache, im2col_tap_spec(s, t / k, t % k), {&x, &col}));
    return evs;
}

/// The folded lowering of conv2d_folds_taps(): col = im2col(x), y = col w + bias (bf16 operands,
/// fp32 accumulation, the fused matmul with the bias in its epilogue). `col` is caller-owned
/// scratch.
std::vector<Event> conv2d_folded(Device& dev, ProgramCache& cache, const Conv2dShape& s,
                                 const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& col, const Tensor& y) {
    std::vector<Event> evs = im2col(dev, cache, s, x, col);
    evs.push_back(matmul(dev, cache, col, false, w, false, y, Precision::Bf16, &bias));
    return evs;
}

}  // namespace

Event conv2d(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Tensor& x,
             const Tensor& w, const Tensor& bias, const Tensor& y) {
    check_operands(s, x, w, bias, y);
    if (conv2d_folds_taps(s, dev.config().core.mxu_rows)) {
        Tensor col = alloc_tensor(dev, x.cores, s.batch * s.out_height() * s.out_width(),
                                  s.kernel * s.kernel * s.cin);
        std::vector<Event> evs;
        try {
            evs = conv2d_folded(dev, cache, s, x, w, bias, col, y);
        } catch (...) {
            free_tensor(dev, col);
            throw;
        }
        free_tensor(dev, col);
        return detail::merge(evs);
    }
    const Conv2dTiling t = plan_conv2d(dev.config(), s, s.batch);
    Packed p = pack_operands(dev, cache, s, t, x, w, bias);
    Event ev;
    try {
        ev = dev.wait(launch_conv(dev, cache, s, t, p, y));
    } catch (...) {
        free_packed(dev, p);
        throw;
    }
    free_packed(dev, p);
    return detail::merge({p.event, ev});
}

Event conv2d_grad(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Tensor& x,
                  const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                  const Tensor& db) {
    s.validate();
    const uint32_t k = s.kernel, M = s.batch * s.out_height() * s.out_width();
    const uint32_t KC = k * k * s.cin;
    check_tensor(x, s.batch * s.height * s.width, s.cin, x, "conv2d_grad", "x");
    check_tensor(w, KC, s.cout, x, "conv2d_grad", "w");
    check_tensor(dy, M, s.cout, x, "conv2d_grad", "dy");
    const bool want_dx = !dx.bufs.empty();
    if (want_dx) check_tensor(dx, s.batch * s.height * s.width, s.cin, x, "conv2d_grad", "dx");
    check_tensor(dw, KC, s.cout, x, "conv2d_grad", "dw");
    check_tensor(db, 1, s.cout, x, "conv2d_grad", "db");
    Tensor col, dcol;
    std::vector<Event> evs;
    try {
        col = alloc_tensor(dev, x.cores, M, KC);
        evs.push_back(col_sum(dev, cache, dy, db));
        for (const Event& e : im2col(dev, cache, s, x, col)) evs.push_back(e);
        evs.push_back(matmul(dev, cache, col, true, dy, false, dw, Precision::Bf16));
        free_tensor(dev, col);
        if (!want_dx) return detail::merge(evs);
        dcol = alloc_tensor(dev, x.cores, M, KC);
        evs.push_back(matmul(dev, cache, dy, false, w, true, dcol, Precision::Bf16));
        const detail::Spec col2im = col2im_rows_spec(s);
        if (col2im.ins.size() && fits(col2im, dev.config())) {
            evs.push_back(detail::run(dev, cache, col2im, {&dcol, &dx}));
        } else {
            evs.push_back(zero_tensor(dev, cache, dx));
            for (uint32_t t = 0; t < k * k; ++t) {
                const TapRange r = tap_range(s, t / k, t % k);
                if (r.ny && r.nx)
                    evs.push_back(
                        detail::run(dev, cache, col2im_tap_spec(s, t / k, t % k), {&dcol, &dx}));
            }
        }
        free_tensor(dev, dcol);
    } catch (...) {
        if (!col.bufs.empty()) free_tensor(dev, col);
        if (!dcol.bufs.empty()) free_tensor(dev, dcol);
        throw;
    }
    return detail::merge(evs);
}

Conv2dResult conv2d(Device& dev, ProgramCache& cache, const std::vector<float>& x,
                    const std::vector<float>& w, const std::vector<float>& bias,
                    const Conv2dShape& s, const std::vector<uint32_t>& cores) {
    s.validate();
    const uint32_t H = s.height, W = s.width, Ho = s.out_height(), Wo = s.out_width(), k = s.kernel;
    if (x.size() != size_t(s.batch) * H * W * s.cin || w.size() != size_t(k) * k * s.cin * s.cout ||
        bias.size() != s.cout)
        throw DeviceError(
            ErrorKind::Usage,
            fmt::format("conv2d: x has {} values, w {} and bias {}; the shape needs "
                        "{}, {} and {}",
                        x.size(), w.size(), bias.size(), size_t(s.batch) * H * W * s.cin,
                        size_t(k) * k * s.cin * s.cout, s.cout));
    if (cores.empty()) throw DeviceError(ErrorKind::Usage, "conv2d: no cores");
    const hw::BoardConfig& cfg = dev.config();

    // Core i takes the i-th even share of the images; cores with equal shares form one group
    // (at most two), each one set of device Tensors and one launch of the same program.
    struct Group {
        Conv2dShape shape;
        Conv2dTiling tiling;
        std::vector<uint32_t> cores, n0;
        Tensor x, w, b, y, col;
        Packed packed;
    };
    const bool folded = conv2d_folds_taps(s, dev.config().core.mxu_rows);
    std::vector<Group> groups;
    const uint32_t nc = static_cast<uint32_t>(cores.size());
    for (uint32_t i = 0, n0 = 0; i < nc; ++i) {
        const uint32_t n = s.batch / nc + (i < s.batch % nc ? 1 : 0);
        if (!n) continue;
        auto it = std::find_if(groups.begin(), groups.end(),
                               [&](const Group& g) { return g.shape.batch == n; });
        if (it == groups.end()) {
            Group g;
            g.shape = s;
            g.shape.batch = n;
            if (!folded) g.tiling = plan_conv2d(cfg, s, n);
            groups.push_back(std::move(g));
            it = groups.end() - 1;
        }
        it->cores.push_back(cores[i]);
        it->n0.push_back(n0);
        n0 += n;
    }
    auto release = [&] {
        for (Group& g : groups) {
            free_packed(dev, g.packed);
            for (Tensor* t : {&g.x, &g.w, &g.b, &g.y, &g.col})
                if (!t->bufs.empty()) free_tensor(dev, *t);
        }
    };
    Conv2dResult res;
    uint64_t bytes_before = 0;
    try {
        std::vector<Event> packs;
        for (Group& g : groups) {
            const Conv2dShape& gs = g.shape;
            g.x = alloc_tensor(dev, g.cores, gs.batch * H * W, s.cin);
            g.w = alloc_tensor(dev, g.cores, k * k * s.cin, s.cout);
            g.b = alloc_tensor(dev, g.cores, 1, s.cout);
            g.y = alloc_tensor(dev, g.cores, gs.batch * Ho * Wo, s.cout);
            const size_t img = size_t(H) * W * s.cin;
            for (size_t j = 0; j < g.cores.size(); ++j)
                write_tensor(dev, g.x, j,
                             std::vector<float>(x.begin() + g.n0[j] * img,
                                                x.begin() + (g.n0[j] + gs.batch) * img));
            write_tensor_all(dev, g.w, w);
            write_tensor_all(dev, g.b, bias);
            if (folded) {
                // im2col is the folded lowering's operand layout, as the phase planes are the
                // implicit GEMM's.
                g.col = alloc_tensor(dev, g.cores, gs.batch * Ho * Wo, k * k * s.cin);
                for (const Event& e : im2col(dev, cache, gs, g.x, g.col)) packs.push_back(e);
            } else {
                g.packed = pack_operands(dev, cache, gs, g.tiling, g.x, g.w, g.b);
                packs.push_back(g.packed.event);
            }
        }
        res.pack = detail::merge(packs);
        // The calibrated figure is the kernel on operands already in its HBM layout (as XLA
        // keeps them), so the packing launches stay out of `event` and `hbm_bytes`.
        bytes_before = kernel_hbm_bytes(dev);
        if (folded) {
            std::vector<Event> evs;
            for (const Group& g : groups) {
                evs.push_back(
                    matmul(dev, cache, g.col, false, g.w, false, g.y, Precision::Bf16, &g.b));
            }
            res.event = detail::merge(evs);
        } else {
            std::vector<LaunchHandle> handles;
            for (const Group& g : groups)
                handles.push_back(launch_conv(dev, cache, g.shape, g.tiling, g.packed, g.y));
            res.event = wait_all(dev, handles);
        }
        res.folded = folded;
        res.hbm_bytes = kernel_hbm_bytes(dev) - bytes_before;
        res.y.assign(size_t(s.batch) * Ho * Wo * s.cout, 0.0f);
        for (const Group& g : groups)
            for (size_t j = 0; j < g.cores.size(); ++j) {
                const std::vector<float> v = read_tensor(dev, g.y, j);
                std::copy(v.begin(), v.end(), res.y.begin() + size_t(g.n0[j]) * Ho * Wo * s.cout);
            }
    } catch (...) {
        release();
        throw;
    }
    release();
    res.tiling = groups.front().tiling;
    for (const Group& g : groups)
        if (g.shape.batch > res.tiling.images) res.tiling = g.tiling;
    res.macs = s.macs();
    const uint64_t cycles = res.event.end_cycle - res.event.start_cycle;
    const double pes = double(cfg.core.mxus) * cfg.core.mxu_rows * cfg.core.mxu_cols;
    res.mxu_utilization =
        sim::mxu_utilization(double(res.macs), sim::mxu_capacity(pes, double(cycles), nc));
    return res;
}

std::vector<float> conv2d_reference(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>& bias, const Conv2dShape& s,
                                    uint32_t R) {
    s.validate();
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel;
    const size_t M = size_t(s.batch) * Ho * Wo;
    std::vector<float> y(M * s.cout, 0.0f);
    if (conv2d_folds_taps(s, R)) {
        y = matmul_reference(conv2d_im2col_reference(x, s), uint32_t(M), k * k * s.cin, false, w,
                             k * k * s.cin, s.cout, false, Precision::Bf16, R);
        return bias_add_reference(y, bias, uint32_t(M), s.cout);
    }
    std::vector<uint16_t> lhs, rhs;
    bool first = true;
    for (uint32_t kh = 0; kh < k; ++kh)
        for (uint32_t kw = 0; kw < k; ++kw)
            for (uint32_t c0 = 0; c0 < s.cin; c0 += R) {
                // The tap's shifted input window as an M x kk matrix (zeros in the padding)
                // times the tap's kk x Cout weights: one MXU pass per output.
                const uint32_t kk = std::min(R, s.cin - c0);
                lhs.assign(M * kk, 0);
                for (uint32_t n = 0; n < s.batch; ++n)
                    for (uint32_t oy = 0; oy < Ho; ++oy)
                        for (uint32_t ox = 0; ox < Wo; ++ox) {
                            const int64_t r = int64_t(oy) * s.stride + kh - s.pad;
                            const int64_t c = int64_t(ox) * s.stride + kw - s.pad;
                            if (r < 0 || r >= s.height || c < 0 || c >= s.width) continue;
                            const size_t row = (size_t(n) * Ho + oy) * Wo + ox;
                            for (uint32_t ci = 0; ci < kk; ++ci)
                                lhs[row * kk + ci] =
                                    bf16(x[((size_t(n) * s.height + r) * s.width + c) * s.cin + c0 +
                                           ci]);
                        }
                rhs.assign(size_t(kk) * s.cout, 0);
                for (uint32_t ci = 0; ci < kk; ++ci)
                    for (uint32_t co = 0; co < s.cout; ++co)
                        rhs[size_t(ci) * s.cout + co] =
                            bf16(w[((size_t(kh) * k + kw) * s.cin + c0 + ci) * s.cout + co]);
                hw::mxu_matmul(lhs.data(), int(M), int(kk), rhs.data(), int(s.cout), y.data(),
                               !first);
                first = false;
            }
    for (size_t i = 0; i < M; ++i)
        for (uint32_t co = 0; co < s.cout; ++co) y[i * s.cout + co] += bias[co];
    return y;
}

std::vector<double> conv2d_reference_fp64(const std::vector<float>& x, const std::vector<float>& w,
                                          const std::vector<float>& bias, const Conv2dShape& s) {
    s.validate();
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel;
    std::vector<double> y(size_t(s.batch) * Ho * Wo * s.cout);
    for (uint32_t n = 0; n < s.batch; ++n)
        for (uint32_t oy = 0; oy < Ho; ++oy)
            for (uint32_t ox = 0; ox < Wo; ++ox) {
                double* out = &y[((size_t(n) * Ho + oy) * Wo + ox) * s.cout];
                for (uint32_t co = 0; co < s.cout; ++co) out[co] = bias[co];
                for (uint32_t kh = 0; kh < k; ++kh)
                    for (uint32_t kw = 0; kw < k; ++kw) {
                        const int64_t r = int64_t(oy) * s.stride + kh - s.pad;
                        const int64_t c = int64_t(ox) * s.stride + kw - s.pad;
                        if (r < 0 || r >= s.height || c < 0 || c >= s.width) continue;
                        const float* in = &x[((size_t(n) * s.height + r) * s.width + c) * s.cin];
                        const float* wt = &w[(size_t(kh) * k + kw) * s.cin * s.cout];
                        for (uint32_t ci = 0; ci < s.cin; ++ci)
                            for (uint32_t co = 0; co < s.cout; ++co)
                                out[co] += double(in[ci]) * double(wt[size_t(ci) * s.cout + co]);
                    }
            }
    return y;
}

std::vector<float> conv2d_im2col_reference(const std::vector<float>& x, const Conv2dShape& s) {
    s.validate();
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel;
    const size_t KC = size_t(k) * k * s.cin;
    std::vector<float> col(size_t(s.batch) * Ho * Wo * KC, 0.0f);
    for (uint32_t n = 0; n < s.batch; ++n)
        for (uint32_t oy = 0; oy < Ho; ++oy)
            for (uint32_t ox = 0; ox < Wo; ++ox)
                for (uint32_t kh = 0; kh < k; ++kh)
                    for (uint32_t kw = 0; kw < k; ++kw) {
                        const int64_t r = int64_t(oy) * s.stride + kh - s.pad;
                        const int64_t c = int64_t(ox) * s.stride + kw - s.pad;
                        if (r < 0 || r >= s.height || c < 0 || c >= s.width) continue;
                        const float* in = &x[((size_t(n) * s.height + r) * s.width + c) * s.cin];
                        float* out = &col[((size_t(n) * Ho + oy) * Wo + ox) * KC +
                                          (size_t(kh) * k + kw) * s.cin];
                        std::copy(in, in + s.cin, out);
                    }
    return col;
}

Conv2dGradResult conv2d_grad_reference(const std::vector<float>& x, const std::vector<float>& w,
                                       const std::vector<float>& dy, const Conv2dShape& s,
                                       uint32_t R, uint32_t col_sum_tile_rows) {
    s.validate();
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel;
    const uint32_t M = s.batch * Ho * Wo, KC = k * k * s.cin;
    Conv2dGradResult g;
    g.db = col_sum_reference(dy, M, s.cout, col_sum_tile_rows);
    g.dw = matmul_reference(conv2d_im2col_reference(x, s), M, KC, true, dy, M, s.cout, false,
                            Precision::Bf16, R);
    const std::vector<float> dcol =
        matmul_reference(dy, M, s.cout, false, w, KC, s.cout, true, Precision::Bf16, R);
    g.dx.assign(size_t(s.batch) * s.height * s.width * s.cin, 0.0f);
    for (uint32_t kh = 0; kh < k; ++kh)
        for (uint32_t kw = 0; kw < k; ++kw)
            for (uint32_t n = 0; n < s.batch; ++n)
                for (uint32_t oy = 0; oy < Ho; ++oy)
                    for (uint32_t ox = 0; ox < Wo; ++ox) {
                        const int64_t r = int64_t(oy) * s.stride + kh - s.pad;
                        const int64_t c = int64_t(ox) * s.stride + kw - s.pad;
                        if (r < 0 || r >= s.height || c < 0 || c >= s.width) continue;
                        float* out = &g.dx[((size_t(n) * s.height + r) * s.width + c) * s.cin];
                        const float* in = &dcol[((size_t(n) * Ho + oy) * Wo + ox) * KC +
                                                (size_t(kh) * k + kw) * s.cin];
                        for (uint32_t ci = 0; ci < s.cin; ++ci) out[ci] = out[ci] + in[ci];
                    }
    return g;
}

}  // namespace tpu::driver
