// SPDX-License-Identifier: Apache-2.0
#include "driver/kernels/conv2d.h"

#include <algorithm>
#include <array>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "driver/kernels/kernel.h"
#include "driver/kernels/launch_group.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"
#include "hw/board.h"
#include "hw/core/mxu_model.h"
#include "hw/core/numerics.h"
#include "isa/builder.h"
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
/// Most images of the epilogue lag (Conv2dTiling::lag): each adds the unrolled epilogue of a
/// pending image to both step bodies.
constexpr uint32_t kMaxLag = 16;
/// Most pieces of an epilogue (Conv2dTiling::epilogue_pieces): each is unrolled once.
constexpr uint32_t kMaxEpiloguePieces = 8;
/// Most deferred epilogues per step (Geometry::defer): each is unrolled in both step bodies.
constexpr uint32_t kMaxDeferred = 4;
/// Most pieces of the kernel's first X block waited for apart (Conv2dGen::first_pieces): all
/// but the last take a flag of their own or slot 1's.
constexpr uint32_t kFirstPieces = 4;

/// Derived sizes of one core's kernel.
struct Geometry {
    uint32_t k, s, Ho, Wo, qmax, hb, hin, G, runs, run_rows, S, nbands, nm;
    uint32_t P;         // Cout tiles per group (Conv2dTiling::cout_split)
    uint32_t groups;    // groups of a block: NT / P
    uint64_t mxu_rows;  // rows one MXU streams per step (the busiest MXU)
    uint32_t xslots;    // X slots: 2 (the next block loads during this one), 1 if one block
    uint32_t npl;       // planes of an image: phases^2 x CT
    // Epilogues of the previous group run per step of the next one (0: all in a group's last
    // step): a group's stores then spread over the next group instead of stalling the
    // sequencer on a full DMA queue in the last step. ceil(G / S), when at most kMaxDeferred.
    uint32_t defer;
    uint32_t K;        // channels of a plane pixel, rows of a loaded weight tile
    uint64_t pix;      // bytes of one input pixel of one Cin tile (K bf16)
    uint64_t plane_h;  // HBM bytes of one (phase, Cin tile) plane
    uint64_t plane_v;  // VMEM bytes of a block's part of one plane (hin rows)
    uint64_t xv_img, yv_img, x_img_h;
    // VMEM map: two X slots, two Y slots, two W slots, the bias, the epilogue's side tiles.
    uint64_t vx, vy, vw, vb, vs, vend;
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
    g.P = std::max(1u, t.cout_split);
    g.groups = t.NT / g.P;
    // Sharing a tile, the MXUs take the runs in turn; each with its own tile, all of them.
    g.nm = g.P > 1 ? g.P : std::min(t.mxus, g.G * g.runs);
    g.defer = g.S >= 2 && ceil_div(g.G, g.S) <= kMaxDeferred ? ceil_div(g.G, g.S) : 0;
    g.mxu_rows = uint64_t(g.P > 1 ? g.G * g.runs : ceil_div(g.G * g.runs, g.nm)) * g.run_rows;
    g.K = conv2d_pixel_channels(s, t.R);
    g.pix = uint64_t(g.K) * 2;
    g.plane_h = uint64_t(t.Hq) * t.Wq * g.pix;
    g.plane_v = uint64_t(g.hin) * t.Wq * g.pix;
    g.npl = t.phases * t.phases * t.CT;
    g.xv_img = uint64_t(g.npl) * g.plane_v;
    g.x_img_h = uint64_t(t.phases) * t.phases * t.CT * g.plane_h;
    g.yv_img = uint64_t(g.hb) * g.Wo * t.C * 4;
    // The launch's blocks argument is conv2d_blocks of the key, so a kernel of one block never
    // loads a next one.
    g.xslots = t.block_images && t.images / t.block_images * g.nbands == 1 ? 1 : 2;
    g.vx = 0;
    g.vy = g.vx + g.xslots * g.G * g.xv_img;
    g.vw = g.vy + 2 * g.G * g.P * g.yv_img;
    g.vb = g.vw + 2 * uint64_t(g.P) * t.R * t.C * 2;
    g.vs = g.vb + uint64_t(t.NT) * t.C * 4;
    g.vend = g.vs + uint64_t(t.column_sides) * t.C * 4 + uint64_t(t.full_sides) * g.yv_img;
    return g;
}

}  // namespace

Conv2dTapRange conv2d_tap_range(const Conv2dShape& s, uint32_t kh, uint32_t kw) {
    auto span = [&](uint32_t size, uint32_t out, uint32_t kpos, uint32_t& first, uint32_t& n) {
        first = s.pad > kpos ? (s.pad - kpos + s.stride - 1) / s.stride : 0;
        const int64_t hi = int64_t(size) - 1 + s.pad - kpos;
        const uint32_t end = hi < 0 ? 0 : std::min<uint32_t>(out, uint32_t(hi / s.stride) + 1);
        n = end > first ? end - first : 0;
    };
    Conv2dTapRange r;
    span(s.height, s.out_height(), kh, r.y0, r.ny);
    span(s.width, s.out_width(), kw, r.x0, r.nx);
    return r;
}

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

uint32_t conv2d_lag(const hw::BoardConfig& cfg, const Conv2dShape& s, const Conv2dTiling& t) {
    const Geometry g = geometry(s, t);
    const uint64_t need =
        hw::MxuTimer::mm_cycles(t.R, t.C, 0) + uint64_t(cfg.core.queue_depth) * g.run_rows;
    uint32_t lag = 1;
    // The MXU that takes the fewest of L images' runs (run p goes to MXU p % nm; with a tile
    // per MXU each takes them all).
    const uint32_t share = g.P > 1 ? 1 : g.nm;
    // Each lagging image's epilogue is unrolled three more times (both step bodies and the
    // kernel's end): at most a quarter of the block's, so that a program of composed kernels
    // grows by no more than that.
    const uint32_t most = std::max(1u, std::min(g.G / 4, kMaxLag));
    while (lag < most && uint64_t(lag) * g.runs / share * g.run_rows < need) ++lag;
    return lag;
}

namespace {
/// Whether a kernel may store its output in pieces (Conv2dTiling::epilogue_pieces): one block,
/// one group and one image of several runs on at most two MXUs sharing the tile.
bool takes_epilogue_pieces(const Geometry& g) {
    return g.xslots == 1 && g.groups == 1 && g.G == 1 && g.P == 1 && g.nm <= 2 && g.runs >= 2;
}
}  // namespace

uint32_t conv2d_epilogue_pieces(const hw::BoardConfig& cfg, const Conv2dShape& s,
                                const Conv2dTiling& t) {
    const Geometry g = geometry(s, t);
    if (!takes_epilogue_pieces(g)) return 1;
    // As conv2d_lag: the runs that keep the MXUs busy for the array's latency and a full queue.
    const uint64_t need =
        hw::MxuTimer::mm_cycles(t.R, t.C, 0) + uint64_t(cfg.core.queue_depth) * g.run_rows;
    const uint64_t lag_runs = (need * g.nm + g.run_rows - 1) / g.run_rows;
    return uint32_t(std::clamp<uint64_t>(g.runs / lag_runs, 1, kMaxEpiloguePieces));
}

uint64_t conv2d_mxu_cycles(const hw::BoardConfig& cfg, const Conv2dShape& s,
                           const Conv2dTiling& t) {
    const Geometry g = geometry(s, t);
    const uint64_t steps = uint64_t(conv2d_blocks(s, t)) * g.groups * g.S;
    return steps * hw::MxuTimer::swap_step_cycles(t.R, t.C, cfg.core.mxu_swap_drains, g.mxu_rows);
}

