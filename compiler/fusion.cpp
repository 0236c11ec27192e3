// SPDX-License-Identifier: Apache-2.0
// Stage 4: fusion (compiler/README.md, "Fusion"). Producers are fused into consumers in
// reverse post order as xla/service/instruction_fusion.cc does; contractions take their
// elementwise consumers as an epilogue (an "output" fusion); then the multi-output rules of
// xla/service/gpu/multi_output_fusion.cc merge sibling reductions and a loop fusion into the
// reduction that consumes it.
#include "compiler/fusion.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>

#include <fmt/format.h>

namespace tpu::compiler::detail {
namespace {

bool is_fusible_producer(OpClass c) {
    return c == OpClass::Literal || c == OpClass::Elementwise || c == OpClass::Movement ||
           c == OpClass::Gather || c == OpClass::Rng;
}

/// A hero: an op that gives its group a kind (and of which a group holds at most one).
bool is_hero(OpClass c) {
    return c == OpClass::Reduce || c == OpClass::Contraction || c == OpClass::Window ||
           c == OpClass::Collective || c == OpClass::Custom;
}

class Fuser {
public:
    Fuser(const Graph& g, const FusionOptions& o) : m_g(g), m_o(o), m_users(g.users()) {
        const size_t n = g.ops().size();
        m_groups_of.resize(n);
        m_home.assign(n, -1);
        for (OpId id = 0; id < n; ++id) {
            if (op_class(g.op(id).kind) == OpClass::Leaf) continue;
            const int gi = int(m_members.size());
            m_members.push_back({id});
            m_alive.push_back(1);
            m_groups_of[id].insert(gi);
            m_home[id] = gi;
        }
        compute_do_not_duplicate();
    }

    std::vector<FusionGroup> run() {
        // (1) Producer into consumer, consumers in reverse post order.
        for (OpId c = OpId(m_g.ops().size()); c-- > 0;) {
            if (op_class(m_g.op(c).kind) == OpClass::Leaf) continue;
            if (op_class(m_g.op(c).kind) == OpClass::Contraction) try_epilogue(c);
            const std::set<int> groups = m_groups_of[c];
            for (int gi : groups)
                if (m_alive[size_t(gi)]) fuse_operands(c, gi);
        }
        // (2) Multi-output fusion.
        if (m_o.multi_output_fusion) multi_output();
        if (m_o.reductions_into_dots) reductions_into_dots();
        // (3) Groups whose results nobody needs (their ops were all duplicated into consumers).
        drop_dead_groups();
        prune_dead_members();
        return ordered_groups();
    }

private:
    // ---- Facts about ops ---------------------------------------------------------------------

    OpClass cls(OpId id) const { return op_class(m_g.op(id).kind); }

    /// Ops reading any result of `id`.
    std::vector<OpId> op_users(OpId id) const {
        std::vector<OpId> u;
        for (ValueId r : m_g.op(id).results)
            for (OpId x : m_users[r]) u.push_back(x);
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
        return u;
    }

    /// instruction_fusion.cc, EffectivelyAtMostUnary: at most one operand that is not a
    /// broadcast, iota or scalar and has at least the result's rank.
    bool effectively_at_most_unary(OpId id) const {
        const Op& op = m_g.op(id);
        int64_t out_rank = 0;
        for (ValueId r : op.results) out_rank = std::max(out_rank, m_g.shape(r).rank());
        int big = 0;
        for (ValueId v : op.operands) {
            const OpKind pk = m_g.producer(v).kind;
            if (pk == OpKind::Broadcast || pk == OpKind::Iota || pk == OpKind::Literal) continue;
            if (m_g.shape(v).rank() == 0) continue;
            big += m_g.shape(v).rank() >= out_rank;
        }
        return big <= 1;
    }

    /// instruction_fusion.cc, ComputeGloballyUnfusible: an op that is more than unary and reads
    /// more elements than it writes is not duplicated (it would add reads). (XLA still fuses such
    /// an op when it can fuse into all consumers on all paths; here that case is a move, which
    /// needs no duplication.)
    void compute_do_not_duplicate() {
        m_do_not_duplicate.assign(m_g.ops().size(), 0);
        for (OpId id = 0; id < m_g.ops().size(); ++id) {
            const Op& op = m_g.op(id);
            if (op_class(op.kind) == OpClass::Leaf || effectively_at_most_unary(id)) continue;
            int64_t in = 0, out = 0;
            std::set<ValueId> unique(op.operands.begin(), op.operands.end());
            for (ValueId v : unique) in += m_g.shape(v).elements();
            for (ValueId r : op.results) out += m_g.shape(r).elements();
            if (in > out) m_do_not_duplicate[id] = 1;
        }
    }

    /// instruction_fusion.cc, IsAlwaysDuplicable: broadcasts and widening converts get cheaper
    /// the more they are duplicated (and literals cost nothing).
    bool always_duplicable(OpId id) const {
        const Op& op = m_g.op(id);
        if (op.kind == OpKind::Literal || op.kind == OpKind::Broadcast || op.kind == OpKind::Iota)
            return true;
        return op.kind == OpKind::Convert && dtype_bytes(m_g.shape(op.operands[0]).dtype) <
                                                 dtype_bytes(m_g.shape(op.results[0]).dtype);
    }

