// SPDX-License-Identifier: Apache-2.0
// Concatenation fusions on the device (compiler/README.md, "Concatenation fusions"): a
// concatenation roots a loop fusion of its own with the data movement its parts reach it
// through (fusion.cpp, try_fuse), so every value of its result is a value of one of the
// fusion's operands. The plan follows each result element back to the operand element it is,
// in both buffers' layouts, and gathers the runs where both sides are contiguous; runs of one
// length whose starts step by constant strides on both sides become one strided DMA into VMEM
// and one back out. No arithmetic touches the values: bit-exact by construction.
#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"

namespace tpu::compiler::gen {

namespace {

/// Bytes of one VMEM slot at most: a copy's loads into one slot run beside the previous copy's
/// stores from the other, so shorter copies overlap more of the transfer.
constexpr uint64_t kSlotBytes = uint64_t(64) << 10;

/// `count` runs of `bytes`: run i from src + i * src_stride of operand `operand` to
/// dst + i * dst_stride of the result.
struct CopyRuns {
    size_t operand = 0;
    uint64_t src = 0, dst = 0, bytes = 0, count = 1;
    uint64_t src_stride = 0, dst_stride = 0;
};

}  // namespace

struct ConcatFusion {
    std::string name;
    std::vector<const FusionValue*> operands;  ///< the operands the copies read
    const FusionValue* out = nullptr;
    std::vector<CopyRuns> copies;
    uint64_t slot_bytes = 0;  ///< one of two VMEM slots
};

std::shared_ptr<const ConcatFusion> plan_concat_fusion(const Graph& g, const Fusion& f,
                                                       const hw::BoardConfig& board) {
    bool concat = false;
    for (OpId id : f.ops) concat |= g.op(id).kind == OpKind::Concatenate;
    if (!concat) return nullptr;
    for (OpId id : f.ops) {
        const OpKind k = g.op(id).kind;
        if (k != OpKind::Concatenate && k != OpKind::Reshape && k != OpKind::Transpose &&
            k != OpKind::Broadcast && k != OpKind::Slice)
            not_generated(f, fmt::format("a concatenation fused with a {}", op_name(k)));
    }
    if (f.results.size() != 1) not_generated(f, "a concatenation fusion with several results");
    auto p = std::make_shared<ConcatFusion>();
    p->name = f.name;
    p->out = &f.results[0];
    const Shape& os = p->out->shape;
    const uint64_t width = dtype_bytes(os.dtype);
    if (width != 4) not_generated(f, fmt::format("a concatenation of {}", os.to_string()));
    // Result element `idx` of value `v`, followed back to a fusion operand: its index there.
    std::vector<int64_t> tmp;
    const auto source = [&](ValueId v, std::vector<int64_t> idx) -> std::pair<size_t, uint64_t> {
        while (inside_fusion(f, g, v)) {
            const Op& op = g.producer(v);
            const auto& od = g.shape(v).dims;
            switch (op.kind) {
                case OpKind::Concatenate: {
                    int64_t at = idx[size_t(op.attrs.axis)];
                    for (ValueId part : op.operands) {
                        const int64_t len = g.shape(part).dims[size_t(op.attrs.axis)];
                        if (at < len) {
                            idx[size_t(op.attrs.axis)] = at;
                            v = part;
                            break;
                        }
                        at -= len;
                    }
                    break;
                }
                case OpKind::Reshape:
                    v = op.operands[0];
                    unravel(row_major_index(idx, od), g.shape(v).dims, idx);
                    break;
                case OpKind::Transpose:
                    tmp.assign(idx.size(), 0);
                    for (size_t d = 0; d < op.attrs.dims.size(); ++d)
                        tmp[size_t(op.attrs.dims[d])] = idx[d];
                    idx = tmp;
                    v = op.operands[0];
                    break;
                case OpKind::Broadcast:
                    tmp.assign(op.attrs.dims.size(), 0);
                    for (size_t d = 0; d < op.attrs.dims.size(); ++d)
                        tmp[d] = idx[size_t(op.attrs.dims[d])];
                    idx = tmp;
                    v = op.operands[0];
                    break;
                case OpKind::Slice:
                    for (size_t d = 0; d < idx.size(); ++d) idx[d] += op.attrs.dims[d];
                    v = op.operands[0];
                    break;
                default:
                    not_generated(f,
                                  fmt::format("a concatenation fused with a {}", op_name(op.kind)));
            }
        }
        for (size_t i = 0; i < f.operands.size(); ++i)
            if (f.operands[i].value == v) {
                const FusionValue& fv = f.operands[i];
                if (dtype_bytes(fv.shape.dtype) != width)
                    not_generated(f, "a concatenation that converts its parts");
                auto it = std::find(p->operands.begin(), p->operands.end(), &fv);
                if (it == p->operands.end()) it = p->operands.insert(it, &fv);
                return {size_t(it - p->operands.begin()),
                        physical_index(fv.shape, fv.layout, idx) * width};
            }
        not_generated(f, "a concatenation of a value that is not the fusion's operand");
    };
    // The runs, in the result's logical order; `k` counts the runs of a row (its last dim).
    struct Run {
        size_t operand;
        uint64_t src, dst, bytes;
        int64_t k;
    };
    std::vector<Run> runs;
    p->slot_bytes = std::min<uint64_t>(board.core.vmem_bytes / 4, kSlotBytes);
    const int64_t n = os.elements(), D = os.dims.empty() ? 1 : os.dims.back();
    std::vector<int64_t> idx(os.dims.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
        unravel(i, os.dims, idx);
        const uint64_t dst = physical_index(os, p->out->layout, idx) * width;
        const auto [o, src] = source(p->out->value, idx);
        const bool row_start = i % D == 0;
        // Runs continue across rows where both sides do (the patches of a sequence: one run),
        // up to a VMEM slot.
        if (!runs.empty()) {
            Run& l = runs.back();
            if (l.operand == o && l.src + l.bytes == src && l.dst + l.bytes == dst &&
                l.bytes + width <= p->slot_bytes) {
                l.bytes += width;
                continue;
            }
        }
        const int64_t k = row_start ? 0 : runs.back().k + 1;
        runs.push_back(Run{o, src, dst, width, k});
    }
    // Runs of one operand, length and place in their rows, in row order: strided DMAs. A DMA's
    // rows may not overlap on either side, so runs of one source (a part broadcast over the
    // batch) are loaded once and doubled in VMEM before one strided store.
    std::stable_sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
        return std::tie(a.operand, a.bytes, a.k) < std::tie(b.operand, b.bytes, b.k);
    });
    for (const Run& r : runs) {
        if (!p->copies.empty()) {
            CopyRuns& c = p->copies.back();
            const bool fits = (c.count + 1) * c.bytes <= p->slot_bytes;
            if (c.operand == r.operand && c.bytes == r.bytes && fits && r.dst > c.dst) {
                const uint64_t ss = r.src - c.src, ds = r.dst - c.dst;
                if (c.count == 1 && ds >= c.bytes &&
                    ((ss >= c.bytes && r.src > c.src) || r.src == c.src)) {
                    c.src_stride = ss;
                    c.dst_stride = ds;
                    c.count = 2;
                    continue;
                }
                if (c.count > 1 && c.src + c.count * c.src_stride == r.src &&
                    c.dst + c.count * c.dst_stride == r.dst) {
                    ++c.count;
                    continue;
                }
            }
        }
        p->copies.push_back(CopyRuns{r.operand, r.src, r.dst, r.bytes, 1, r.bytes, r.bytes});
    }
    return p;
}