Conv2dTiling plan_conv2d(const hw::BoardConfig& cfg, const Conv2dShape& s, uint32_t images,
                         uint32_t column_sides, uint32_t full_sides) {
    s.validate();
    Conv2dTiling base;
    base.column_sides = column_sides;
    base.full_sides = full_sides;
    base.R = cfg.core.mxu_rows;
    base.C = cfg.core.mxu_cols;
    base.CT = ceil_div(s.cin, base.R);
    base.NT = ceil_div(s.cout, base.C);
    base.phases = std::min(s.stride, s.kernel);
    const uint32_t qmax = (s.kernel - 1) / s.stride;
    base.Hq = s.out_height() + qmax;
    base.Wq = s.out_width() + qmax;
    base.images = images;
    // Every MXU of the core: each takes its share of a block's runs through the loaded tile.
    base.mxus = cfg.core.mxus;
    auto fits = [&](Conv2dTiling t) {
        const Geometry g = geometry(s, t);
        return g.vend <= cfg.core.vmem_bytes && uint64_t(g.G) * g.runs * g.P <= kMaxRunsPerStep;
    };
    auto with_lag = [&](Conv2dTiling t) {
        t.lag = conv2d_lag(cfg, s, t);
        t.epilogue_pieces = conv2d_epilogue_pieces(cfg, s, t);
        return t;
    };
    const uint32_t Ho = s.out_height();
    base.band_rows = Ho;
    base.block_images = 1;
    auto plan = [&](Conv2dTiling b) -> std::optional<Conv2dTiling> {
        if (fits(b)) {
            // Every image of a block streams through each loaded weight tile, so the drain of a
            // tile swap is paid once per block: take the largest block that divides the images.
            for (uint32_t G = std::min(images, kMaxBlockImages); G >= 1; --G) {
                Conv2dTiling t = b;
                t.block_images = G;
                if (images % G == 0 && fits(t)) return with_lag(t);
            }
        }
        for (uint32_t hb = Ho; hb >= 1; --hb) {
            Conv2dTiling t = b;
            t.band_rows = hb;
            if (Ho % hb == 0 && fits(t)) return with_lag(t);
        }
        return std::nullopt;
    };
    const std::optional<Conv2dTiling> shared = plan(base);
    if (!shared)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("conv2d: one output row of {} pixels with {} input channels "
                                      "does not fit in {} bytes of VMEM (core.vmem_bytes)",
                                      s.out_width(), s.cin, cfg.core.vmem_bytes));
    // A weight tile per MXU: each MXU swaps tiles 1 / mxus as often, but a block's Y holds
    // mxus Cout tiles of every image, so blocks may get smaller. Only full tiles that divide
    // among the MXUs (a group's row bytes are then the same for every tile).
    if (base.mxus > 1 && base.NT % base.mxus == 0 && s.cout % base.C == 0) {
        Conv2dTiling b = base;
        b.cout_split = base.mxus;
        const std::optional<Conv2dTiling> split = plan(b);
        if (split && conv2d_mxu_cycles(cfg, s, *split) < conv2d_mxu_cycles(cfg, s, *shared))
            return *split;
    }
    return *shared;
}

size_t hash_value(const Conv2dKey& k) {
    const Conv2dShape& s = k.shape;
    const Conv2dTiling& t = k.tiling;
    return hash_fields(s.batch, s.height, s.width, s.cin, s.cout, s.kernel, s.stride, s.pad, t.R,
                       t.C, t.CT, t.NT, t.phases, t.Hq, t.Wq, t.band_rows, t.images, t.block_images,
                       t.mxus, t.cout_split, t.column_sides, t.full_sides, t.lag, t.epilogue_pieces,
                       k.store_bf16);
}

uint32_t conv2d_pixel_channels(const Conv2dShape& s, uint32_t R) {
    return std::min(s.cin, R);
}

uint64_t conv2d_packed_x_bytes(const Conv2dShape& s, const Conv2dTiling& t) {
    return uint64_t(s.batch) * t.phases * t.phases * t.CT * t.Hq * t.Wq *
           conv2d_pixel_channels(s, t.R) * 2;
}

uint32_t conv2d_blocks(const Conv2dShape& s, const Conv2dTiling& t) {
    return t.images / t.block_images * (s.out_height() / t.band_rows);
}

namespace {

using isa::imm;
using isa::Opcode;

/// VMEM areas are placed at the next multiple of this: every area of the kernel is a multiple
/// of it for any MXU of at least 4 x 4, so they lie back to back as geometry() counts them.
constexpr uint64_t kConvAlign = 16;

/// A flag and the register counting the instructions issued on it, for the kernel's MXU and X
/// transfers: their last issue in program order is waited for at the top of the next step or
/// block (a loop-carried wait CountedFlag's build-order check cannot see), or not at all when
/// the kernel has no next step (the issue is skipped at run time).
struct Tally {
    isa::Flag flag;
    isa::Reg count;
};

/// Most MXUs the kernel drives (a weight-load and a matmul flag each; CoreConfig's maximum).
constexpr uint32_t kConvMaxMxus = 8;

/// The registers of one image's epilogue (finish): its Y tile, its HBM address, the matmul
/// counts per MXU that complete it, the row bytes of its Cout tile, its Y slot and its bias.
/// With more than two MXUs the counts are not held: `ahead` says how many flagged matmuls past
/// each MXU's count complete the image, and finish computes the targets in mm0.
struct ImageRegs {
    isa::Reg y, dst, mm0, mm1, row_bytes, slot, bias;
    explicit ImageRegs(isa::Builder& b)
        : y(b.reg("image.y", 11)),
          dst(b.reg("image.dst", 12)),
          mm0(b.reg("image.mm0", 13)),
          mm1(b.reg("image.mm1", 14)),
          row_bytes(b.reg("image.row_bytes", 15)),
          slot(b.reg("image.slot", 16)),
          bias(b.reg("image.bias", 17)) {}
    const isa::Reg& mm(uint32_t m) const { return m ? mm1 : mm0; }
    std::array<int64_t, kConvMaxMxus> ahead{};
};

/// The implicit-GEMM kernel (driver/README.md, "Convolution"). Registers and flags keep the
/// numbering of the text kernel it replaced as hints: s6 block, s7 Cout tile, s8 step of the
/// group, s9 step overall, s10 the tap's LHS base, s11-s18 temporaries, s19 accumulate, s20 X
/// slot, s21 Y slot, s22/s23 weight loads (f2/f3) and s24/s25 flagged matmuls (f4/f5) per MXU,
/// s26/s27 W tiles into slot 0/1 (f1/f8), s28/s29 X blocks into slot 0/1 (f9/f10), s30/s31 Y
/// stores from slot 0/1 (f11/f12); f6 VPU (its count in scalar memory), f13 the bias.
class Conv2dGen {
    using enum isa::Opcode;

public:
    Conv2dGen(isa::Builder& b, const Conv2dKey& key, const Conv2dOperands& ops, const Epilogue& ep)
        : m_b(b),
          m_sh(key.shape),
          m_t(key.tiling),
          m_g(geometry(key.shape, key.tiling)),
          m_ops(ops),
          m_ep(ep),
          e(key.store_bf16 ? 2 : 4) {}

