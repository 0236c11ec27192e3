// SPDX-License-Identifier: Apache-2.0
// Stage 7: buffers (compiler/README.md, "Buffers"). Leaves are the runtime's buffers; outputs get
// their own allocation unless they update a parameter in place; every other fusion result is a
// temp in one arena, placed by liveness as xla/service/heap_simulator.cc's
// GlobalDecreasingSizeBestFitHeap places buffers (largest first, each into the smallest gap
// that no buffer live at the same time uses), sharing an operand's buffer where a loop fusion
// reads it elementwise for the last time or an all-reduce reads it for the last time
// (buffer_assignment.cc, CanShareOperandBufferWithUser; hlo_dataflow_analysis.cc's
// GetInPlaceInputOutputPairs lists an async all-reduce's operand and result, kAllReduceStart,
// as an in-place pair).
#include <algorithm>
#include <cstdint>
#include <map>

#include <fmt/format.h>

#include "compiler/stages.h"

namespace tpu::compiler::detail {
namespace {

uint64_t align_up(uint64_t x, uint64_t a) {
    return a <= 1 ? x : (x + a - 1) / a * a;
}

/// One temp allocation: the values sharing it and when it is live (fusion indices, inclusive).
struct Alloc {
    uint64_t bytes = 0;
    size_t start = 0, end = 0;
    uint64_t offset = 0;
    std::vector<ValueId> values;
};

bool is_member(const Fusion& f, OpId id) {
    return std::binary_search(f.ops.begin(), f.ops.end(), id);
}

/// Every op of `f` on a path from operand `o` to result `r` is elementwise on arrays of r's
/// shape, so element i of r depends only on element i of o: r may overwrite o as it goes.
bool elementwise_path(const Graph& g, const Fusion& f, ValueId o, ValueId r) {
    if (f.kind != FusionKind::Loop) return false;
    const Shape& rs = g.shape(r);
    if (!(g.shape(o).dims == rs.dims)) return false;
    // Walk back from r; any op reached that depends on o must be elementwise of r's dims.
    std::vector<ValueId> stack{r};
    std::vector<ValueId> seen;
    bool reaches = false;
    while (!stack.empty()) {
        const ValueId v = stack.back();
        stack.pop_back();
        if (v == o) {
            reaches = true;
            continue;
        }
        if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
        seen.push_back(v);
        const OpId p = g.value(v).producer;
        if (!is_member(f, p)) continue;
        const Op& op = g.op(p);
        for (ValueId x : op.operands) {
            // Does x depend on o inside f? Only then must this op be elementwise.
            std::vector<ValueId> st{x};
            bool dep = false;
            std::vector<ValueId> seen2;
            while (!st.empty() && !dep) {
                const ValueId y = st.back();
                st.pop_back();
                if (y == o) {
                    dep = true;
                    break;
                }
                if (std::find(seen2.begin(), seen2.end(), y) != seen2.end()) continue;
                seen2.push_back(y);
                const OpId q = g.value(y).producer;
                if (is_member(f, q))
                    for (ValueId z : g.op(q).operands) st.push_back(z);
            }
            if (!dep) continue;
            if (op_class(op.kind) != OpClass::Elementwise || !(g.shape(v).dims == rs.dims))
                return false;
            stack.push_back(x);
        }
    }
    return reaches;
}

/// `f` is one all-reduce of `o` into `r`: the ring and torus kernels reduce in their result's
/// buffer, so r may be o's buffer when o has no later reader (XLA's in-place pair).
bool collective_pair(const Graph& g, const Fusion& f, ValueId o, ValueId r) {
    if (f.kind != FusionKind::Collective || f.ops.size() != 1) return false;
    const Op& op = g.op(f.ops[0]);
    return op.kind == OpKind::AllReduce && op.operands.size() == 1 && op.operands[0] == o &&
           op.results.size() == 1 && op.results[0] == r && g.shape(o) == g.shape(r);
}

/// r may be written over o when f reads o for the last time.
bool in_place_pair(const Graph& g, const Fusion& f, ValueId o, ValueId r) {
    return collective_pair(g, f, o, r) || elementwise_path(g, f, o, r);
}

}  // namespace

void assign_buffers(CompiledStep& step, const CompileOptions& options) {
    const Graph& g = step.graph;
    const uint64_t align = std::max<uint64_t>(options.buffer_alignment_bytes, 1);
    MemoryPlan& mem = step.memory;
    mem = {};
    mem.alignment_bytes = align;
    std::map<ValueId, BufferRef> where;

    // (1) Leaves: the runtime's buffers, one per leaf.
    const auto leaves = [&](OpKind kind, std::vector<LeafBuffer>& out, BufferRef::Space space,
                            uint64_t& total) {
        out.clear();
        for (ValueId v : g.leaves(kind)) {
            LeafBuffer b;
            b.value = v;
            b.name = g.producer(v).name;
            b.shape = g.shape(v);
            b.layout = g.value(v).layout;
            b.bytes = layout_bytes(b.shape, b.layout);
            where[v] = BufferRef{space, uint32_t(out.size()), 0, b.bytes};
            total += align_up(b.bytes, align);
            out.push_back(std::move(b));
        }
    };
    leaves(OpKind::Parameter, step.parameters, BufferRef::Space::Parameter, mem.parameter_bytes);
    leaves(OpKind::Input, step.inputs, BufferRef::Space::Input, mem.input_bytes);
    leaves(OpKind::Constant, step.constants, BufferRef::Space::Constant, mem.input_bytes);

    // Execution index of each value's writer and last reader.
    const size_t nf = step.fusions.size();
    std::map<ValueId, size_t> def, last;
    for (size_t i = 0; i < nf; ++i) {
        for (const FusionValue& r : step.fusions[i].results) def[r.value] = i;
        for (const FusionValue& o : step.fusions[i].operands) last[o.value] = i;
    }

    // (2) Outputs: in place over the parameter they update when every read of the old value
    // comes no later than the write, and the writer reads it (if at all) elementwise or
    // all-reduces it, in the same layout; otherwise an allocation of their own.
    const auto params = g.leaves(OpKind::Parameter);
    step.outputs.clear();
    for (size_t oi = 0; oi < g.outputs().size(); ++oi) {
        const Output& o = g.outputs()[oi];
        OutputBuffer b;
        b.value = o.value;
        b.name = o.name;
        b.shape = g.shape(o.value);
        b.layout = g.value(o.value).layout;
        b.updates_parameter = o.updates_parameter;
        const uint64_t bytes = layout_bytes(b.shape, b.layout);
        if (auto it = where.find(o.value); it != where.end()) {
            b.buffer = it->second;  // a leaf, or a value already placed by an earlier output
        } else if (o.updates_parameter >= 0) {
            const ValueId p = params[size_t(o.updates_parameter)];
            const size_t w = def.at(o.value);
            const Fusion& f = step.fusions[w];
            bool in_place = g.value(p).layout == b.layout;
            if (in_place && last.count(p)) in_place = last[p] <= w;
            if (in_place)
                for (const FusionValue& x : f.operands)
                    if (x.value == p) in_place = in_place_pair(g, f, p, o.value);
            if (in_place) {
                b.buffer = where.at(p);
            } else {
                b.buffer = BufferRef{BufferRef::Space::Output, uint32_t(oi), 0, bytes};
                mem.output_bytes += align_up(bytes, align);
            }
            where[o.value] = b.buffer;
        } else {
            b.buffer = BufferRef{BufferRef::Space::Output, uint32_t(oi), 0, bytes};
            mem.output_bytes += align_up(bytes, align);
            where[o.value] = b.buffer;
        }
        step.outputs.push_back(std::move(b));
    }
    // An output all-reduced from a temp that nothing reads afterwards: the temp is written in the
    // output's buffer, so the all-reduce reduces where its operand lies (XLA's buffer of an
    // in-place pair is one allocation, live out or not). Not over a parameter: its old value
    // may still be read while the temp is live.
    if (options.reuse_buffers)
        for (size_t i = 0; i < nf; ++i) {
            const Fusion& f = step.fusions[i];
            if (f.operands.size() != 1 || f.results.size() != 1) continue;
            const ValueId x = f.operands[0].value, y = f.results[0].value;
            const auto out = where.find(y);
            if (out == where.end() || out->second.space != BufferRef::Space::Output ||
                where.count(x) || last.at(x) != i || !collective_pair(g, f, x, y) ||
                !(g.value(x).layout == g.value(y).layout))
                continue;
            where[x] = out->second;
        }

    // (3) Temps: live from their writer to their last reader.
    std::vector<Alloc> allocs;
    std::map<ValueId, size_t> alloc_of;
    std::vector<size_t> scratch_alloc;  // per fusion: its scratch allocation, or SIZE_MAX
    for (size_t i = 0; i < nf; ++i) {
        const Fusion& f = step.fusions[i];
        std::vector<size_t> taken;  // allocations already shared by a result of this fusion
        for (const FusionValue& r : f.results) {
            if (where.count(r.value)) continue;
            const uint64_t bytes =
                align_up(layout_bytes(g.shape(r.value), g.value(r.value).layout), align);
            const size_t end = last.count(r.value) ? last[r.value] : i;
            // Reuse an operand's buffer whose last read is this elementwise write or all-reduce.
            size_t shared = allocs.size();
            if (options.reuse_buffers)
                for (const FusionValue& o : f.operands) {
                    auto it = alloc_of.find(o.value);
                    if (it == alloc_of.end()) continue;
                    Alloc& a = allocs[it->second];
                    if (a.end != i || a.bytes != bytes ||
                        std::find(taken.begin(), taken.end(), it->second) != taken.end() ||
                        !(g.value(o.value).layout == g.value(r.value).layout) ||
                        !in_place_pair(g, f, o.value, r.value))
                        continue;
                    shared = it->second;
                    break;
                }
            if (shared < allocs.size()) {
                allocs[shared].end = std::max(allocs[shared].end, end);
                allocs[shared].values.push_back(r.value);
            } else {
                allocs.push_back(Alloc{bytes, i, end, 0, {r.value}});
            }
            taken.push_back(shared < allocs.size() ? shared : allocs.size() - 1);
            alloc_of[r.value] = shared < allocs.size() ? shared : allocs.size() - 1;
        }
        // A kernel's own scratch: live during this fusion only.
        if (f.scratch.bytes) allocs.push_back(Alloc{align_up(f.scratch.bytes, align), i, i, 0, {}});
        scratch_alloc.push_back(f.scratch.bytes ? allocs.size() - 1 : SIZE_MAX);
    }
    // (4) Offsets: largest first, best fit among what is live at the same time.
    std::vector<size_t> order(allocs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (allocs[a].bytes != allocs[b].bytes) return allocs[a].bytes > allocs[b].bytes;
        return allocs[a].start < allocs[b].start;
    });
    std::vector<size_t> placed;
    for (size_t ai : order) {
        Alloc& a = allocs[ai];
        mem.temp_unshared_bytes += a.bytes;
        std::vector<std::pair<uint64_t, uint64_t>> busy;  // [offset, end) of overlapping allocs
        if (options.reuse_buffers) {
            for (size_t pi : placed) {
                const Alloc& p = allocs[pi];
                if (p.start <= a.end && a.start <= p.end)
                    busy.emplace_back(p.offset, p.offset + p.bytes);
            }
        } else {
            for (size_t pi : placed)
                busy.emplace_back(allocs[pi].offset, allocs[pi].offset + allocs[pi].bytes);
        }
        std::sort(busy.begin(), busy.end());
        uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, cursor = 0;
        for (const auto& [lo, hi] : busy) {
            if (lo > cursor && lo - cursor >= a.bytes && lo - cursor < best_gap) {
                best = cursor;
                best_gap = lo - cursor;
            }
            cursor = std::max(cursor, hi);
        }
        a.offset = best != UINT64_MAX ? best : cursor;
        mem.temp_bytes = std::max(mem.temp_bytes, a.offset + a.bytes);
        placed.push_back(ai);
        for (ValueId v : a.values)
            where[v] = BufferRef{BufferRef::Space::Temp, 0, a.offset,
                                 layout_bytes(g.shape(v), g.value(v).layout)};
    }
    for (size_t i = 0; i < nf; ++i)
        if (scratch_alloc[i] != SIZE_MAX) {
            BufferRef& s = step.fusions[i].scratch;
            s = BufferRef{BufferRef::Space::Temp, 0, allocs[scratch_alloc[i]].offset, s.bytes};
        }
    for (Fusion& f : step.fusions) {
        for (FusionValue& fv : f.operands) fv.buffer = where.at(fv.value);
        for (FusionValue& fv : f.results) fv.buffer = where.at(fv.value);
    }
}

}  // namespace tpu::compiler::detail