    /// HloInstruction::ReusesOperandElements: the consumer reads each element of that operand
    /// more than once.
    bool reuses_operand(OpId consumer, size_t operand) const {
        const Op& op = m_g.op(consumer);
        switch (op_class(op.kind)) {
            case OpClass::Contraction:
            case OpClass::Window:
                return true;
            case OpClass::Gather:
                return operand == 0;
            case OpClass::Movement:
                return op.kind == OpKind::Broadcast &&
                       m_g.shape(op.results[0]).elements() > m_g.shape(op.operands[0]).elements();
            default:
                return false;
        }
    }

    // ---- Facts about groups ------------------------------------------------------------------

    bool group_has(int gi, OpClass c) const {
        for (OpId id : m_members[size_t(gi)])
            if (cls(id) == c) return true;
        return false;
    }

    FusionKind kind_of(int gi) const {
        if (group_has(gi, OpClass::Contraction)) return FusionKind::Output;
        if (group_has(gi, OpClass::Reduce)) return FusionKind::Input;
        if (group_has(gi, OpClass::Collective)) return FusionKind::Collective;
        if (group_has(gi, OpClass::Custom)) return FusionKind::Custom;
        return FusionKind::Loop;
    }

    bool in_group(OpId id, int gi) const { return m_groups_of[id].count(gi) != 0; }

    /// Values `gi` reads from outside (operands of members whose producer is not a member).
    std::vector<ValueId> external_operands(int gi) const {
        std::vector<ValueId> out;
        for (OpId id : m_members[size_t(gi)])
            for (ValueId v : m_g.op(id).operands)
                if (!in_group(m_g.value(v).producer, gi) &&
                    std::find(out.begin(), out.end(), v) == out.end())
                    out.push_back(v);
        return out;
    }

    /// The group that writes `v` to memory for readers that do not compute it.
    int writer_of(ValueId v) const { return m_home[m_g.value(v).producer]; }

    void add_member(OpId id, int gi) {
        m_members[size_t(gi)].insert(id);
        m_groups_of[id].insert(gi);
    }

    /// Moves every member of `from` into `into` (`from` dies).
    void merge(int into, int from) {
        for (OpId id : m_members[size_t(from)]) {
            m_groups_of[id].erase(from);
            add_member(id, into);
            if (m_home[id] == from) m_home[id] = into;
        }
        m_members[size_t(from)].clear();
        m_alive[size_t(from)] = 0;
    }

    /// Group DAG reachability: can `to` be reached from `from` through values written by one
    /// group and read by another?
    bool group_reaches(int from, int to) const {
        return from == to || reach({from}, to)[size_t(to)];
    }

    /// Groups reachable from any group of `from` (through values written by one group and read
    /// by another); the walk stops early once `stop` (if any) is reached.
    std::vector<char> reach(const std::set<int>& from, int stop = -1) const {
        std::vector<char> seen(m_members.size(), 0);
        std::vector<int> stack(from.begin(), from.end());
        while (!stack.empty()) {
            const int gi = stack.back();
            stack.pop_back();
            for (OpId id : m_members[size_t(gi)]) {
                if (m_home[id] != gi) continue;
                for (OpId u : op_users(id))
                    for (int h : m_groups_of[u])
                        if (h != gi && !in_group(id, h) && !seen[size_t(h)]) {
                            seen[size_t(h)] = 1;
                            if (h == stop) return seen;
                            stack.push_back(h);
                        }
            }
        }
        return seen;
    }

    /// Merging the groups of `s` into one makes a cycle: one of them reads a value written by a
    /// group outside `s` that one of them reaches.
    bool merge_creates_cycle(const std::set<int>& s) const {
        const auto r = reach(s);
        for (int gi : s)
            for (ValueId v : external_operands(gi)) {
                const int w = writer_of(v);
                if (w >= 0 && !s.count(w) && r[size_t(w)]) return true;
            }
        return false;
    }

    /// Fusing producer `p` into group `gi` (moving it there when `move`) makes a cycle: `gi` (or
    /// a group that would then read p from it) reaches a writer of p's operands, or a group
    /// that would read p from `gi` reaches `gi`.
    bool fuse_creates_cycle(OpId p, int gi, bool move) const {
        std::set<int> from{gi}, readers;
        if (move)
            for (OpId u : op_users(p))
                for (int h : m_groups_of[u])
                    if (h != gi && m_alive[size_t(h)]) readers.insert(h);
        from.insert(readers.begin(), readers.end());
        const auto r = reach(from);
        for (ValueId v : m_g.op(p).operands) {
            const OpId q = m_g.value(v).producer;
            if (in_group(q, gi)) continue;
            const int w = writer_of(v);
            if (w >= 0 && (w == gi || r[size_t(w)])) return true;
        }
        if (!readers.empty() && reach(readers)[size_t(gi)]) return true;
        return false;
    }

    // ---- (1) Producer-consumer fusion -----------------------------------------------------------

    void fuse_operands(OpId c, int gi) {
        const Op& op = m_g.op(c);
        // Operands latest-first (instruction_fusion.cc's ReversePostOrderFusionQueue order).
        std::vector<std::pair<OpId, size_t>> order;
        for (size_t i = 0; i < op.operands.size(); ++i)
            order.emplace_back(m_g.value(op.operands[i]).producer, i);
        std::sort(order.begin(), order.end(), [](auto a, auto b) { return a.first > b.first; });
        for (auto [p, slot] : order) try_fuse(p, gi, c, slot);
    }