    void emit() {
        const Conv2dTiling& t = m_t;
        const auto scope = m_b.scope("conv2d");
        NT = t.NT;
        P = m_g.P;
        S = m_g.S;
        G = m_g.G;
        nm = m_g.nm;
        wtile = uint64_t(t.R) * t.C * 2;
        y_pix_h = uint64_t(m_sh.cout) * e;
        y_img_h = uint64_t(m_g.Ho) * m_g.Wo * y_pix_h;
        y_rows = m_g.hb * m_g.Wo;
        L = t.lag;
        if (L < 1 || L > G)
            throw m_b.error(
                fmt::format("conv2d: the epilogue lag {} is not within 1..{} images", L, G));
        if (P > 1 && (P != t.mxus || NT % P != 0 || m_sh.cout % t.C != 0))
            throw m_b.error(fmt::format(
                "conv2d: a Cout tile per MXU needs cout_split = mxus ({}, {}) dividing the {} "
                "Cout tiles, all full (cout {}, tile {})",
                P, t.mxus, NT, m_sh.cout, t.C));
        // Scalar memory: the VPU ops issued; the current group's HBM output base, row bytes, Y
        // slot and bias address; the images whose epilogues wait for the next step (pending).
        m_vpu_count = m_b.smem("vpu.count", 1);
        m_group = m_b.smem("group", kGroupWords);
        m_pend = m_b.smem("pending", 1 + uint64_t(L) * kEntryWords);
        if (m_g.defer) m_defer = m_b.smem("deferred", kDeferWords);
        // VMEM: two X slots of a block's planes, two Y slots of its outputs, two W slots, the
        // bias (geometry(), which the planner checks against VMEM).
        m_vx = m_b.vmem("x", m_g.xslots * G * m_g.xv_img, kConvAlign);
        m_vy = m_b.vmem("y", 2 * G * P * m_g.yv_img, kConvAlign);
        m_vw = m_b.vmem("w", 2 * P * wtile, kConvAlign);
        m_vb = m_b.vmem("bias", uint64_t(NT) * t.C * 4, kConvAlign);
        if (t.column_sides)
            m_vcol = m_b.vmem("epilogue.columns", uint64_t(t.column_sides) * t.C * 4, kConvAlign);
        if (t.full_sides)
            m_vfull = m_b.vmem("epilogue.full", uint64_t(t.full_sides) * m_g.yv_img, kConvAlign);

        m_block = m_b.reg("block", 6);
        m_nt = m_b.reg("cout_tile", 7);
        m_step = m_b.reg("step", 8);
        m_step_all = m_b.reg("step_all", 9);
        m_lhs = m_b.reg("lhs", 10);
        m_acc = m_b.reg("accumulate", 19);
        m_x_at = m_b.reg("x_slot", 20);
        m_y_at = m_b.reg("y_slot", 21);
        m_vpu = m_b.flag("vpu", 6);
        // Scalar memory keeps its words across launches.
        E(Sw, {imm(0), m_vpu_count.word(0)});
        E(Sw, {imm(0), m_pend.word(kPend)});
        if (m_g.defer) E(Sw, {imm(G), m_defer.word(kDNext)});  // nothing deferred yet
        if (!m_ep.sides.empty()) {
            // The side tiles' loads, counted in scalar memory (no register is left).
            m_side_count = m_b.smem("sides.count", 1);
            m_sides = m_b.flag("epilogue.sides", 14);
            E(Sw, {imm(0), m_side_count.word(0)});
        }
        // Per-slot counts: a banked HBM can finish a DMA before one issued earlier, so only a
        // count of one slot's transfers proves that slot complete.
        // Every MXU loads each weight tile, and takes the runs in turn (run p on MXU p % nm):
        // up to two MXUs count their loads and flagged matmuls in a register each (the text
        // kernel's); more share one per class of MXUs with the same counts (cls), so the
        // kernel holds four count registers for any number of MXUs.
        m_per_mxu = nm <= 2;
        if (t.epilogue_pieces == 0 || (t.epilogue_pieces > 1 && !takes_epilogue_pieces(m_g)))
            throw m_b.error(fmt::format(
                "conv2d: {} epilogue pieces need a kernel of one block, one group and one image "
                "of several runs on at most two MXUs sharing the tile",
                t.epilogue_pieces));
        for (int m = 0; m < 2; ++m) m_lw[m] = tally(fmt::format("lw{}", m), 2 + m, 22 + m);
        for (int m = 0; m < 2; ++m) m_mm[m] = tally(fmt::format("mm{}", m), 4 + m, 24 + m);
        for (uint32_t m = 2; m < nm; ++m) {
            m_lwf[m] = m_b.flag(fmt::format("lw{}", m));
            m_mmf[m] = m_b.flag(fmt::format("mm{}", m));
        }
        m_wload[0].emplace(m_b, "w.loads0", isa::Count::InRegister, 1, 26);
        m_wload[1].emplace(m_b, "w.loads1", isa::Count::InRegister, 8, 27);
        for (int i = 0; i < 2; ++i) m_xload[i] = tally(fmt::format("x.loads{}", i), 9 + i, 28 + i);
        for (uint32_t j = 1; j + 1 < first_pieces(); ++j)
            m_pieces[j - 1] = m_b.flag(fmt::format("x.piece{}", j));
        m_ystore[0].emplace(m_b, "y.stores0", isa::Count::InRegister, 11, 30);
        m_ystore[1].emplace(m_b, "y.stores1", isa::Count::InRegister, 12, 31);
        isa::CountedFlag bias_in(m_b, "bias.loads", isa::Count::AtBuild, 13);

        // Prologue: the bias, the first two weight tiles (ahead of the X block in the in-order
        // DMA queue: the first matmul needs both), the first X block, the first lw.
        const isa::Arg nb = imm(int64_t(NT) * t.C * 4);
        bias_in.issue(DmaHv, {m_vb, m_ops.bias.value, imm(1), nb, nb, nb});
        E(Li, {m_step_all, imm(0)});
        w_prefetch(0);
        w_prefetch(1);
        E(Li, {m_block, imm(0)});
        if (first_pieces())
            x_load_first();
        else
            x_load(m_block);
        w_load(0);
        bias_in.wait_all();

        const isa::Label block = m_b.label("block"), group = m_b.label("group");
        m_b.bind(block);
        {
            const isa::Reg parity = m_b.reg("parity", 11);
            E(And, {parity, m_block, imm(1)});
            E(Mul, {m_x_at, parity, imm(int64_t(G * m_g.xv_img))});
            E(Add, {m_x_at, m_x_at, m_vx});
        }
        E(Li, {m_nt, imm(0)});
        m_b.bind(group);
        group_setup();
        if (m_g.defer) {
            // Deferred epilogues: only the kernel's final group ends in the last-step body
            // (its images have no next group to be finished in); every other group's steps
            // are plain, and its images are finished during the next group's steps.
            const isa::Label kstep = m_b.label("kstep"), plain = m_b.label("plain_group"),
                             next = m_b.label("group_done");
            m_b.bind(kstep);
            step(false);
            {
                const isa::Reg lim = m_b.reg("steps", 11), t = m_b.reg("final", 12);
                E(Li, {lim, imm(S)});
                E(Add, {t, m_block, imm(1)});
                E(Bne, {t, blocks(), plain});
                E(Bne, {m_nt, imm(NT - P), plain});
                E(Li, {lim, imm(S - 1)});
                m_b.bind(plain);
                E(Bltu, {m_step, lim, kstep});
            }
            const isa::Label final_group = m_b.label("final_group");
            E(Bne, {m_step, imm(S), final_group});
            defer_group();
            E(Jmp, {next});
            m_b.bind(final_group);
            step(true);
            m_b.bind(next);
        } else {
            if (S > 1) {
                const isa::Label kstep = m_b.label("kstep");
                m_b.bind(kstep);
                step(false);
                E(Bltu, {m_step, imm(S - 1), kstep});
            }
            step(true);
        }
        E(Add, {m_nt, m_nt, imm(P)});
        E(Bltu, {m_nt, imm(NT), group});
        E(Add, {m_block, m_block, imm(1)});
        E(Blt, {m_block, blocks(), block});
        flush_all();
        m_ystore[0]->wait_all();
        m_ystore[1]->wait_all();
    }

private:
    /// Words of the `group` scalar-memory area.
    enum GroupWord : uint64_t { kYDst, kYBytes, kYSlot, kYBias, kGroupWords };
    /// Words of the `pending` area: the flag (images wait), then per pending image its
    /// ImageRegs (entry j at word 1 + j kEntryWords).
    enum PendWord : uint64_t { kPend };
    enum EntryWord : uint64_t { kPY, kPD, kPC0, kPC1, kPBytes, kPSlot, kPBias, kEntryWords };
    /// Words of the `deferred` area: the group whose epilogues run in the next group's steps
    /// (its Y slot address, HBM output base, row bytes, slot parity, bias) and its next image.
    enum DeferWord : uint64_t { kDY, kDDst, kDBytes, kDSlot, kDBias, kDNext, kDeferWords };
    isa::Arg pend(uint32_t j, EntryWord w) const { return m_pend.word(1 + j * kEntryWords + w); }
    /// Flagged matmuls per MXU of the first `images` images of a block's step (run p on MXU
    /// p % nm); in a group's last step every matmul is flagged.
    std::array<int64_t, kConvMaxMxus> runs_upto(uint32_t images) const {
        std::array<int64_t, kConvMaxMxus> c{};
        for (uint32_t p = 0; p < images * m_g.runs; ++p) {
            if (P > 1)
                for (uint32_t m = 0; m < nm; ++m) ++c[m];  // every MXU takes every run
            else
                ++c[p % nm];
        }
        return c;
    }

    void E(Opcode op, std::initializer_list<isa::Arg> args) { m_b.emit(op, args); }
    isa::Arg blocks() const { return m_ops.blocks.value; }
    /// MXU m's count class: itself (per MXU), else 0 for the MXUs that take one more run of a
    /// block than the others (m < G runs % nm), 1 for the others.
    uint32_t cls(uint32_t m) const {
        if (m_per_mxu) return m;
        if (P > 1) return 0;  // a tile each: every MXU takes every run
        return m < (G * m_g.runs) % nm ? 0 : 1;
    }
    /// The first MXU of its class: where a class count advances once for the class.
    bool cls_first(uint32_t m) const { return m == 0 || cls(m) != cls(m - 1); }
    const isa::Flag& lw_flag(uint32_t m) const { return m < 2 ? m_lw[m].flag : m_lwf[m]; }
    const isa::Flag& mm_flag(uint32_t m) const { return m < 2 ? m_mm[m].flag : m_mmf[m]; }
    const isa::Reg& lw_count(uint32_t m) const { return m_lw[cls(m)].count; }
    const isa::Reg& mm_count(uint32_t m) const { return m_mm[cls(m)].count; }

    Tally tally(const std::string& name, int flag, int reg) {
        Tally c{m_b.flag(name, flag), m_b.reg(name + ".count", reg)};
        E(Li, {c.count, imm(0)});
        return c;
    }
    /// `op args..., flag` and one more in the count.
    void issue(const Tally& c, Opcode op, std::initializer_list<isa::Arg> args) {
        std::vector<isa::Arg> all(args);
        all.push_back(c.flag);
        m_b.emit(op, all);
        E(Add, {c.count, c.count, imm(1)});
    }
    /// Runs `f(slot)` for the slot in `reg` (0 or 1): flags are per slot (Tally above).
    void by_slot(const isa::Reg& reg, const std::function<void(int)>& f) {
        m_b.if_(
            isa::Cond::Eq, reg, imm(0), [&] { f(0); }, [&] { f(1); });
    }

