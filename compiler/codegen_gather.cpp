// SPDX-License-Identifier: Apache-2.0
// Gather fusions on the device (compiler/README.md, "Gather fusions"): an embedding lookup is a
// DMA of whole table rows, addressed by ids the sequencer reads from scalar memory, as a TPU
// kernel reads prefetched ids from SMEM to address its row copies (Pallas's scalar prefetch,
// pltpu.PrefetchScalarGridSpec). The rows are copied exactly: no arithmetic touches them.
#include <bit>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"

namespace tpu::compiler::gen {

namespace {

/// Where the rows of a [rows, D] view of an array lie: row i starts at
/// (i / group) * group_stride + (i % group) * row_stride bytes; its D values are `runs` runs of
/// `run_bytes`, `run_stride` apart (T(8,128): a row is one 512-byte run per 128-lane chunk,
/// 4 KiB apart, 8 rows a band; untiled row-major: one run).
struct RowGeom {
    /// Rows of one tiled [S, D] matrix of an array of rank > 2 (its rows start a new band):
    /// row i is row i % seg of matrix i / seg, seg_stride bytes apart; 0: one matrix.
    int64_t seg = 0;
    uint64_t seg_stride = 0;
    int64_t group = 1;
    uint64_t group_stride = 0, row_stride = 0;
    uint64_t runs = 1, run_bytes = 0, run_stride = 0;
    std::string layout;
};

/// The row geometry of `s` (its last dim the row) in `l`, checked against physical_index for
/// every row and every value of the first row; nullopt when the layout is not of that form.
std::optional<RowGeom> row_geom(const Shape& s, const Layout& l, int64_t lanes, int64_t sublanes) {
    if (s.rank() < 1 || dtype_bytes(s.dtype) != 4) return std::nullopt;
    const int64_t D = s.dims.back(), rows = s.elements() / std::max<int64_t>(D, 1);
    const auto index = [&](int64_t row, int64_t d) {
        std::vector<int64_t> idx(size_t(s.rank()));
        idx.back() = d;
        for (size_t k = idx.size() - 1; k-- > 0;) {
            idx[k] = row % s.dims[k];
            row /= s.dims[k];
        }
        return physical_index(s, l, idx) * 4;
    };
    RowGeom g;
    g.layout = l.to_string();
    const bool tiled = !l.tile.empty();
    if (tiled) {
        if (l.tile != std::vector<int64_t>{sublanes, lanes}) return std::nullopt;
        g.group = sublanes;
        g.run_bytes = uint64_t(lanes) * 4;
        g.runs = uint64_t((D + lanes - 1) / lanes);
        g.run_stride = uint64_t(sublanes * lanes) * 4;
        g.row_stride = g.run_bytes;
        g.group_stride = g.runs * g.run_stride;
    } else {
        g.run_bytes = uint64_t(D) * 4;
        g.group_stride = g.row_stride = g.run_stride = g.run_bytes;
    }
    for (int64_t d = 0; d < D; ++d) {
        const uint64_t want =
            tiled ? uint64_t(d / lanes) * g.run_stride + uint64_t(d % lanes) * 4 : uint64_t(d) * 4;
        if (index(0, d) != want) return std::nullopt;
    }
    if (tiled && s.rank() > 2 && s.dims[s.rank() - 2] % g.group != 0) {
        g.seg = s.dims[s.rank() - 2];
        g.seg_stride = uint64_t((g.seg + g.group - 1) / g.group) * g.group_stride;
    }
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = g.seg ? i % g.seg : i;
        const uint64_t base = g.seg ? uint64_t(i / g.seg) * g.seg_stride : 0;
        if (index(i, 0) !=
            base + uint64_t(r / g.group) * g.group_stride + uint64_t(r % g.group) * g.row_stride)
            return std::nullopt;
    }
    return g;
}

bool is_reshape(const Graph& g, OpId id) {
    return g.op(id).kind == OpKind::Reshape;
}

}  // namespace