void emit_concat_fusion(isa::Builder& b, const ConcatFusion& p, const LoadFn& load) {
    std::vector<isa::Reg> src;
    for (size_t i = 0; i < p.operands.size(); ++i) {
        src.push_back(b.reg(fmt::format("part{}", i)));
        load(src.back(), p.operands[i]->buffer);
    }
    const isa::Reg out = b.reg("out"), s = b.reg("s"), d = b.reg("d"), v = b.reg("v");
    load(out, p.out->buffer);
    const isa::Vmem slots = b.vmem("rows", 2 * p.slot_bytes);
    isa::CountedFlag loads(b, "loads");
    isa::CountedFlag store0(b, "stores0"), store1(b, "stores1");
    // Two slots: a copy's loads into one run beside the previous copy's stores from the other
    // (each slot's stores counted apart: a banked HBM may finish DMAs out of order).
    for (size_t i = 0; i < p.copies.size(); ++i) {
        const CopyRuns& c = p.copies[i];
        isa::CountedFlag& stores = i % 2 ? store1 : store0;
        stores.wait_all();
        b.emit(Opcode::Li, {v, imm(int64_t(slots.addr() + (i % 2) * p.slot_bytes))});
        b.emit(Opcode::Add, {s, src[c.operand], imm(int64_t(c.src))});
        const uint64_t once = c.src_stride == 0 ? 1 : c.count;
        loads.issue(Opcode::DmaHv,
                    {v + 0, s + 0, imm(int64_t(once)), imm(int64_t(c.bytes)), imm(int64_t(c.bytes)),
                     imm(int64_t(once == 1 ? c.bytes : c.src_stride))});
        loads.wait_all();
        for (uint64_t have = once; have < c.count;) {  // doubled: log2(count) copies in VMEM
            const uint64_t more = std::min(have, c.count - have) * c.bytes;
            loads.issue(Opcode::DmaVv,
                        {v + int64_t(have * c.bytes), v + 0, imm(1), imm(int64_t(more)),
                         imm(int64_t(more)), imm(int64_t(more))});
            loads.wait_all();
            have += more / c.bytes;
        }
        b.emit(Opcode::Add, {d, out, imm(int64_t(c.dst))});
        stores.issue(Opcode::DmaVh, {d + 0, v + 0, imm(int64_t(c.count)), imm(int64_t(c.bytes)),
                                     imm(int64_t(c.dst_stride)), imm(int64_t(c.bytes))});
    }
    store0.wait_all();
    store1.wait_all();
}

}  // namespace tpu::compiler::gen