    /// Planes q0 .. q1 - 1 of the block at HBM `src` (whole images) into the X slot at `at`
    /// (+ the X area), on flag `f` (and one more in `count` per DMA, if given). In VMEM a block
    /// is plane-major, plane q of image i at (q G + i) plane bytes: a plane of every image is
    /// contiguous, so the first block's first planes can arrive (and be waited for) before the
    /// others. One DMA of G planes per plane, in a loop; one image's planes are contiguous in
    /// both, one DMA.
    void x_planes(const isa::Flag& f, const isa::Reg* count, const isa::Reg& at,
                  const isa::Reg& src, uint32_t q0, uint32_t q1) {
        const Geometry& g = m_g;
        auto dma = [&](std::initializer_list<isa::Arg> args) {
            std::vector<isa::Arg> all(args);
            all.push_back(f);
            m_b.emit(DmaHv, all);
            if (count) E(Add, {*count, *count, imm(1)});
        };
        if (G == 1) {
            const isa::Arg n = imm(int64_t((q1 - q0) * g.plane_h));
            dma({at + int64_t(m_vx.addr() + q0 * g.plane_v), src + int64_t(q0 * g.plane_h), imm(1),
                 n, n, n});
            return;
        }
        const isa::Reg d = m_b.reg("x.dst", 15), s = m_b.reg("x.from", 16);
        E(Add, {d, at, imm(int64_t(m_vx.addr() + uint64_t(q0) * G * g.plane_v))});
        E(Add, {s, src, imm(int64_t(q0 * g.plane_h))});
        auto one = [&] {
            dma({d, s, imm(G), imm(int64_t(g.plane_h)), imm(int64_t(g.plane_h)),
                 imm(int64_t(g.x_img_h))});
        };
        if (q1 - q0 == 1) {
            one();
            return;
        }
        const isa::Reg q = m_b.reg("x.plane", 14);
        E(Li, {q, imm(q1 - q0)});
        const isa::Label loop = m_b.label("x_plane");
        m_b.bind(loop);
        one();
        E(Add, {d, d, imm(int64_t(G * g.plane_v))});
        E(Add, {s, s, imm(int64_t(g.plane_h))});
        E(Add, {q, q, imm(-1)});
        E(Bne, {q, imm(0), loop});
    }
    void x_planes(const Tally& c, const isa::Reg& at, const isa::Reg& src, uint32_t q0,
                  uint32_t q1) {
        x_planes(c.flag, &c.count, at, src, q0, q1);
    }

    /// Pieces of the first block (whole images of several planes) waited for apart: its first
    /// min(CT, kFirstPieces) - 1 planes one each (at least one), which steps 0, 1, ... read
    /// first (tap (0, 0), Cin tile j), then the others, which the next step waits for.
    uint32_t first_pieces() const {
        if (m_g.nbands != 1 || m_g.npl < 2) return 0;
        return std::min(m_g.npl, std::max(2u, std::min(m_t.CT, kFirstPieces)));
    }
    /// Flag of piece j: the first on slot 1's (no other transfer is on it before the first
    /// step waits), the middle ones on their own, the last on slot 0's.
    const isa::Flag& piece_flag(uint32_t j) const {
        if (j == 0) return m_xload[1].flag;
        if (j + 1 == first_pieces()) return m_xload[0].flag;
        return m_pieces[j - 1];
    }
    /// Piece j of the first block (x_load_first): plane j, the last piece every plane from j.
    void x_piece(uint32_t j) {
        const isa::Reg src = m_b.reg("x.src", 11), at = m_b.reg("x.at", 13);
        E(Li, {at, imm(0)});
        E(Li, {src, imm(0)});
        E(Add, {src, src, m_ops.x.value});
        const uint32_t np = first_pieces();
        if (j == 0)
            x_planes(m_xload[1], at, src, 0, 1);
        else if (j + 1 < np)
            x_planes(piece_flag(j), nullptr, at, src, j, j + 1);
        else
            x_planes(m_xload[0], at, src, np - 1, m_g.npl);
    }
    /// The prologue's pieces: the first two; piece j + 2 follows step j's weight prefetch
    /// (step), so the in-order DMA queue never holds a weight tile behind the rest of the block.
    void x_load_first() {
        x_piece(0);
        x_piece(1);
    }

    /// Plane `step` of the block in register `blk` (whole images) into the X slot (blk & 1).
    void x_load_plane(const isa::Reg& blk) {
        const Geometry& g = m_g;
        const isa::Reg src = m_b.reg("x.src", 11), parity = m_b.reg("x.parity", 12),
                       at = m_b.reg("x.at", 13);
        E(Mul, {src, blk, imm(int64_t(G * g.x_img_h))});
        E(Mul, {at, m_step, imm(int64_t(g.plane_h))});
        E(Add, {src, src, at});
        E(Add, {src, src, m_ops.x.value});
        E(And, {parity, blk, imm(1)});
        E(Mul, {at, parity, imm(int64_t(G * g.xv_img))});
        E(Add, {at, at, m_vx});
        {
            const isa::Reg q = m_b.reg("x.plane", 14);
            E(Mul, {q, m_step, imm(int64_t(G * g.plane_v))});
            E(Add, {at, at, q});
        }
        by_slot(parity, [&](int slot) {
            issue(m_xload[slot], DmaHv,
                  {at, src, imm(G), imm(int64_t(g.plane_h)), imm(int64_t(g.plane_h)),
                   imm(int64_t(g.x_img_h))});
        });
    }

    /// The X block in register `blk` into the X slot (blk & 1).
    void x_load(const isa::Reg& blk) {
        const Geometry& g = m_g;
        const isa::Reg src = m_b.reg("x.src", 11), parity = m_b.reg("x.parity", 12),
                       at = m_b.reg("x.at", 13);
        if (g.nbands == 1) {
            E(Mul, {src, blk, imm(int64_t(G * g.x_img_h))});
        } else {
            E(Divu, {src, blk, imm(g.nbands)});
            E(Mul, {src, src, imm(int64_t(g.x_img_h))});
            E(Remu, {parity, blk, imm(g.nbands)});
            E(Mul, {parity, parity, imm(int64_t(uint64_t(g.hb) * m_t.Wq * g.pix))});
            E(Add, {src, src, parity});
        }
        E(Add, {src, src, m_ops.x.value});
        E(And, {parity, blk, imm(1)});
        E(Mul, {at, parity, imm(int64_t(G * g.xv_img))});
        by_slot(parity, [&](int slot) {
            if (g.nbands == 1) {  // whole images, plane-major
                x_planes(m_xload[slot], at, src, 0, g.npl);
            } else {  // a band: hin rows of every plane
                issue(m_xload[slot], DmaHv,
                      {at + int64_t(m_vx.addr()), src, imm(m_t.phases * m_t.phases * m_t.CT),
                       imm(int64_t(g.plane_v)), imm(int64_t(g.plane_v)), imm(int64_t(g.plane_h))});
            }
        });
    }

    /// The epilogue of one image (`rows` = y_rows) or of a piece of its rows (epilogue_pieces):
    /// its side tiles loaded while its last matmuls run, the bias added on the VPU once they are
    /// done, the caller's epilogue, then the store (NHWC rows of the tile's channels).
    void finish(ImageRegs& r, uint32_t rows) {
        if (!m_ep.sides.empty() && P == 1) load_sides(r, rows);
        for (uint32_t m = 0; m < nm; ++m) {
            if (m_per_mxu) {
                E(Wait, {mm_flag(m), r.mm(m)});
            } else if (r.ahead[m]) {
                E(Add, {r.mm0, mm_count(m), imm(r.ahead[m])});
                E(Wait, {mm_flag(m), r.mm0});
            } else {
                E(Wait, {mm_flag(m), mm_count(m)});
            }
        }
        if (P == 1) {
            finish_tile(r, rows);
            return;
        }
        // A Cout tile per MXU: the image's P tiles (all full) one after another, in a loop
        // whose body is the epilogue of one tile, so the program grows by no more than that.
        // The matmul targets are spent: mm0 counts the tiles left.
        const isa::Label tiles = m_b.label("tiles");
        E(Li, {r.mm0, imm(P)});
        m_b.bind(tiles);
        if (!m_ep.sides.empty()) load_sides(r, rows);
        finish_tile(r, rows);
        E(Add, {r.y, r.y, imm(int64_t(m_g.yv_img))});
        E(Add, {r.dst, r.dst, imm(int64_t(m_t.C) * e)});
        E(Add, {r.bias, r.bias, imm(int64_t(m_t.C) * 4)});
        E(Add, {r.mm0, r.mm0, imm(-1)});
        E(Bne, {r.mm0, imm(0), tiles});
    }

