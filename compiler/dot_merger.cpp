// SPDX-License-Identifier: Apache-2.0
// Stage 3: dots that share an operand become one dot (compiler/README.md, "Dot merging"), as
// xla/service/dot_merger.cc does: the other operands are concatenated along their
// non-contracting dim, the merged dot's result is sliced back into the original results.
#include <algorithm>
#include <map>
#include <queue>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/rewriter.h"

namespace tpu::compiler {
namespace {

/// dot_merger.cc, IsCanonicalDot: batch dims first (a permutation of 0..b-1 on both sides),
/// then one contracting and one non-contracting dim on each side.
bool canonical(const Graph& g, const Op& op) {
    if (op.kind != OpKind::Dot) return false;
    const DotDims& d = op.attrs.dot;
    const auto iota_perm = [](std::vector<int64_t> v) {
        std::sort(v.begin(), v.end());
        for (size_t i = 0; i < v.size(); ++i)
            if (v[i] != int64_t(i)) return false;
        return true;
    };
    const int64_t b = int64_t(d.lhs_batch.size());
    return iota_perm(d.lhs_batch) && iota_perm(d.rhs_batch) && d.lhs_contracting.size() == 1 &&
           d.rhs_contracting.size() == 1 && g.shape(op.operands[0]).rank() == b + 2 &&
           g.shape(op.operands[1]).rank() == b + 2;
}

/// The op's operands and result bytes (dot_merger.cc's is_merge_candidate measure).
uint64_t dot_bytes(const Graph& g, const Op& op) {
    uint64_t n = g.shape(op.results[0]).bytes();
    for (ValueId v : op.operands) n += g.shape(v).bytes();
    return n;
}

struct Group {
    std::vector<OpId> dots;  // ascending
    int shared = 0;          // 0: lhs shared, 1: rhs shared
};

}  // namespace

Graph merge_dots(const Graph& graph, uint64_t max_bytes) {
    const auto& ops = graph.ops();
    const auto users = graph.users();
    // Ops reachable from each dot (for the "neither depends on the other" rule).
    std::map<OpId, std::vector<char>> reach;
    const auto reachable = [&](OpId from, OpId to) {
        auto it = reach.find(from);
        if (it == reach.end()) {
            std::vector<char> seen(ops.size(), 0);
            std::vector<OpId> stack{from};
            while (!stack.empty()) {
                const OpId id = stack.back();
                stack.pop_back();
                for (ValueId r : ops[id].results)
                    for (OpId u : users[r])
                        if (!seen[u]) {
                            seen[u] = 1;
                            stack.push_back(u);
                        }
            }
            it = reach.emplace(from, std::move(seen)).first;
        }
        return it->second[to] != 0;
    };
    // Equivalence classes: per operand value, the canonical dots reading it.
    std::map<ValueId, std::vector<OpId>> classes;
    for (OpId id = 0; id < ops.size(); ++id)
        if (canonical(graph, ops[id]))
            for (ValueId v : ops[id].operands) classes[v].push_back(id);
    std::vector<int> group_of(ops.size(), -1);
    std::vector<Group> groups;
    for (auto& [shared_value, dots] : classes) {
        dots.erase(std::unique(dots.begin(), dots.end()), dots.end());
        if (dots.size() < 2) continue;
        for (size_t i = 0; i < dots.size(); ++i) {
            const Op& a = ops[dots[i]];
            if (group_of[dots[i]] >= 0 && groups[size_t(group_of[dots[i]])].dots.front() != dots[i])
                continue;
            for (size_t j = i + 1; j < dots.size(); ++j) {
                const Op& b = ops[dots[j]];
                if (group_of[dots[j]] >= 0) continue;
                // TryMergeSameOperand: the same shared operand on the same side, the same types,
                // dimension numbers and precision, other operands that differ only in the
                // non-contracting dim.
                const int side = a.operands[0] == shared_value && b.operands[0] == shared_value ? 0
                                 : a.operands[1] == shared_value && b.operands[1] == shared_value
                                     ? 1
                                     : -1;
                if (side < 0 || a.operands[0] == a.operands[1] || b.operands[0] == b.operands[1])
                    continue;
                if (!(a.attrs.dot == b.attrs.dot) || a.attrs.precision != b.attrs.precision)
                    continue;
                const Shape &da = graph.shape(a.operands[size_t(1 - side)]),
                            &db = graph.shape(b.operands[size_t(1 - side)]);
                const int64_t contracting =
                    side == 0 ? a.attrs.dot.rhs_contracting[0] : a.attrs.dot.lhs_contracting[0];
                const int64_t nb = int64_t(a.attrs.dot.lhs_batch.size());
                const int64_t outer = contracting == nb ? nb + 1 : nb;
                bool match = da.dtype == db.dtype && da.rank() == db.rank();
                for (int64_t d = 0; match && d < da.rank(); ++d)
                    match = d == outer || da.dims[size_t(d)] == db.dims[size_t(d)];
                if (!match) continue;
                const int gi = group_of[dots[i]];
                if (gi >= 0 && groups[size_t(gi)].shared != side) continue;
                // Neither may depend on the other (or on any dot already in the group).
                std::vector<OpId> members =
                    gi >= 0 ? groups[size_t(gi)].dots : std::vector<OpId>{dots[i]};
                bool independent = true;
                bool candidate = dot_bytes(graph, b) <= max_bytes;
                for (OpId m : members) {
                    independent &= !reachable(m, dots[j]) && !reachable(dots[j], m);
                    candidate |= dot_bytes(graph, ops[m]) <= max_bytes;
                }
                if (!independent || !candidate) continue;
                if (gi < 0) {
                    group_of[dots[i]] = int(groups.size());
                    groups.push_back(Group{{dots[i]}, side});
                }
                const int g2 = group_of[dots[i]];
                groups[size_t(g2)].dots.push_back(dots[j]);
                group_of[dots[j]] = g2;
            }
        }
    }
    if (groups.empty()) return graph;

    // Emission order: a topological order of the ops with each group's dots as one node (the
    // merged dot needs every member's operands; the members' users need it).
    const size_t n = ops.size();
    const auto node = [&](OpId id) -> size_t {
        return group_of[id] >= 0 ? groups[size_t(group_of[id])].dots.front() : id;
    };
    std::vector<std::vector<size_t>> succ(n);
    std::vector<int> indeg(n, 0);
    std::vector<char> present(n, 0);
    for (OpId id = 0; id < n; ++id) present[node(id)] = 1;
    for (OpId id = 0; id < n; ++id)
        for (ValueId v : ops[id].operands) {
            const size_t from = node(graph.value(v).producer), to = node(id);
            if (from == to) continue;
            succ[from].push_back(to);
            ++indeg[to];
        }
    std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
    for (size_t i = 0; i < n; ++i)
        if (present[i] && indeg[i] == 0) ready.push(i);
    detail::Rewriter rw(graph);
    Graph& g = rw.out();
    while (!ready.empty()) {
        const size_t id = ready.top();
        ready.pop();
        if (group_of[id] < 0) {
            rw.copy(ops[id]);
        } else {
            const Group& grp = groups[size_t(group_of[id])];
            const Op& first = ops[grp.dots.front()];
            const int other = 1 - grp.shared;
            const int64_t nb = int64_t(first.attrs.dot.lhs_batch.size());
            const int64_t contracting = grp.shared == 0 ? first.attrs.dot.rhs_contracting[0]
                                                        : first.attrs.dot.lhs_contracting[0];
            const int64_t outer = contracting == nb ? nb + 1 : nb;
            std::vector<ValueId> parts;
            for (OpId d : grp.dots) parts.push_back(rw[ops[d].operands[size_t(other)]]);
            ValueId merged;
            {
                const detail::OpScope scope(g, first.name);
                const ValueId cat = concatenate(g, parts, outer);
                std::vector<ValueId> operands = {rw[first.operands[0]], rw[first.operands[1]]};
                operands[size_t(other)] = cat;
                merged = g.add1(OpKind::Dot, operands, first.attrs);
            }
            // The slices: along the last result dim (lhs shared) or the one before it.
            const Shape ms = g.shape(merged);
            const int64_t dim = ms.rank() - (grp.shared == 0 ? 1 : 2);
            int64_t start = 0;
            for (OpId d : grp.dots) {
                const detail::OpScope scope(g, ops[d].name);
                const Shape& rs = graph.shape(ops[d].results[0]);
                std::vector<int64_t> lo(size_t(ms.rank()), 0), hi = ms.dims;
                lo[size_t(dim)] = start;
                hi[size_t(dim)] = start + rs.dims[size_t(dim)];
                start = hi[size_t(dim)];
                rw.set(ops[d].results[0], slice(g, merged, lo, hi));
            }
        }
        for (size_t s : succ[id])
            if (--indeg[s] == 0) ready.push(s);
    }
    return rw.finish();
}

}  // namespace tpu::compiler