struct GatherFusion {
    std::string name;
    const FusionValue* table = nullptr;
    const FusionValue* ids = nullptr;
    const FusionValue* out = nullptr;
    int64_t V = 0;      ///< table rows
    int64_t n = 0;      ///< rows gathered
    RowGeom tg, og;     ///< the table's and the result's rows
    uint64_t vrow = 0;  ///< bytes of a row in VMEM: whole lane chunks (tiled) or D values
    /// The VMEM row's runs as the table's (and the result's) DMA moves them: VMEM stride
    uint64_t load_vstride = 0, store_vstride = 0;
    uint32_t chunk = 0;       ///< rows per chunk: ids in scalar memory, rows in a VMEM slot
    uint64_t ids_offset = 0;  ///< the first id's element in the ids' buffer
};

std::shared_ptr<const GatherFusion> plan_gather_fusion(const Graph& g, const Fusion& f,
                                                       const hw::BoardConfig& board) {
    OpId gather = kNoOp;
    for (OpId id : f.ops)
        if (op_class(g.op(id).kind) == OpClass::Gather) {
            if (gather != kNoOp) not_generated(f, "a fusion of several gathers");
            gather = id;
        }
    if (gather == kNoOp) return nullptr;
    const Op& op = g.op(gather);
    for (OpId id : f.ops)
        if (id != gather && !is_reshape(g, id) && g.op(id).kind != OpKind::Slice)
            not_generated(f, fmt::format("a gather fused with a {}", op_name(g.op(id).kind)));
    if (f.results.size() != 1) not_generated(f, "a gather fusion with several results");
    auto p = std::make_shared<GatherFusion>();
    p->name = f.name;
    // The table is a fusion operand; the ids reach the gather through reshapes and slices,
    // and the result leaves it through reshapes.
    const auto operand = [&](ValueId v) -> const FusionValue* {
        while (inside_fusion(f, g, v)) v = g.producer(v).operands[0];
        for (const FusionValue& fv : f.operands)
            if (fv.value == v) return &fv;
        return nullptr;
    };
    if (inside_fusion(f, g, op.operands[0])) not_generated(f, "a gather of a computed table");
    p->table = operand(op.operands[0]);
    p->ids = operand(op.operands[1]);
    p->out = &f.results[0];
    {
        ValueId v = p->out->value;
        while (v != op.results[0] && inside_fusion(f, g, v) && is_reshape(g, g.value(v).producer))
            v = g.producer(v).operands[0];
        if (v != op.results[0])
            not_generated(f, "a gather fusion whose result is not the gather's");
    }
    if (!p->table || !p->ids) not_generated(f, "a gather whose operands are not the fusion's");
    const Shape& ts = p->table->shape;
    if (ts.rank() != 2 || dtype_bytes(ts.dtype) != 4)
        not_generated(f, fmt::format("a gather from a {} table", ts.to_string()));
    p->V = ts.dims[0];
    const int64_t D = ts.dims[1];
    p->n = p->ids->shape.elements();
    if (p->out->shape.dims.back() != D || p->out->shape.elements() != p->n * D)
        not_generated(f, fmt::format("a gather viewed as {}", p->out->shape.to_string()));
    const int64_t lanes = board.core.vpu_lanes, sublanes = board.core.vpu_sublanes;
    const auto tg = row_geom(ts, p->table->layout, lanes, sublanes);
    const auto og = row_geom(p->out->shape, p->out->layout, lanes, sublanes);
    if (!tg || !og)
        not_generated(f, fmt::format("a gather from a table in {} into {} (rows must be runs of "
                                     "lane chunks)",
                                     p->table->layout.to_string(), p->out->layout.to_string()));
    p->tg = *tg;
    p->og = *og;
    // The ids are read in order from where they lie: id i of the gather, followed back
    // through the reshapes (which keep the logical order) and slices (which move the index),
    // must be element ids_offset + i of the operand's buffer (a row-major range).
    {
        std::vector<ValueId> chain;
        for (ValueId v = op.operands[1]; inside_fusion(f, g, v); v = g.producer(v).operands[0])
            chain.push_back(v);
        std::vector<int64_t> idx;
        const Shape& is = p->ids->shape;
        for (int64_t i = 0; i < p->n; ++i) {
            int64_t lin = i;  // the row-major index in the shape of the value in the chain
            for (ValueId v : chain) {
                const Op& c = g.producer(v);
                if (c.kind != OpKind::Slice) continue;  // a reshape keeps the index
                unravel(lin, g.shape(v).dims, idx);
                for (size_t k = 0; k < idx.size(); ++k) idx[k] += c.attrs.dims[k];
                lin = row_major_index(idx, g.shape(c.operands[0]).dims);
            }
            unravel(lin, is.dims, idx);
            const uint64_t at = physical_index(is, p->ids->layout, idx);
            if (i == 0) p->ids_offset = at;
            if (at != p->ids_offset + uint64_t(i))
                not_generated(f, fmt::format("gather ids {} in {} read out of order",
                                             is.to_string(), p->ids->layout.to_string()));
        }
    }
    // A row in VMEM: whole lane chunks when either side is tiled (each chunk a DMA run of the
    // tiled side; an untiled side's one run is the same contiguous bytes), else the D values.
    const uint64_t chunk_bytes = uint64_t(lanes) * 4;
    const bool chunks = p->tg.group > 1 || p->og.group > 1;
    p->vrow = chunks ? uint64_t((D + lanes - 1) / lanes) * chunk_bytes : uint64_t(D) * 4;
    p->load_vstride = p->tg.group > 1 ? chunk_bytes : p->tg.run_bytes;
    p->store_vstride = p->og.group > 1 ? chunk_bytes : p->og.run_bytes;
    // Rows per chunk: two VMEM slots in a quarter of VMEM, at most 1024 ids (4 KiB) in scalar
    // memory (which also holds the program's argument table).
    const uint64_t by_vmem = std::max<uint64_t>(1, board.core.vmem_bytes / 4 / (2 * p->vrow));
    p->chunk = uint32_t(
        std::min<uint64_t>({uint64_t(p->n), by_vmem, 1024, board.core.smem_bytes / 4 / 4}));
    if (p->n == 0 || p->chunk == 0) not_generated(f, "an empty gather");
    return p;
}