    /// The epilogue of one Cout tile of an image whose matmuls are done: bias, the caller's
    /// epilogue, the store.
    void finish_tile(ImageRegs& r, uint32_t rows) {
        E(VAddRow, {r.y, r.y, r.bias, imm(rows), imm(m_t.C), m_vpu});
        int64_t ops = 1;
        auto counted = [&](Opcode op, std::initializer_list<isa::Arg> args) {
            std::vector<isa::Arg> all(args);
            all.push_back(m_vpu);
            m_b.emit(op, all);
            ++ops;
        };
        if (!m_ep.sides.empty()) {
            const isa::Reg n = m_b.reg("sides.issued", 18);
            E(Lw, {n, m_side_count.word(0)});
            E(Wait, {m_sides, n});
        }
        if (m_ep.body) {
            // The matmul counts are spent: their register holds the tile's rows.
            r.mm1.release();
            const isa::Reg nrows = m_b.reg("epilogue.rows", 14);
            E(Li, {nrows, imm(rows)});
            std::vector<isa::Arg> sides;
            uint32_t ci = 0, fi = 0;
            for (const EpilogueSide& sd : m_ep.sides)
                sides.push_back(sd.kind == EpilogueSide::Kind::Column
                                    ? m_vcol.at(uint64_t(ci++) * m_t.C * 4)
                                    : m_vfull.at(uint64_t(fi++) * m_g.yv_img));
            EpilogueTile tile(m_b, r.y, std::move(sides), nrows, m_t.C, counted);
            m_ep.body(tile);
        }
        // In place: value i's bf16 lands below fp32 value i, which has been read.
        if (m_ep.store_bf16) counted(VF2Bf, {r.y, r.y, imm(int64_t(rows) * m_t.C)});
        {
            const isa::Reg n = m_b.reg("vpu.issued", 18);
            E(Lw, {n, m_vpu_count.word(0)});
            E(Add, {n, n, imm(ops)});
            E(Sw, {n, m_vpu_count.word(0)});
            E(Wait, {m_vpu, n});
        }
        by_slot(r.slot, [&](int slot) {
            if (NT == 1 && m_sh.cout == m_t.C) {  // the tile is the whole pixel: one run
                const isa::Arg n = imm(int64_t(uint64_t(rows) * m_t.C * e));
                m_ystore[slot]->issue(DmaVh, {r.dst, r.y, imm(1), n, n, n});
            } else {
                m_ystore[slot]->issue(DmaVh, {r.dst, r.y, imm(rows), r.row_bytes,
                                              imm(int64_t(y_pix_h)), imm(m_t.C * e)});
            }
        });
    }

    /// Issues the loads of the image's side tiles (its Cout tile's columns of each Column side,
    /// its pixels of each Full side) on the sides flag.
    void load_sides(const ImageRegs& r, uint32_t rows) {
        const isa::Reg at = m_b.reg("side.at", 18);
        // Bytes of the tile's fp32 row: the row bytes of Y (bf16: half of them).
        if (e == 2) E(Add, {r.row_bytes, r.row_bytes, r.row_bytes});
        uint32_t ci = 0, fi = 0;
        for (const EpilogueSide& sd : m_ep.sides) {
            const Opcode op = sd.place.kind == streaming::Operand::Kind::Vmem ? DmaVv : DmaHv;
            if (sd.kind == EpilogueSide::Kind::Column) {
                // The Cout tile's columns: bias address - bias base = nt C 4.
                E(Add, {at, r.bias, imm(-int64_t(m_vb.addr()))});
                E(Add, {at, at, sd.place.value});
                E(op, {m_vcol.at(uint64_t(ci++) * m_t.C * 4), at, imm(1), r.row_bytes, r.row_bytes,
                       r.row_bytes, m_sides});
            } else {
                // The image's pixels: Y's offset, in fp32.
                E(Sub, {at, r.dst, m_ops.y.value});
                if (e == 2) E(Add, {at, at, at});
                E(Add, {at, at, sd.place.value});
                E(op, {m_vfull.at(uint64_t(fi++) * m_g.yv_img), at, imm(rows), r.row_bytes,
                       imm(m_t.C * 4), imm(int64_t(m_sh.cout) * 4), m_sides});
            }
        }
        if (e == 2) E(Shr, {r.row_bytes, r.row_bytes, imm(1)});
        E(Lw, {at, m_side_count.word(0)});
        E(Add, {at, at, imm(int64_t(m_ep.sides.size()))});
        E(Sw, {at, m_side_count.word(0)});
    }

    /// The epilogue of pending image j (image G - L + j of the last step), if images wait;
    /// the last one clears the flag.
    void flush_pending(uint32_t j) {
        const isa::Label none = m_b.label("no_pending");
        ImageRegs r(m_b);
        E(Lw, {r.y, m_pend.word(kPend)});
        E(Beq, {r.y, imm(0), none});
        E(Lw, {r.y, pend(j, kPY)});
        E(Lw, {r.dst, pend(j, kPD)});
        if (m_per_mxu) {
            E(Lw, {r.mm0, pend(j, kPC0)});
            E(Lw, {r.mm1, pend(j, kPC1)});
        } else {
            // More than two MXUs: no step has added to the counts since the image's, so its
            // targets are the counts less the matmuls its step queued after it.
            const auto upto = runs_upto(G - L + j + 1), all = runs_upto(G);
            for (uint32_t m = 0; m < nm; ++m) r.ahead[m] = upto[m] - all[m];
        }
        E(Lw, {r.row_bytes, pend(j, kPBytes)});
        E(Lw, {r.slot, pend(j, kPSlot)});
        E(Lw, {r.bias, pend(j, kPBias)});
        finish(r, y_rows);
        if (j + 1 == L) E(Sw, {imm(0), m_pend.word(kPend)});
        m_b.bind(none);
    }
    /// A group whose last step was plain: its images' epilogues are deferred (DeferWord).
    void defer_group() {
        const isa::Reg t = m_b.reg("defer.word", 11);
        E(Sw, {m_y_at, m_defer.word(kDY)});
        for (const auto& [from, to] : {std::pair{kYDst, kDDst}, std::pair{kYBytes, kDBytes},
                                       std::pair{kYSlot, kDSlot}, std::pair{kYBias, kDBias}}) {
            E(Lw, {t, m_group.word(from)});
            E(Sw, {t, m_defer.word(to)});
        }
        E(Sw, {imm(0), m_defer.word(kDNext)});
    }
    /// The epilogue of the deferred group's next image, if one is left. Placed after the lag's
    /// images of a step: every matmul of the steps before it is done or nearly, and the MXUs
    /// still have the lag's work queued while it waits for them.
    void defer_finish() {
        const isa::Label none = m_b.label("no_deferred");
        ImageRegs r(m_b);
        E(Lw, {r.slot, m_defer.word(kDNext)});
        E(Bge, {r.slot, imm(G), none});
        E(Add, {r.y, r.slot, imm(1)});
        E(Sw, {r.y, m_defer.word(kDNext)});
        E(Mul, {r.dst, r.slot, imm(int64_t(uint64_t(y_rows) * y_pix_h))});
        E(Lw, {r.y, m_defer.word(kDDst)});
        E(Add, {r.dst, r.dst, r.y});
        E(Mul, {r.y, r.slot, imm(int64_t(uint64_t(P) * m_g.yv_img))});
        E(Lw, {r.bias, m_defer.word(kDY)});
        E(Add, {r.y, r.y, r.bias});
        // The counts so far: the deferred group's matmuls all came before this step's.
        if (m_per_mxu) {
            E(Add, {r.mm0, m_mm[0].count, imm(0)});
            E(Add, {r.mm1, m_mm[1].count, imm(0)});
        }
        E(Lw, {r.row_bytes, m_defer.word(kDBytes)});
        E(Lw, {r.slot, m_defer.word(kDSlot)});
        E(Lw, {r.bias, m_defer.word(kDBias)});
        finish(r, y_rows);
        m_b.bind(none);
    }

    /// Runs of an epilogue piece (Conv2dTiling::epilogue_pieces) and the pieces they make.
    uint32_t piece_runs() const { return ceil_div(m_g.runs, m_t.epilogue_pieces); }
    uint32_t epilogue_pieces() const { return ceil_div(m_g.runs, piece_runs()); }
    /// The epilogue of piece q of the kernel's one image: runs [q pr, (q + 1) pr) of its last
    /// step, every one flagged.
    void finish_piece(uint32_t q) {
        const uint32_t pr = piece_runs(), r0 = q * pr, r1 = std::min(m_g.runs, r0 + pr);
        std::array<int64_t, kConvMaxMxus> cnt{};
        for (uint32_t p = 0; p < r1; ++p) ++cnt[p % nm];
        ImageRegs r(m_b);
        image_regs(r, 0, cnt);
        E(Add, {r.y, r.y, imm(int64_t(uint64_t(r0) * m_g.run_rows * m_t.C * 4))});
        E(Add, {r.dst, r.dst, imm(int64_t(uint64_t(r0) * m_g.run_rows * y_pix_h))});
        finish(r, (r1 - r0) * m_g.run_rows);
    }