    void try_fuse(OpId p, int gi, OpId consumer, size_t slot) {
        const OpClass pc = cls(p);
        if (pc == OpClass::Leaf || !is_fusible_producer(pc) || in_group(p, gi)) return;
        // A gather is fused only into reshapes of its result: its rows are DMAs addressed by
        // the ids (codegen_gather.cpp), not values a loop body computes element by element, so
        // it roots a loop fusion of its own (with its ids' reshapes and slices). XLA's TPU
        // fusion of gathers is not public; this costs one write and read of the rows.
        if (pc == OpClass::Gather)
            for (OpId id : m_members[size_t(gi)])
                if (m_g.op(id).kind != OpKind::Reshape) return;
        const FusionKind gk = kind_of(gi);
        if (gk == FusionKind::Collective || gk == FusionKind::Custom) return;
        // A concatenation likewise roots a loop fusion of its own, which copies its parts' rows
        // by DMA (codegen_concat.cpp): it is fused into no loop or reduction fusion (a dot
        // reads dot_merger's merged operands part by part, codegen_dot.cpp), and into it only
        // the data movement its parts reach it through (the class token's broadcast over the
        // batch, the patches' NCHW view), whose bytes the copy reads where they lie.
        if (m_g.op(p).kind == OpKind::Concatenate && gk != FusionKind::Output) return;
        if (gk == FusionKind::Loop && has_concatenation(gi) && pc != OpClass::Movement) return;
        // Before the MXU only what changes dims or types is fused: reshapes and transposes
        // (a head split is a change of dims, never a copy) and conversions (an fp32 weight is
        // converted to bf16 inside the dot's fusion). After it (the epilogue) anything
        // elementwise.
        // Elementwise producers too where the dot reads each element of that operand once
        // (operand_producer_fusible: the softmax's normalize before attention's `P V`).
        bool into_operand = false;
        if (gk == FusionKind::Output && before_contraction(consumer, gi) &&
            !(pc == OpClass::Movement || pc == OpClass::Literal ||
              m_g.op(p).kind == OpKind::Convert)) {
            if (!operand_producer_fusible(p, consumer, slot, gi)) return;
            into_operand = true;
        }
        // Cost: an expensive producer is not fused into a consumer that reads its elements
        // more than once (instruction_fusion.cc, "not fuse (simple, expensive producers) and
        // (consumers who reuse operand elements)").
        if (!into_operand && op_expensive(m_g.op(p).kind) && reuses_operand(consumer, slot)) return;
        bool all_users_here = true;
        for (OpId u : op_users(p)) all_users_here &= in_group(u, gi);
        const int own = m_home[p];
        const bool alone = m_groups_of[p].size() == 1 && m_members[size_t(own)].size() == 1;
        if (all_users_here && alone) {
            if (!fuse_creates_cycle(p, gi, true)) merge(gi, own);
            return;
        }
        if (!duplicable(p) || written_anyway(p) || fuse_creates_cycle(p, gi, false)) return;
        // Not into a dot's epilogue what try_epilogue keeps out of it (below).
        if (gk == FusionKind::Output && !before_contraction(consumer, gi) && broadcasts_rows(p))
            return;
        add_member(p, gi);
    }

    /// Whether `p` or the elementwise and data movement ops it reads (back to reductions,
    /// contractions and leaves) broadcast a value along the minor dim (one value per row), or
    /// repeat a matrix along new major dims (GPT-2's `[S, D]` position table over a batch of
    /// sequences, `[B, S, D]`): values that differ from row to row of a result, which a dot's
    /// epilogue has no side for (its sides are the result's own shape, columns and scalars).
    bool broadcasts_rows(OpId p) const {
        std::vector<OpId> stack{p};
        std::set<OpId> seen{p};
        while (!stack.empty()) {
            const Op& op = m_g.op(stack.back());
            stack.pop_back();
            if (op.kind == OpKind::Broadcast) {
                const Shape& xs = m_g.shape(op.operands[0]);
                const Shape& rs = m_g.shape(op.results[0]);
                const int64_t minor = rs.rank() - 1;
                bool along = xs.elements() > 1 && rs.rank() >= 2;
                for (size_t i = 0; i < op.attrs.dims.size() && along; ++i)
                    if (op.attrs.dims[i] == minor && xs.dims[i] == rs.dims[size_t(minor)])
                        along = false;
                if (along) return true;
                // Repeated: a matrix of several rows under a new major dim of more than one.
                int64_t kept = 0;  // the operand's dims of more than one
                for (int64_t e : xs.dims) kept += e > 1;
                std::vector<bool> from(size_t(rs.rank()), false);
                for (int64_t d : op.attrs.dims) from[size_t(d)] = true;
                for (int64_t i = 0; i < rs.rank() && kept >= 2; ++i)
                    if (!from[size_t(i)] && rs.dims[size_t(i)] > 1) return true;
            }
            for (ValueId v : op.operands) {
                const OpId q = m_g.value(v).producer;
                const OpClass k = cls(q);
                if ((k == OpClass::Elementwise || k == OpClass::Movement) && seen.insert(q).second)
                    stack.push_back(q);
            }
        }
        return false;
    }

    // ---- Producers of a dot's operand ------------------------------------------------------

    /// The contraction of group `gi`, or kNoOp.
    OpId contraction_of(int gi) const {
        for (OpId id : m_members[size_t(gi)])
            if (cls(id) == OpClass::Contraction) return id;
        return kNoOp;
    }