void emit_gather_fusion(isa::Builder& b, const GatherFusion& p, const LoadFn& load) {
    const isa::Reg table = b.reg("table"), out = b.reg("out"), ids = b.reg("ids");
    load(table, p.table->buffer);
    load(out, p.out->buffer);
    load(ids, p.ids->buffer);
    const isa::Smem id_words = b.smem("ids", p.chunk);
    const uint64_t slot_bytes = uint64_t(p.chunk) * p.vrow;
    const isa::Vmem slots = b.vmem("rows", 2 * slot_bytes);
    const isa::Reg slot = b.reg("slot"), row = b.reg("row"), t = b.reg("t"), a = b.reg("a"),
                   v = b.reg("v"), w = b.reg("w"), first = b.reg("first");
    const isa::Reg seg_row = b.reg("seg_row"), seg_base = b.reg("seg_base");
    isa::CountedFlag idf(b, "ids", isa::Count::InRegister);
    isa::CountedFlag loads(b, "loads", isa::Count::InRegister);
    isa::CountedFlag stores(b, "stores", isa::Count::InRegister);
    b.emit(Opcode::Li, {slot, imm(int64_t(slots.addr()))});
    b.emit(Opcode::Li, {first, imm(0)});
    // The address of row `r` (a register) of geometry `geo` from `base`, into `dst`.
    const auto row_addr = [&](const isa::Reg& dst, const isa::Reg& r0, const isa::Reg& base,
                              const RowGeom& geo) {
        const isa::Reg& r = geo.seg ? seg_row : r0;
        if (geo.seg) {
            // Matrix r0 / seg, row r0 % seg of it.
            b.emit(Opcode::Divu, {seg_base, r0, imm(geo.seg)});
            b.emit(Opcode::Mul, {seg_row, seg_base, imm(geo.seg)});
            b.emit(Opcode::Sub, {seg_row, r0, seg_row});
            b.emit(Opcode::Mul, {seg_base, seg_base, imm(int64_t(geo.seg_stride))});
        }
        if (geo.group == 1) {
            b.emit(Opcode::Mul, {dst, r, imm(int64_t(geo.group_stride))});
        } else {
            const int shift = std::countr_zero(uint64_t(geo.group));
            b.emit(Opcode::Shr, {dst, r, imm(shift)});
            b.emit(Opcode::Mul, {dst, dst, imm(int64_t(geo.group_stride))});
            b.emit(Opcode::And, {w, r, imm(geo.group - 1)});
            b.emit(Opcode::Mul, {w, w, imm(int64_t(geo.row_stride))});
            b.emit(Opcode::Add, {dst, dst, w});
        }
        b.emit(Opcode::Add, {dst, dst, base});
        if (geo.seg) b.emit(Opcode::Add, {dst, dst, seg_base});
    };
    // One chunk of `count` rows from row `first` into the slot at `slot`: its ids into scalar
    // memory, each row's DMA from the table, then (once the previous chunk's stores, which read
    // the other slot, are done) each row's DMA to the result. The previous chunk's stores run
    // beside this chunk's loads.
    const auto emit_chunk = [&](uint32_t count) {
        b.emit(Opcode::Shl, {a, first, imm(2)});
        b.emit(Opcode::Add, {a, a, ids});
        if (p.ids_offset) b.emit(Opcode::Add, {a, a, imm(int64_t(p.ids_offset) * 4)});
        idf.issue(Opcode::DmaHs, {id_words.word(0), a + 0, imm(1), imm(int64_t(count) * 4),
                                  imm(int64_t(count) * 4), imm(int64_t(count) * 4)});
        idf.wait_all();
        b.emit(Opcode::Li, {v, slot});
        b.loop(row, imm(0), imm(count), 1, [&] {
            b.emit(Opcode::Shl, {a, row, imm(2)});
            b.emit(Opcode::Lw, {t, a + int64_t(id_words.addr())});
            // XLA's gather clamps an index outside the table to the nearest row.
            const isa::Label in_range = b.label("in_range");
            b.emit(Opcode::Bltu, {t, imm(p.V), in_range});
            b.emit(Opcode::Slt, {t, t, imm(0)});
            b.emit(Opcode::Sub, {t, imm(1), t});
            b.emit(Opcode::Mul, {t, t, imm(p.V - 1)});
            b.bind(in_range);
            row_addr(a, t, table, p.tg);
            loads.issue(Opcode::DmaHv,
                        {v + 0, a + 0, imm(int64_t(p.tg.runs)), imm(int64_t(p.tg.run_bytes)),
                         imm(int64_t(p.load_vstride)), imm(int64_t(p.tg.run_stride))});
            b.emit(Opcode::Add, {v, v, imm(int64_t(p.vrow))});
        });
        loads.wait_all();
        stores.wait_all();
        b.emit(Opcode::Li, {v, slot});
        b.loop(row, imm(0), imm(count), 1, [&] {
            b.emit(Opcode::Add, {t, first, row});
            row_addr(a, t, out, p.og);
            stores.issue(Opcode::DmaVh,
                         {a + 0, v + 0, imm(int64_t(p.og.runs)), imm(int64_t(p.og.run_bytes)),
                          imm(int64_t(p.og.run_stride)), imm(int64_t(p.store_vstride))});
            b.emit(Opcode::Add, {v, v, imm(int64_t(p.vrow))});
        });
        b.emit(Opcode::Add, {first, first, imm(count)});
        b.emit(Opcode::Xor, {slot, slot, imm(int64_t(slots.addr() ^ (slots.addr() + slot_bytes)))});
    };
    const int64_t full = p.n / p.chunk, tail = p.n % p.chunk;
    if (full > 1) {
        const isa::Reg c = b.reg("chunk");
        b.loop(c, imm(0), imm(full), 1, [&] { emit_chunk(p.chunk); });
    } else if (full == 1) {
        emit_chunk(p.chunk);
    }
    if (tail) emit_chunk(uint32_t(tail));
    stores.wait_all();
}

}  // namespace tpu::compiler::gen