    /// Every pending image's epilogue (the kernel's end).
    void flush_all() {
        for (uint32_t j = 0; j < L; ++j) flush_pending(j);
    }

    /// Fills `r` for image `img` of the current group; `cnt` = its mm counts per MXU past the
    /// counters.
    void image_regs(ImageRegs& r, uint32_t img, const std::array<int64_t, kConvMaxMxus>& cnt) {
        E(Add, {r.y, m_y_at, imm(int64_t(img * P * m_g.yv_img))});
        E(Lw, {r.dst, m_group.word(kYDst)});
        E(Add, {r.dst, r.dst, imm(int64_t(uint64_t(img) * y_rows * y_pix_h))});
        if (m_per_mxu) {
            E(Add, {r.mm0, m_mm[0].count, imm(cnt[0])});
            E(Add, {r.mm1, m_mm[1].count, imm(cnt[1])});
        } else {
            r.ahead = cnt;
        }
        E(Lw, {r.row_bytes, m_group.word(kYBytes)});
        E(Lw, {r.slot, m_group.word(kYSlot)});
        E(Lw, {r.bias, m_group.word(kYBias)});
    }

    /// Weight tile of step step_all + `ahead` (the tile index wraps per block) into its slot,
    /// unless the kernel has no such step. The slot was last read by the lw of step
    /// step_all + ahead - 2.
    void w_prefetch(int ahead) {
        const isa::Label none = m_b.label("no_prefetch");
        const isa::Reg next = m_b.reg("w.step", 11), end = m_b.reg("w.end", 12),
                       src = m_b.reg("w.src", 13), parity = m_b.reg("w.parity", 14);
        E(Add, {next, m_step_all, imm(ahead)});
        E(Mul, {end, blocks(), imm(m_g.groups * S)});
        E(Bge, {next, end, none});
        E(Remu, {src, next, imm(m_g.groups * S)});
        if (P > 1) {
            // Group j's step i: tiles (j P + m) S + i for its P MXUs, S tiles apart.
            E(Divu, {end, src, imm(S)});
            E(Mul, {end, end, imm(int64_t(P - 1) * S)});
            E(Add, {src, src, end});
        }
        E(Mul, {src, src, imm(int64_t(wtile))});
        E(Add, {src, src, m_ops.w.value});
        E(And, {parity, next, imm(1)});
        by_slot(parity, [&](int slot) {
            const isa::Arg n = imm(int64_t(wtile));
            if (P == 1)
                m_wload[slot]->issue(DmaHv, {m_vw.at(slot * wtile), src, imm(1), n, n, n});
            else
                m_wload[slot]->issue(
                    DmaHv, {m_vw.at(slot * P * wtile), src, imm(P), n, n, imm(int64_t(wtile) * S)});
        });
        m_b.bind(none);
    }

    /// The lw of step step_all + `ahead` into every MXU's shadow weights, once its tile is in.
    void w_load(int ahead) {
        const isa::Label none = m_b.label("no_lw");
        const isa::Reg next = m_b.reg("w.step", 11), end = m_b.reg("w.end", 12),
                       at = m_b.reg("w.at", 14);
        E(Add, {next, m_step_all, imm(ahead)});
        E(Mul, {end, blocks(), imm(m_g.groups * S)});
        E(Bge, {next, end, none});
        E(And, {at, next, imm(1)});
        by_slot(at, [&](int slot) { m_wload[slot]->wait_all(); });
        E(Mul, {at, at, imm(int64_t(P * wtile))});
        for (uint32_t m = 0; m < nm; ++m) {
            // Sharing a tile every MXU loads it; else MXU m its own (slot tile m).
            const isa::Arg w = at + int64_t(m_vw.addr() + (P > 1 ? m * wtile : 0));
            if (m_per_mxu) {
                issue(m_lw[m], MxuLw, {imm(m), w, imm(m_g.K), imm(m_t.C)});
            } else {
                E(MxuLw, {imm(m), w, imm(m_g.K), imm(m_t.C), lw_flag(m)});
                if (cls_first(m)) E(Add, {lw_count(m), lw_count(m), imm(1)});
            }
        }
        m_b.bind(none);
    }

    /// Per group (block, Cout tile): its Y slot (group index block NT + nt, parity), HBM output
    /// base, row bytes and bias, in scalar memory.
    void group_setup() {
        const Geometry& g = m_g;
        const isa::Reg parity = m_b.reg("group.parity", 11), dst = m_b.reg("group.dst", 12),
                       col = m_b.reg("group.col", 13), bytes = m_b.reg("group.row_bytes", 14);
        E(Mul, {parity, m_block, imm(NT)});
        E(Add, {parity, parity, m_nt});
        if (P > 1) E(Divu, {parity, parity, imm(P)});  // the group's index
        E(And, {parity, parity, imm(1)});
        E(Sw, {parity, m_group.word(kYSlot)});
        E(Mul, {m_y_at, parity, imm(int64_t(G * P * g.yv_img))});
        E(Add, {m_y_at, m_y_at, m_vy});
        if (g.nbands == 1) {
            E(Mul, {dst, m_block, imm(int64_t(G * y_img_h))});
        } else {
            E(Divu, {dst, m_block, imm(g.nbands)});
            E(Mul, {dst, dst, imm(int64_t(y_img_h))});
            E(Remu, {col, m_block, imm(g.nbands)});
            E(Mul, {col, col, imm(int64_t(uint64_t(y_rows) * y_pix_h))});
            E(Add, {dst, dst, col});
        }
        E(Add, {dst, dst, m_ops.y.value});
        E(Mul, {col, m_nt, imm(m_t.C * e)});
        E(Add, {dst, dst, col});
        E(Sw, {dst, m_group.word(kYDst)});
        E(Li, {bytes, imm(m_t.C * e)});
        m_b.if_(isa::Cond::Eq, m_nt, imm(NT - P), [&] {
            E(Li, {bytes, imm((m_sh.cout - (NT - 1) * m_t.C) * e)});
        });
        E(Sw, {bytes, m_group.word(kYBytes)});
        if (e != 4) E(Mul, {col, m_nt, imm(m_t.C * 4)});  // the bias is fp32
        E(Add, {col, col, m_vb});
        E(Sw, {col, m_group.word(kYBias)});
        E(Li, {m_step, imm(0)});
    }

    /// The tap's LHS base into lhs: plane (phase (kh % s, kw % s), ct), shifted by (kh / s,
    /// kw / s) pixels.
    void lhs_base() {
        const Geometry& g = m_g;
        const isa::Reg tap = m_b.reg("tap", 11), ct = m_b.reg("ct", 12), kh = m_b.reg("kh", 13),
                       kw = m_b.reg("kw", 14), plane = m_b.reg("plane", 15),
                       pcol = m_b.reg("phase_col", 16);
        E(Divu, {tap, m_step, imm(m_t.CT)});
        E(Remu, {ct, m_step, imm(m_t.CT)});
        E(Divu, {kh, tap, imm(g.k)});
        E(Remu, {kw, tap, imm(g.k)});
        E(Remu, {plane, kh, imm(g.s)});  // phase row
        E(Mul, {plane, plane, imm(m_t.phases)});
        E(Remu, {pcol, kw, imm(g.s)});  // phase column
        E(Add, {plane, plane, pcol});
        E(Mul, {plane, plane, imm(m_t.CT)});
        E(Add, {plane, plane, ct});
        E(Mul, {plane, plane, imm(int64_t(G * g.plane_v))});  // plane-major (x_planes)
        E(Divu, {kh, kh, imm(g.s)});
        E(Mul, {kh, kh, imm(m_t.Wq)});
        E(Divu, {kw, kw, imm(g.s)});
        E(Add, {kh, kh, kw});
        E(Mul, {kh, kh, imm(int64_t(g.pix))});
        E(Add, {m_lhs, plane, kh});
        E(Add, {m_lhs, m_lhs, m_x_at});
    }