    /// Which operand of dot `hero` (a member of `gi`) op `c` computes, reading its operand
    /// `slot`: `slot` for the dot itself, else the side whose in-group producers include c.
    int dot_side(OpId hero, OpId c, size_t slot, int gi) const {
        if (c == hero) return int(slot);
        for (int side = 0; side < 2; ++side) {
            std::vector<OpId> stack{m_g.value(m_g.op(hero).operands[size_t(side)]).producer};
            std::set<OpId> seen;
            while (!stack.empty()) {
                const OpId id = stack.back();
                stack.pop_back();
                if (!in_group(id, gi) || !seen.insert(id).second) continue;
                if (id == c) return side;
                for (ValueId v : m_g.op(id).operands) stack.push_back(m_g.value(v).producer);
            }
        }
        return -1;
    }

    /// A batched dot reads each element of its operand `side` once when the other operand has
    /// at most one MXU width of free elements per batch: the kernel then computes all of a
    /// block's results in one pass over the operand (the streamed side is loaded and converted
    /// once per block, and with one block a held side's tiles once), so a producer computed
    /// as the operand is loaded costs what it costs in a loop fusion, without the write and the
    /// read back of its result. (Attention's `P V`: V has d <= 128 free elements per head.)
    bool dot_reads_operand_once(OpId hero, int side) const {
        const Op& op = m_g.op(hero);
        if (op.kind != OpKind::Dot || op.attrs.dot.lhs_batch.empty() || side < 0) return false;
        const int other = 1 - side;
        const DotDims& d = op.attrs.dot;
        const auto& batch = other == 0 ? d.lhs_batch : d.rhs_batch;
        const auto& contracting = other == 0 ? d.lhs_contracting : d.rhs_contracting;
        const Shape& s = m_g.shape(op.operands[size_t(other)]);
        int64_t free = 1;
        for (int64_t i = 0; i < s.rank(); ++i)
            if (std::find(batch.begin(), batch.end(), i) == batch.end() &&
                std::find(contracting.begin(), contracting.end(), i) == contracting.end())
                free *= s.dims[size_t(i)];
        return free <= m_o.mxu_cols;
    }

    /// Whether `p`, back through elementwise and data movement ops that only their one user
    /// reads, reads a contraction's result: that chain is the contraction's epilogue (its output
    /// fusion writes the same bytes the operand fusion would read), which comes first.
    bool reaches_contraction(OpId p) const {
        std::vector<OpId> stack{p};
        std::set<OpId> seen{p};
        while (!stack.empty()) {
            const Op& op = m_g.op(stack.back());
            stack.pop_back();
            for (ValueId v : op.operands) {
                const OpId q = m_g.value(v).producer;
                const OpClass k = cls(q);
                if (k == OpClass::Contraction) return true;
                if ((k == OpClass::Elementwise || k == OpClass::Movement) &&
                    op_users(q).size() == 1 && seen.insert(q).second)
                    stack.push_back(q);
            }
        }
        return false;
    }

    /// xla/service/gpu/transforms/gemm_fusion.cc (FuseDotOperand) fuses the elementwise
    /// producers of a dot's operands into the dot's fusion; TPU's operand fusion is not public.
    /// Here an elementwise producer that only the dot's fusion reads joins it when the dot
    /// reads each element of that operand once and the producer is not a contraction's
    /// epilogue: it is computed on each operand tile in VMEM as the kernel loads it, before
    /// the conversion to bf16, as an fp32 parameter is converted there.
    bool operand_producer_fusible(OpId p, OpId consumer, size_t slot, int gi) const {
        if (!m_o.dot_operand_producers || cls(p) != OpClass::Elementwise) return false;
        // Only what the kernel's prologue computes on an operand tile: exp, log, rsqrt, tanh,
        // and +, -, *, / by a scalar or a row's value (a select, such as the safe softmax's
        // guard for rows of -inf, stays in its loop fusion, which writes the operand).
        static constexpr OpKind kPrologue[] = {OpKind::Exp,  OpKind::Log, OpKind::Rsqrt,
                                               OpKind::Tanh, OpKind::Add, OpKind::Sub,
                                               OpKind::Mul,  OpKind::Div};
        if (std::find(std::begin(kPrologue), std::end(kPrologue), m_g.op(p).kind) ==
            std::end(kPrologue))
            return false;
        for (OpId u : op_users(p))
            if (!in_group(u, gi)) return false;
        const OpId hero = contraction_of(gi);
        if (!dot_reads_operand_once(hero, dot_side(hero, consumer, slot, gi))) return false;
        return !reaches_contraction(p);
    }

    /// Loop group `p`'s ops can be recomputed in dot group `h`'s operand: every op of h that
    /// reads p's results `res` computes an operand the dot reads once, and every broadcast of
    /// p is of a scalar or along that operand's contracting dim (one value per row of the
    /// operand's free dim: a softmax's max), which is what the operand's tiles can take.
    bool recomputable_in_operand(int p, int h, const std::vector<ValueId>& res) const {
        if (!m_o.dot_operand_producers) return false;
        const OpId hero = contraction_of(h);
        if (hero == kNoOp || m_g.op(hero).kind != OpKind::Dot) return false;
        int side = -1;
        for (OpId id : m_members[size_t(h)]) {
            const Op& op = m_g.op(id);
            for (size_t s = 0; s < op.operands.size(); ++s) {
                if (std::find(res.begin(), res.end(), op.operands[s]) == res.end()) continue;
                if (!before_contraction(id, h)) return false;
                const int sd = dot_side(hero, id, s, h);
                if (sd < 0 || (side >= 0 && sd != side)) return false;
                side = sd;
            }
        }
        if (!dot_reads_operand_once(hero, side)) return false;
        const DotDims& d = m_g.op(hero).attrs.dot;
        const int64_t contracting = side == 0 ? d.lhs_contracting[0] : d.rhs_contracting[0];
        const Shape& os = m_g.shape(m_g.op(hero).operands[size_t(side)]);
        for (OpId id : m_members[size_t(p)]) {
            const Op& op = m_g.op(id);
            if (op.kind != OpKind::Broadcast) continue;
            if (m_g.shape(op.operands[0]).elements() == 1) continue;
            std::vector<int64_t> want;
            for (int64_t i = 0; i < os.rank(); ++i)
                if (i != contracting) want.push_back(i);
            if (m_g.shape(op.results[0]).dims != os.dims || op.attrs.dims != want) return false;
        }
        return true;
    }