    /// One K step: tap (kh, kw) and Cin tile ct of step `step`, Cout tile nt. (1) prefetch the
    /// weight tile two steps ahead, so it is not queued behind the stores of a group's images in
    /// the in-order DMA queue; (2) stream every run of every image of the block through the
    /// loaded tile, then queue the next step's lw at once (the matmul after an lw swaps the new
    /// tile in, so the lw cannot go earlier; the R-cycle load hides in the array's drain).
    /// `last` (the group's last step) flags every matmul and stores each image as soon as the
    /// next one is queued, so stores overlap the matmuls; the last image's epilogue waits until
    /// the next step has queued its first image (pending), so the MXUs never run dry.
    void step(bool last) {
        const Geometry& g = m_g;
        // (1) This step's lw was issued in the previous step; once it is done its slot takes
        // the tile after next.
        for (uint32_t m = 0; m < nm; ++m) E(Wait, {lw_flag(m), lw_count(m)});
        w_prefetch(2);
        if (const uint32_t np = first_pieces(); np > 2) {
            const isa::Label none = m_b.label("no_piece");
            E(Bne, {m_block, imm(0), none});
            E(Bne, {m_nt, imm(0), none});
            for (uint32_t j = 0; j + 2 < np; ++j) {
                const isa::Label nj = m_b.label("not_piece");
                E(Bne, {m_step, imm(j), nj});
                x_piece(j + 2);
                E(Jmp, {none});
                m_b.bind(nj);
            }
            m_b.bind(none);
        }
        // A group's first step waits until its Y slot is stored; a block's first, for its X.
        {
            const isa::Label ok = m_b.label("inputs_ok");
            const isa::Reg parity = m_b.reg("parity", 11);
            if (const uint32_t np = first_pieces()) {
                // The first block's first steps: piece j before step j (x_load_first).
                const isa::Label done = m_b.label("pieces_done");
                E(Bne, {m_block, imm(0), done});
                E(Bne, {m_nt, imm(0), done});
                for (uint32_t j = 0; j < np; ++j) {
                    const isa::Label nj = m_b.label("not_piece");
                    E(Bne, {m_step, imm(j), nj});
                    if (j + 1 == np)
                        E(Wait, {m_xload[0].flag, m_xload[0].count});
                    else
                        E(Wait, {piece_flag(j), imm(1)});
                    E(Jmp, {done});
                    m_b.bind(nj);
                }
                m_b.bind(done);
            }
            E(Bne, {m_step, imm(0), ok});
            E(Lw, {parity, m_group.word(kYSlot)});
            by_slot(parity, [&](int slot) { m_ystore[slot]->wait_all(); });
            E(Bne, {m_nt, imm(0), ok});
            if (first_pieces()) E(Beq, {m_block, imm(0), ok});  // its pieces, above
            E(And, {parity, m_block, imm(1)});
            by_slot(parity, [&](int slot) { E(Wait, {m_xload[slot].flag, m_xload[slot].count}); });
            m_b.bind(ok);
        }
        // (2)
        lhs_base();
        E(Sltu, {m_acc, imm(0), m_step});
        std::array<int64_t, kConvMaxMxus> cnt{};
        for (uint32_t img = 0; img < G; ++img) {
            for (uint32_t r = 0; r < g.runs; ++r) {
                const uint32_t p = img * g.runs + r;
                const isa::Arg x = m_lhs + int64_t(img * g.plane_v + uint64_t(r) * m_t.Wq * g.pix);
                // Sharing a tile, run p goes to MXU p % nm; with a tile each, to every MXU,
                // into its tile's part of the image's Y.
                for (uint32_t m = P > 1 ? 0 : p % nm; m < (P > 1 ? nm : p % nm + 1); ++m) {
                    const bool flag = last || (P > 1 ? p + 1 == G * g.runs : p + nm >= G * g.runs);
                    if (flag) ++cnt[m];
                    const isa::Arg y =
                        m_y_at + int64_t((uint64_t(img) * P + (P > 1 ? m : 0)) * g.yv_img +
                                         uint64_t(r) * g.run_rows * m_t.C * 4);
                    if (flag)
                        E(MxuMm, {imm(m), y, x, imm(g.run_rows), m_acc, mm_flag(m)});
                    else
                        E(MxuMm, {imm(m), y, x, imm(g.run_rows), m_acc});
                }
                if (p + 1 == G * g.runs) w_load(1);
                // Pieces of the image's epilogue: piece q once the next piece's runs are
                // queued (the planner makes a piece enough MXU work to cover the wait).
                if (last && m_t.epilogue_pieces > 1)
                    for (uint32_t q = 0; q + 1 < epilogue_pieces(); ++q)
                        if (std::min(g.runs, (q + 2) * piece_runs()) - 1 == r) finish_piece(q);
            }
            if (last && m_t.epilogue_pieces > 1) finish_piece(epilogue_pieces() - 1);
            // Deferred: a pending image comes only from the final group, flushed at the end.
            if (img < L && !m_g.defer) flush_pending(img);
            // The deferred epilogues spread over the step from the lag on: an MXU queue holds
            // only queue_depth runs, fewer cycles than several epilogues take to issue.
            for (uint32_t d = 0; d < m_g.defer; ++d)
                if (img == std::min(G - 1, L - 1 + d * std::max(1u, (G - L) / m_g.defer)))
                    defer_finish();
            if (img + 1 == L) {
                // A block's first step: every matmul of the previous block is done (the last
                // pending image was its last; deferred, the waits say so), so the next block's
                // X may replace it. Whole images go one plane per step of the first group
                // (S >= planes): a whole block at once would hold the in-order DMA queue, and
                // the weight tiles prefetched behind it, for longer than two steps.
                const isa::Label nox = m_b.label("no_x");
                const isa::Reg next = m_b.reg("next_block", 18);
                E(Bne, {m_nt, imm(0), nox});
                E(Bge, {m_step, imm(g.nbands == 1 ? g.npl : 1), nox});
                E(Add, {next, m_block, imm(1)});
                E(Bge, {next, blocks(), nox});
                if (m_g.defer) {
                    const isa::Label waited = m_b.label("prev_block_done");
                    E(Bne, {m_step, imm(0), waited});
                    for (uint32_t m = 0; m < nm; ++m) E(Wait, {mm_flag(m), mm_count(m)});
                    m_b.bind(waited);
                }
                if (g.nbands == 1)
                    x_load_plane(next);
                else
                    x_load(next);
                m_b.bind(nox);
            }
            if (last && img >= L) {
                // L images later the MXUs are still busy when the epilogue waits for it.
                ImageRegs r(m_b);
                image_regs(r, img - L, runs_upto(img - L + 1));
                finish(r, y_rows);
            }
        }
        if (last && m_t.epilogue_pieces == 1) {
            for (uint32_t j = 0; j < L; ++j) {
                ImageRegs r(m_b);
                image_regs(r, G - L + j, runs_upto(G - L + j + 1));
                E(Sw, {r.y, pend(j, kPY)});
                E(Sw, {r.dst, pend(j, kPD)});
                if (m_per_mxu) {
                    E(Sw, {r.mm0, pend(j, kPC0)});
                    E(Sw, {r.mm1, pend(j, kPC1)});
                }
                E(Sw, {r.row_bytes, pend(j, kPBytes)});
                E(Sw, {r.slot, pend(j, kPSlot)});
                E(Sw, {r.bias, pend(j, kPBias)});
            }
            const isa::Reg one = m_b.reg("one", 18);
            E(Li, {one, imm(1)});
            E(Sw, {one, m_pend.word(kPend)});
        }
        for (uint32_t m = 0; m < nm; ++m)
            if (cls_first(m)) E(Add, {mm_count(m), mm_count(m), imm(cnt[m])});
        E(Add, {m_step, m_step, imm(1)});
        E(Add, {m_step_all, m_step_all, imm(1)});
    }

    isa::Builder& m_b;
    const Conv2dShape m_sh;
    const Conv2dTiling m_t;
    const Geometry m_g;
    const Conv2dOperands m_ops;
    const Epilogue& m_ep;
    const uint32_t e;  ///< bytes of one output value (4, or 2 with a bf16 store)
    uint32_t NT = 0, P = 1, S = 0, G = 0, nm = 0, y_rows = 0, L = 1;
    uint64_t wtile = 0, y_pix_h = 0, y_img_h = 0;
    isa::Smem m_vpu_count, m_group, m_pend, m_side_count, m_defer;
    isa::Vmem m_vx, m_vy, m_vw, m_vb, m_vcol, m_vfull;
    isa::Flag m_sides;
    isa::Reg m_block, m_nt, m_step, m_step_all, m_lhs, m_acc, m_x_at, m_y_at;
    isa::Flag m_vpu;
    std::array<Tally, 2> m_lw, m_mm, m_xload;
    std::array<isa::Flag, kConvMaxMxus> m_lwf, m_mmf;  ///< MXUs 2.. (0 and 1 in m_lw, m_mm)
    std::array<isa::Flag, kFirstPieces> m_pieces;      ///< first_pieces' middle pieces
    bool m_per_mxu = true;  ///< a count register per MXU, else per class (cls)
    std::array<std::optional<isa::CountedFlag>, 2> m_wload, m_ystore;
};

const std::array<streaming::Param, 5> kConvParams = {
    {{"x"}, {"w"}, {"bias"}, {"y"}, {"blocks", true}}};

}  // namespace