    /// Group `gi` holds a concatenation (a loop fusion of row copies, see try_fuse).
    bool has_concatenation(int gi) const {
        for (OpId id : m_members[size_t(gi)])
            if (m_g.op(id).kind == OpKind::Concatenate) return true;
        return false;
    }

    /// A broadcast of an `[N, ...]` value over the pixels of each of N images.
    bool per_image_broadcast(OpId id) const {
        const Op& op = m_g.op(id);
        return op.kind == OpKind::Broadcast && m_g.shape(op.operands[0]).rank() >= 2 &&
               !op.attrs.dims.empty() && op.attrs.dims[0] == 0;
    }

    /// `v` is one of the step's outputs (written whatever the fusions).
    bool is_output(ValueId v) const {
        return std::any_of(m_g.outputs().begin(), m_g.outputs().end(),
                           [v](const Output& o) { return o.value == v; });
    }

    /// An op that is not always duplicable is recomputed in a consumer's fusion only when it
    /// fuses into all its users (XLA's PriorityFusion, priority_fusion.cc: "Don't fuse if we
    /// can't fuse in all users", CanFuseWithAllNonBitcastUsers): if its value is written anyway,
    /// for an output or for a contraction that reads it (an elementwise producer with other
    /// users never joins a contraction's operand), a copy in the consumer adds work and, when
    /// it reads what the producer's fusion no longer writes (ResNet's residual sum under the
    /// ReLU both blocks read), a second result and a pass over it.
    bool written_anyway(OpId p) const {
        if (always_duplicable(p)) return false;
        for (ValueId r : m_g.op(p).results)
            if (is_output(r)) return true;
        if (cls(p) != OpClass::Elementwise) return false;
        for (OpId u : op_users(p))
            if (cls(u) == OpClass::Contraction) return true;
        return false;
    }

    bool duplicable(OpId p) const {
        if (always_duplicable(p)) return true;
        return m_o.may_duplicate && !op_expensive(m_g.op(p).kind) && !m_do_not_duplicate[p];
    }

    /// `c` is the contraction of output group `gi` or feeds it inside the group (it is not part
    /// of the epilogue, nor one of the epilogue's other inputs).
    bool before_contraction(OpId c, int gi) const {
        OpId hero = kNoOp;
        for (OpId id : m_members[size_t(gi)])
            if (cls(id) == OpClass::Contraction) hero = id;
        if (hero == kNoOp || c == hero) return true;
        std::vector<OpId> stack{c};
        std::set<OpId> seen;
        while (!stack.empty()) {
            const OpId id = stack.back();
            stack.pop_back();
            for (OpId u : op_users(id)) {
                if (u == hero) return true;
                if (in_group(u, gi) && seen.insert(u).second) stack.push_back(u);
            }
        }
        return false;
    }

    // ---- Epilogues of contractions --------------------------------------------------------------

    /// Every consumer of contraction `c`'s result sits in loop groups of elementwise and data
    /// movement ops: they become the contraction's epilogue (bias, activation, residual add,
    /// the inference batch-norm affine, the scale of attention scores, head merges).
    void try_epilogue(OpId c) {
        const int gc = m_home[c];
        std::set<int> consumers;
        for (OpId u : op_users(c)) {
            if (m_groups_of[u].empty()) return;
            for (int h : m_groups_of[u]) consumers.insert(h);
        }
        if (consumers.empty()) return;
        // A broadcast of the result (a global pool's gradient spread over each image's pixels)
        // makes more values than the kernel's result tiles hold: it stays with its consumers.
        for (OpId u : op_users(c))
            if (m_g.op(u).kind == OpKind::Broadcast) return;
        for (int h : consumers) {
            if (h == gc || !m_alive[size_t(h)]) return;
            for (OpId id : m_members[size_t(h)]) {
                const OpClass k = cls(id);
                if (!(k == OpClass::Elementwise || k == OpClass::Movement || k == OpClass::Literal))
                    return;
                // A concatenation changes the result's dims (ViT's class token joined to the
                // patch convolution's rows): the kernels' epilogues work on tiles of the
                // contraction's own result, so it stays with its consumers.
                if (m_g.op(id).kind == OpKind::Concatenate) return;
                // A convolution's epilogue tile does not name its image (compiler/README.md,
                // "Not yet": per-image operands), so a value spread per image over the pixels
                // (a global pool's gradient) keeps the ops that read it out of the epilogue.
                if (m_g.op(c).kind == OpKind::Conv2d && per_image_broadcast(id)) return;
            }
        }
        // A dot's epilogue takes values per result column (a bias) and scalars, not per row:
        // what a consumer group recomputes from a broadcast along the rows (a layer norm's
        // output, duplicated into the next residual add) it reads from memory instead, where
        // its own group writes it (the same bytes as the array it would recompute it from).
        for (int h : consumers) {
            std::vector<OpId> drop;
            for (OpId id : m_members[size_t(h)])
                if (m_home[id] != h && broadcasts_rows(id)) drop.push_back(id);
            if (drop.empty()) continue;
            std::set<OpId> gone(drop.begin(), drop.end());
            // Then what only the dropped ops read.
            for (bool more = true; more;) {
                more = false;
                for (OpId id : m_members[size_t(h)]) {
                    if (gone.count(id) || m_home[id] == h) continue;
                    bool used = false;
                    for (OpId u : op_users(id)) used |= in_group(u, h) && !gone.count(u);
                    if (!used) more |= gone.insert(id).second;
                }
            }
            for (OpId id : gone) {
                m_members[size_t(h)].erase(id);
                m_groups_of[id].erase(h);
            }
        }
        // No epilogue may read something that itself depends on c (a cycle once fused).
        std::set<int> all = consumers;
        all.insert(gc);
        if (merge_creates_cycle(all)) return;
        for (int h : consumers) merge(gc, h);
    }

    // ---- (2) Multi-output fusion
    // ------------------------------------------------------------------

    /// The reduce of an input group (its first), or kNoOp.
    OpId reduce_hero(int gi) const {
        for (OpId id : m_members[size_t(gi)])
            if (cls(id) == OpClass::Reduce) return id;
        return kNoOp;
    }

    /// multi_output_fusion.cc, ShapesCompatibleForMultiOutputFusion for two reductions: the
    /// same reduced operand shape and the same reduced dims.
    bool reductions_compatible(int a, int b) const {
        const OpId ra = reduce_hero(a), rb = reduce_hero(b);
        if (ra == kNoOp || rb == kNoOp) return false;
        const Op &x = m_g.op(ra), &y = m_g.op(rb);
        return m_g.shape(x.operands[0]).dims == m_g.shape(y.operands[0]).dims &&
               x.attrs.dims == y.attrs.dims;
    }

    void multi_output() {
        // Producers in reverse post order, as GpuMultiOutputFusion::DoMultiOutputFusion.
        for (OpId p = OpId(m_g.ops().size()); p-- > 0;) {
            if (m_g.op(p).kind == OpKind::Literal) continue;
            for (ValueId v : m_g.op(p).results) {
                if (m_g.shape(v).rank() == 0) continue;  // IsProfitableOperand
                fuse_siblings(v);
                if (cls(p) != OpClass::Leaf) fuse_producer_consumer(v);
            }
        }
    }

    /// The alive groups that read `v` from memory.
    std::vector<int> readers(ValueId v) const {
        std::vector<int> r;
        for (OpId u : m_users[v])
            for (int h : m_groups_of[u])
                if (m_alive[size_t(h)] && !in_group(m_g.value(v).producer, h) &&
                    std::find(r.begin(), r.end(), h) == r.end())
                    r.push_back(h);
        std::sort(r.begin(), r.end());
        return r;
    }

    /// FuseSiblings: reductions that read the same operand and are not connected become one
    /// multi-output fusion, which reads the operand once.
    void fuse_siblings(ValueId v) {
        std::vector<int> sib;
        for (int h : readers(v))
            if (kind_of(h) == FusionKind::Input) sib.push_back(h);
        for (size_t i = 0; i < sib.size(); ++i) {
            if (!m_alive[size_t(sib[i])]) continue;
            for (size_t j = i + 1; j < sib.size(); ++j) {
                const int a = sib[i], b = sib[j];
                if (!m_alive[size_t(b)] || !reductions_compatible(a, b)) continue;
                if (group_reaches(a, b) || group_reaches(b, a) || merge_creates_cycle({a, b}))
                    continue;
                merge(a, b);
            }
        }
    }

    /// Bytes of `v` in memory (its elements at its dtype's width).
    int64_t bytes_of(ValueId v) const {
        return m_g.shape(v).elements() * int64_t(dtype_bytes(m_g.shape(v).dtype));
    }

    /// Recomputing loop group `p` in every group that reads it, instead of writing its results
    /// once and reading them back: what xla/service/gpu/transforms/priority_fusion.cc does with a
    /// producer it can fuse into all of its consumers (CanFuseWithAllNonBitcastUsers) when its
    /// performance model says the program gets faster (no "expensive" veto there: softmax's
    /// `exp(x - max)` is recomputed by the normalize). The model here is the bytes each way
    /// (these fusions stream HBM; recomputing an exp costs VPU time the stream hides): unfused,
    /// p's results are written once and read by each reader; fused, each reader reads p's
    /// operands it does not read already. Returns whether p was fused away. Runs before the
    /// producer-consumer multi-output rule below, as PriorityFusion runs before
    /// GpuMultiOutputFusion in XLA's GPU pipeline.
    bool duplicate_into_readers(int p) {
        std::vector<ValueId> res = results_of(p);
        if (res.empty()) return false;
        for (ValueId r : res)
            if (is_output(r)) return false;  // written anyway
        for (OpId id : m_members[size_t(p)]) {
            const OpClass k = cls(id);
            if (!(k == OpClass::Elementwise || k == OpClass::Movement || k == OpClass::Literal))
                return false;
            // Only what reads no more elements than it writes (ComputeGloballyUnfusible's guard
            // against duplicated reads; broadcasts of a row statistic are always duplicable).
            if (m_do_not_duplicate[id] && !always_duplicable(id)) return false;
        }
        std::set<int> rs;
        for (ValueId r : res)
            for (int h : readers(r)) rs.insert(h);
        if (rs.size() < 2) return false;
        const std::vector<ValueId> ins = external_operands(p);
        int64_t unfused = 0, fused = 0;
        for (ValueId r : res) unfused += bytes_of(r);
        for (int h : rs) {
            const FusionKind hk = kind_of(h);
            // A dot whose operand the results feed recomputes them as it loads the operand
            // (softmax's `exp(s - max)` under the normalize in attention's `P V`).
            if (hk != FusionKind::Input && hk != FusionKind::Loop &&
                !(hk == FusionKind::Output && recomputable_in_operand(p, h, res)))
                return false;
            // Each reader reads each element of p's results once (no broadcast of them, no
            // window over them).
            for (OpId id : m_members[size_t(h)])
                for (size_t s = 0; s < m_g.op(id).operands.size(); ++s) {
                    const ValueId o = m_g.op(id).operands[s];
                    if (std::find(res.begin(), res.end(), o) == res.end()) continue;
                    if (reuses_operand(id, s)) return false;
                    unfused += bytes_of(o);
                }
            const auto already = external_operands(h);
            for (ValueId v : ins) {
                if (std::find(already.begin(), already.end(), v) != already.end()) continue;
                fused += bytes_of(v);
                // No cycle: h must not reach the writer of an operand it would now read.
                const int w = writer_of(v);
                if (w >= 0 && (w == h || group_reaches(h, w))) return false;
            }
        }
        if (fused >= unfused) return false;
        for (int h : rs)
            for (OpId id : m_members[size_t(p)]) add_member(id, h);
        for (OpId id : m_members[size_t(p)]) m_groups_of[id].erase(p);
        m_members[size_t(p)].clear();
        m_alive[size_t(p)] = 0;
        return true;
    }