void emit_conv2d(isa::Builder& b, const Conv2dKey& key, const Conv2dOperands& ops,
                 const Epilogue& epilogue) {
    const streaming::Operand all[] = {ops.x, ops.w, ops.bias, ops.y, ops.blocks};
    streaming::check_operands("conv2d", kConvParams, all);
    for (const streaming::Operand* o : {&ops.x, &ops.w, &ops.bias, &ops.y})
        if (o->kind != streaming::Operand::Kind::Hbm)
            throw b.error("conv2d: x, w, bias and y must be in HBM (the kernel streams them)");
    const uint32_t cols = epilogue.count(EpilogueSide::Kind::Column);
    const uint32_t fulls = epilogue.count(EpilogueSide::Kind::Full);
    if (cols != key.tiling.column_sides || fulls != key.tiling.full_sides ||
        epilogue.store_bf16 != key.store_bf16)
        throw b.error(fmt::format(
            "conv2d: the epilogue has {} Column and {} Full sides and {} bf16 store; the key says "
            "{}, {} and {}",
            cols, fulls, epilogue.store_bf16 ? "a" : "no", key.tiling.column_sides,
            key.tiling.full_sides, key.store_bf16 ? "a" : "no"));
    for (const EpilogueSide& sd : epilogue.sides)
        if (sd.place.kind == streaming::Operand::Kind::Scalar)
            throw b.error("conv2d: an epilogue side must be a tensor, not a scalar");
    Conv2dGen(b, key, ops, epilogue).emit();
}

isa::Program generate(const Conv2dKey& key) {
    isa::Builder b(key.name());
    std::vector<isa::Reg> regs;
    if (key.tiling.column_sides || key.tiling.full_sides)
        throw b.error(
            "conv2d: a kernel with epilogue sides is emitted with its epilogue "
            "(emit_conv2d)");
    const auto ops = streaming::declare_args(b, kConvParams, regs);
    Epilogue ep;
    ep.store_bf16 = key.store_bf16;
    emit_conv2d(b, key, {ops[0], ops[1], ops[2], ops[3], ops[4]}, ep);
    b.emit(isa::Opcode::Halt, {});
    return b.finish();
}

namespace {

/// bf16 bits of x (round to nearest even).
uint16_t bf16(float x) {
    return hw::f32_to_bf16(x);
}

/// Whether any tap of `s` reads the image somewhere (else col2im has nothing to add).
bool any_tap_reaches(const Conv2dShape& s) {
    for (uint32_t t = 0; t < s.kernel * s.kernel; ++t) {
        const Conv2dTapRange r = conv2d_tap_range(s, t / s.kernel, t % s.kernel);
        if (r.ny && r.nx) return true;
    }
    return false;
}

std::string cores_text(const std::vector<uint32_t>& cores) {
    return fmt::format("[{}]", fmt::join(cores, ", "));
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
        const uint64_t x_bytes = conv2d_packed_x_bytes(s, t);
        const uint64_t w_bytes = uint64_t(t.NT) * s.kernel * s.kernel * t.CT * t.R * t.C * 2;
        for (uint32_t core : x.cores) {
            p.x.push_back(dev.alloc(x_bytes, core));
            p.w.push_back(dev.alloc(w_bytes, core));
        }
        std::vector<Event> evs;
        const uint64_t vmem = dev.config().core.vmem_bytes;
        const auto pack_x = plan_conv2d_aux(Conv2dAux::PackInput, s, t.R, t.C, 0, 0, 0, vmem);
        evs.push_back(launch(dev, cache, pack_x, x.cores, [&](size_t i, LaunchArgs& a) {
            a.set("x", x.bufs[i]).set("packed", p.x[i]);
        }));
        const auto pack_w = plan_conv2d_aux(Conv2dAux::PackWeight, s, t.R, t.C, 0, 0, 0, vmem);
        evs.push_back(launch(dev, cache, pack_w, x.cores, [&](size_t i, LaunchArgs& a) {
            a.set("w", w.bufs[i]).set("packed", p.w[i]);
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
    const isa::Program& prog = cache.get(Conv2dKey{s, t});
    return dev.launch_async(y.cores, prog, [&](size_t j) {
        LaunchArgs a(prog);
        a.set("x", p.x[j]).set("w", p.w[j]).set("bias", p.b[j]).set("y", y.bufs[j]);
        a.set("blocks", conv2d_blocks(s, t));
        return a.values();
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

/// The key of helper `kind` on this board, or none when not even one unit fits its VMEM
/// (conv2d_grad then uses the per-tap kernels).
std::optional<Conv2dAuxKey> plan_aux(const Device& dev, Conv2dAux kind, const Conv2dShape& s,
                                     uint32_t kh = 0, uint32_t kw = 0, uint64_t units = 0) {
    const hw::BoardConfig& cfg = dev.config();
    try {
        return plan_conv2d_aux(kind, s, cfg.core.mxu_rows, cfg.core.mxu_cols, kh, kw, units,
                               cfg.core.vmem_bytes);
    } catch (const DeviceError&) {
        return std::nullopt;
    }
}

/// Launches helper `k` over `a`'s core set with `a` and `b` (if given) as its operands.
Event run_aux(Device& dev, ProgramCache& cache, const Conv2dAuxKey& k, const Tensor& a,
              const Tensor* b = nullptr) {
    const auto params = conv2d_aux_params(k.kind);
    if (b && b->cores != a.cores)
        throw DeviceError(ErrorKind::Usage,
                          fmt::format("{}: tensors on different core sets ({} and {})", k.name(),
                                      cores_text(a.cores), cores_text(b->cores)));
    return launch(dev, cache, k, a.cores, [&](size_t i, LaunchArgs& args) {
        args.set(params[0].name, a.bufs[i]);
        if (b) args.set(params[1].name, b->bufs[i]);
    });
}

/// Launches helper `k`, which must fit VMEM (plan_conv2d_aux throws naming it otherwise).
Conv2dAuxKey must_plan(const Device& dev, Conv2dAux kind, const Conv2dShape& s, uint32_t kh = 0,
                       uint32_t kw = 0, uint64_t units = 0) {
    const hw::BoardConfig& cfg = dev.config();
    return plan_conv2d_aux(kind, s, cfg.core.mxu_rows, cfg.core.mxu_cols, kh, kw, units,
                           cfg.core.vmem_bytes);
}

/// t = +0.0 in place (Conv2dAux::Zero).
Event zero_tensor(Device& dev, ProgramCache& cache, const Tensor& t) {
    return run_aux(dev, cache, must_plan(dev, Conv2dAux::Zero, {}, 0, 0, t.elements()), t);
}

/// col = im2col(x) (N Ho Wo x k k Cin fp32) on x's cores: one row kernel (im2col_rows_spec)
/// when its staging fits VMEM, else one kernel per tap over zeroed padding.
std::vector<Event> im2col(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Tensor& x,
                          const Tensor& col) {
    if (const auto rows = plan_aux(dev, Conv2dAux::Im2colRows, s))
        return {run_aux(dev, cache, *rows, x, &col)};
    const uint32_t k = s.kernel;
    std::vector<Conv2dTapRange> taps;
    bool partial = false;
    for (uint32_t t = 0; t < k * k; ++t) {
        taps.push_back(conv2d_tap_range(s, t / k, t % k));
        partial |= taps.back().ny < s.out_height() || taps.back().nx < s.out_width();
    }
    std::vector<Event> evs;
    // Padding pixels are what no tap writes: zero them once.
    if (partial) evs.push_back(zero_tensor(dev, cache, col));
    for (uint32_t t = 0; t < k * k; ++t)
        if (taps[t].ny && taps[t].nx)
            evs.push_back(run_aux(dev, cache, must_plan(dev, Conv2dAux::Im2colTap, s, t / k, t % k),
                                  x, &col));
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
        const auto col2im =
            any_tap_reaches(s) ? plan_aux(dev, Conv2dAux::Col2imRows, s) : std::nullopt;
        if (col2im) {
            evs.push_back(run_aux(dev, cache, *col2im, dcol, &dx));
        } else {
            evs.push_back(zero_tensor(dev, cache, dx));
            for (uint32_t t = 0; t < k * k; ++t) {
                const Conv2dTapRange r = conv2d_tap_range(s, t / k, t % k);
                if (r.ny && r.nx)
                    evs.push_back(run_aux(dev, cache,
                                          must_plan(dev, Conv2dAux::Col2imTap, s, t / k, t % k),
                                          dcol, &dx));
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
    return conv2d_reference(x, w, bias, s, R, conv2d_folds_taps(s, R));
}

std::vector<float> conv2d_reference(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>& bias, const Conv2dShape& s,
                                    uint32_t R, bool fold_taps) {
    s.validate();
    const uint32_t Ho = s.out_height(), Wo = s.out_width(), k = s.kernel;
    const size_t M = size_t(s.batch) * Ho * Wo;
    std::vector<float> y(M * s.cout, 0.0f);
    if (fold_taps) {
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