    /// Producer-consumer multi-output fusion: a loop fusion whose result a reduction reads (and
    /// others too) is computed inside the reduction's fusion, which also writes it.
    void fuse_producer_consumer(ValueId v) {
        const int p = writer_of(v);
        if (p < 0 || !m_alive[size_t(p)] || kind_of(p) != FusionKind::Loop) return;
        for (OpId id : m_members[size_t(p)])
            if (cls(id) == OpClass::Window || cls(id) == OpClass::Gather ||
                m_g.op(id).kind == OpKind::Concatenate)
                return;
        const auto rs = readers(v);
        if (rs.size() < 2) return;
        bool reduction_reads = false;
        for (int r : rs) reduction_reads |= kind_of(r) == FusionKind::Input;
        if (reduction_reads && m_o.recompute_for_reductions && duplicate_into_readers(p)) return;
        for (int r : rs) {
            if (kind_of(r) != FusionKind::Input) continue;
            const OpId hero = reduce_hero(r);
            if (m_g.shape(m_g.op(hero).operands[0]).dims != m_g.shape(v).dims) continue;
            // No other path from p to r (it would become a cycle), nor from another reader of
            // p's results to r (it would then read them from r).
            bool cycle = merge_creates_cycle({p, r});
            for (ValueId res : results_of(p))
                for (int x : readers(res))
                    if (x != r && group_reaches(x, r)) cycle = true;
            if (cycle) continue;
            merge(r, p);
            return;
        }
    }

    /// Reductions whose one array is a dot fusion's result, each over one of the result's two
    /// matrix dims (each batch dim kept; unit dims aside), through elementwise ops of that value
    /// and literals (attention's `max(s * scale)` over the keys; a layer norm's `Sum[x]` and
    /// `Sum[x^2]` after a projection), are computed by the dot's fusion as further results, as
    /// its kernel stores the result: producer-consumer multi-output fusion
    /// (xla/service/multi_output_fusion.h, DoProducerConsumerMultiOutputFusion) with an output
    /// fusion as the producer. The dot's result must be written anyway (another fusion reads it
    /// or it is a step output); the reductions' results are their group's only ones. XLA's TPU
    /// policy is not public: compiler/README.md "Reductions in a dot's fusion" gives the bound
    /// the real attention rows set on their traffic.
    void reductions_into_dots() {
        for (size_t r = 0; r < m_members.size(); ++r) {
            if (!m_alive[r] || kind_of(int(r)) != FusionKind::Input) continue;
            const std::vector<ValueId> ins = external_operands(int(r));
            if (ins.size() != 1) continue;
            const ValueId v = ins[0];
            const int d = writer_of(v);
            if (d < 0 || !m_alive[size_t(d)] || kind_of(d) != FusionKind::Output) continue;
            OpId dot = kNoOp;
            for (OpId id : m_members[size_t(d)])
                if (cls(id) == OpClass::Contraction) dot = id;
            const Op& dop = m_g.op(dot);
            const Shape& vs = m_g.shape(v);
            const std::vector<int64_t> vd = nonunit(vs.dims);
            if (dop.kind != OpKind::Dot || vs.dims != m_g.shape(dop.results[0]).dims ||
                vs.dtype != DType::F32 || vd.size() < 2)
                continue;
            bool ok = true;
            std::vector<ValueId> reduced;
            for (OpId id : m_members[r]) {
                const Op& op = m_g.op(id);
                const std::vector<int64_t> out = nonunit(m_g.shape(op.results[0]).dims);
                if (cls(id) == OpClass::Literal ||
                    (op.kind == OpKind::Broadcast && m_g.shape(op.operands[0]).elements() == 1))
                    continue;
                if (cls(id) == OpClass::Reduce) {
                    // One non-unit dim reduced, one of the two most minor: a matrix dim.
                    const Shape& xs = m_g.shape(op.operands[0]);
                    const int64_t at = reduced_nonunit_position(xs.dims, op.attrs.dims);
                    ok &= nonunit(xs.dims) == vd && (at == 0 || at == 1);
                    reduced.push_back(op.results[0]);
                    continue;
                }
                ok &= (cls(id) == OpClass::Elementwise || op.kind == OpKind::Reshape) && out == vd;
            }
            if (!ok || reduced.empty()) continue;
            bool written = is_output(v);
            for (int h : readers(v)) written |= h != int(r) && h != d;
            std::vector<ValueId> res = results_of(int(r));
            std::sort(res.begin(), res.end());
            std::sort(reduced.begin(), reduced.end());
            if (!written || res != reduced || merge_creates_cycle({d, int(r)})) continue;
            merge(d, int(r));
        }
    }

    // ---- (3) Results, dead groups, order
    // ----------------------------------------------------------

    /// Values homed in `gi` that an output or another group needs.
    std::vector<ValueId> results_of(int gi) const {
        std::vector<ValueId> out;
        for (OpId id : m_members[size_t(gi)]) {
            if (m_home[id] != gi) continue;
            for (ValueId r : m_g.op(id).results) {
                bool needed = is_output(r);
                for (OpId u : m_users[r])
                    for (int h : m_groups_of[u])
                        needed |= h != gi && m_alive[size_t(h)] && !in_group(id, h);
                if (needed) out.push_back(r);
            }
        }
        return out;
    }

    void drop_dead_groups() {
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t gi = 0; gi < m_members.size(); ++gi) {
                if (!m_alive[gi] || !results_of(int(gi)).empty()) continue;
                bool side_effect = false;
                for (OpId id : m_members[gi]) side_effect |= cls(id) == OpClass::Custom;
                if (side_effect) continue;
                for (OpId id : m_members[gi]) m_groups_of[id].erase(int(gi));
                m_members[gi].clear();
                m_alive[gi] = 0;
                changed = true;
            }
        }
    }

    /// Members whose results nothing reads (not a member, not another group, not an output):
    /// left behind when an op was fused for a consumer that later moved.
    void prune_dead_members() {
        for (size_t gi = 0; gi < m_members.size(); ++gi) {
            if (!m_alive[gi]) continue;
            for (bool changed = true; changed;) {
                changed = false;
                const auto needed = results_of(int(gi));
                for (OpId id : std::set<OpId>(m_members[gi])) {
                    if (is_hero(cls(id))) continue;
                    bool used = false;
                    for (OpId u : op_users(id)) used |= in_group(u, int(gi));
                    for (ValueId r : m_g.op(id).results)
                        used |= std::find(needed.begin(), needed.end(), r) != needed.end();
                    if (used) continue;
                    m_members[gi].erase(id);
                    m_groups_of[id].erase(int(gi));
                    changed = true;
                }
            }
        }
    }

    std::vector<FusionGroup> ordered_groups() const {
        // Kahn's algorithm over the group DAG, ties to the group whose first op came first.
        std::map<int, std::set<int>> succ;
        std::map<int, int> indeg;
        std::vector<int> alive;
        for (size_t gi = 0; gi < m_members.size(); ++gi)
            if (m_alive[gi]) {
                alive.push_back(int(gi));
                indeg[int(gi)] = 0;
            }
        for (int h : alive)
            for (ValueId v : external_operands(h)) {
                const int w = writer_of(v);
                if (w < 0 || w == h) continue;
                if (succ[w].insert(h).second) ++indeg[h];
            }
        const auto first_op = [&](int gi) { return *m_members[size_t(gi)].begin(); };
        std::priority_queue<std::pair<OpId, int>, std::vector<std::pair<OpId, int>>, std::greater<>>
            ready;
        for (int h : alive)
            if (indeg[h] == 0) ready.emplace(first_op(h), h);
        std::vector<FusionGroup> out;
        while (!ready.empty()) {
            const int gi = ready.top().second;
            ready.pop();
            FusionGroup fg;
            fg.ops.assign(m_members[size_t(gi)].begin(), m_members[size_t(gi)].end());
            fg.kind = kind_of(gi);
            for (OpId id : fg.ops)
                if (is_hero(cls(id)) && fg.hero == kNoOp) fg.hero = id;
            fg.operands = external_operands(gi);
            fg.results = results_of(gi);
            out.push_back(std::move(fg));
            for (int s : succ[gi])
                if (--indeg[s] == 0) ready.emplace(first_op(s), s);
        }
        if (out.size() != alive.size()) {
            std::string dump;
            for (int h : alive) {
                dump += fmt::format("group {}: ops", h);
                for (OpId id : m_members[size_t(h)])
                    dump += fmt::format(" {}{}", id, m_home[id] == h ? "*" : "");
                dump += " reads";
                for (ValueId v : external_operands(h))
                    dump += fmt::format(" %{}<-g{}", v, writer_of(v));
                dump += "\n";
            }
            throw CompileError("fusion: the fused graph has a cycle (a compiler bug)\n" + dump);
        }
        return out;
    }

    const Graph& m_g;
    const FusionOptions& m_o;
    std::vector<std::vector<OpId>> m_users;
    std::vector<std::set<OpId>> m_members;   // per group
    std::vector<char> m_alive;               // per group
    std::vector<std::set<int>> m_groups_of;  // per op
    std::vector<int> m_home;                 // per op: the group that writes its results
    std::vector<char> m_do_not_duplicate;    // per op
};

}  // namespace

std::vector<FusionGroup> fuse(const Graph& g, const FusionOptions& options) {
    return Fuser(g, options).run();
}

}  // namespace tpu::compiler::detail
