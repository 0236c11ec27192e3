// SPDX-License-Identifier: Apache-2.0
#include "compiler/compiler.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "compiler/codegen_internal.h"
#include "compiler/fusion.h"
#include "compiler/stages.h"

namespace tpu::compiler {

std::string_view fusion_kind_name(FusionKind k) {
    switch (k) {
        case FusionKind::Loop:
            return "loop";
        case FusionKind::Input:
            return "input";
        case FusionKind::Output:
            return "output";
        case FusionKind::Collective:
            return "collective";
        case FusionKind::Custom:
            return "custom";
    }
    return "?";
}

std::string BufferRef::to_string() const {
    switch (space) {
        case Space::Parameter:
            return fmt::format("param({})", index);
        case Space::Input:
            return fmt::format("input({})", index);
        case Space::Constant:
            return fmt::format("const({})", index);
        case Space::Output:
            return fmt::format("out({})", index);
        case Space::Temp:
            return fmt::format("temp[{}+{}]", offset, bytes);
    }
    return "?";
}

namespace {

std::string value_text(const FusionValue& v) {
    return fmt::format("%{} {}{} @{}", v.value, v.shape.to_string(), v.layout.to_string(),
                       v.buffer.to_string());
}

/// "dot+add+maximum": the fusion's distinct op kinds (no literals or broadcasts), hero first.
std::string op_list(const Graph& g, const Fusion& f) {
    std::vector<std::string_view> names;
    const auto push = [&](OpKind k) {
        if (k == OpKind::Literal || k == OpKind::Broadcast) return;
        if (std::find(names.begin(), names.end(), op_name(k)) == names.end())
            names.push_back(op_name(k));
    };
    if (f.hero != kNoOp) push(g.op(f.hero).kind);
    for (OpId id : f.ops) push(g.op(id).kind);
    return fmt::format("{}", fmt::join(names, "+"));
}

}  // namespace

std::string CompiledStep::summary() const {
    std::string s;
    for (const Fusion& f : fusions) {
        s += fmt::format("{:<10} {:<10} {}", f.name, fusion_kind_name(f.kind), op_list(graph, f));
        if (!f.layers.empty()) s += fmt::format(" [{}]", fmt::join(f.layers, ", "));
        s += "\n";
    }
    return s;
}

std::string CompiledStep::to_string() const {
    size_t counts[5] = {0, 0, 0, 0, 0};
    for (const Fusion& f : fusions) ++counts[size_t(f.kind)];
    std::string s = fmt::format(
        "compiled step of graph {:016x}: {} fusions ({} loop, {} input, {} output, {} collective, "
        "{} custom)\n",
        source_hash, fusions.size(), counts[0], counts[1], counts[2], counts[3], counts[4]);
    s += fmt::format(
        "HBM per core: {} parameter + {} input + {} output + {} temp = {} bytes "
        "(temps without reuse: {})\n",
        memory.parameter_bytes, memory.input_bytes, memory.output_bytes, memory.temp_bytes,
        memory.peak_bytes(), memory.temp_unshared_bytes);
    for (const LeafBuffer& b : parameters)
        s += fmt::format("parameter %{} \"{}\" {}{} {} bytes\n", b.value, b.name,
                         b.shape.to_string(), b.layout.to_string(), b.bytes);
    for (const LeafBuffer& b : inputs)
        s += fmt::format("input %{} \"{}\" {}{} {} bytes\n", b.value, b.name, b.shape.to_string(),
                         b.layout.to_string(), b.bytes);
    for (const LeafBuffer& b : constants)
        s += fmt::format("constant %{} \"{}\" {}{} {} bytes\n", b.value, b.name,
                         b.shape.to_string(), b.layout.to_string(), b.bytes);
    for (const Fusion& f : fusions) {
        s += fmt::format("{} {} {}", f.name, fusion_kind_name(f.kind), op_list(graph, f));
        if (!f.layers.empty()) s += fmt::format(" [{}]", fmt::join(f.layers, ", "));
        s += "\n";
        for (const FusionValue& v : f.operands) s += "  in  " + value_text(v) + "\n";
        for (const FusionValue& v : f.results) s += "  out " + value_text(v) + "\n";
        for (const DotPlan& d : f.dots)
            s += fmt::format(
                "  dot %{}: {} x [{}x{}] x [{}x{}], {} stationary (planner: rhs {:.0f}, "
                "lhs {:.0f} cycles)\n",
                graph.op(d.op).results[0], d.batch, d.m, d.k, d.k, d.n,
                d.stationary == Stationary::Rhs ? "rhs" : "lhs", d.rhs_cycles, d.lhs_cycles);
    }
    for (const OutputBuffer& o : outputs) {
        s += fmt::format("output %{} \"{}\" @{}", o.value, o.name, o.buffer.to_string());
        if (o.updates_parameter >= 0)
            s += fmt::format(" updates parameter({})", o.updates_parameter);
        s += "\n";
    }
    return s;
}

namespace {

/// The layers whose ops a fusion computes, in first-use order (literals and broadcasts are shared
/// constants, not a layer's work).
std::vector<std::string> layers_of(const Graph& g, const std::vector<OpId>& ops) {
    std::vector<std::string> out;
    for (OpId id : ops) {
        const OpKind k = g.op(id).kind;
        if (k == OpKind::Literal || k == OpKind::Broadcast) continue;
        const std::string& n = g.op(id).name;
        if (!n.empty() && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    }
    return out;
}

}  // namespace

CompiledStep compile(const Graph& graph, const CompileOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    CompiledStep step;
    step.source_hash = graph.hash();
    for (const Value& v : graph.values())
        if (v.layout.assigned()) check_layout(v.shape, v.layout, "compile");
    // (1)-(3): rewrites.
    Graph g = simplify(decompose(graph));
    if (options.merge_dots) g = simplify(merge_dots(g, options.dot_merge_max_bytes));
    step.graph = std::move(g);
    // (4) Fusion.
    detail::FusionOptions fo;
    fo.multi_output_fusion = options.multi_output_fusion;
    fo.may_duplicate = options.may_duplicate;
    fo.dot_operand_producers = options.dot_operand_producers;
    fo.reductions_into_dots = options.reductions_into_dots;
    fo.mxu_cols = options.board.core.mxu_cols;
    const auto groups = detail::fuse(step.graph, fo);
    for (size_t i = 0; i < groups.size(); ++i) {
        const auto& grp = groups[i];
        Fusion f;
        f.name = fmt::format("fusion.{}", i);
        f.kind = grp.kind;
        f.hero = grp.hero;
        f.ops = grp.ops;
        for (ValueId v : grp.operands)
            f.operands.push_back(FusionValue{v, step.graph.shape(v), {}, {}});
        for (ValueId v : grp.results)
            f.results.push_back(FusionValue{v, step.graph.shape(v), {}, {}});
        f.layers = layers_of(step.graph, f.ops);
        step.fusions.push_back(std::move(f));
    }
    // (5)-(7).
    detail::plan_dots(step, options);
    detail::assign_layouts(step, options);
    // A reduction merged into a dot's fusion that the code generator does not cover stays a
    // fusion of its own: on the host (a fallback) there is no kernel to compute it as it stores
    // the result, and its result would cross the host link besides the dot's.
    for (size_t i = 0; i < step.fusions.size(); ++i) {
        const auto split = gen::split_dot_reduction(step.graph, step.fusions[i]);
        if (!split) continue;
        try {
            (void)gen::plan_dot_fusion(step.graph, split->core, options.board);
        } catch (const NotYetGenerated&) {
            Fusion core = split->core, pass = split->pass;
            core.layers = layers_of(step.graph, core.ops);
            pass.layers = layers_of(step.graph, pass.ops);
            step.fusions[i] = std::move(core);
            step.fusions.insert(step.fusions.begin() + std::ptrdiff_t(i) + 1, std::move(pass));
            for (size_t k = i; k < step.fusions.size(); ++k)
                step.fusions[k].name = fmt::format("fusion.{}", k);
            ++i;
        }
    }
    detail::plan_convolution_scratch(step, options);
    detail::assign_buffers(step, options);
    step.compile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return step;
}

std::shared_ptr<const CompiledStep> CompileCache::get(const Graph& graph) {
    const uint64_t h = graph.hash();
    const std::string fp = graph.fingerprint();
    const auto [lo, hi] = m_steps.equal_range(h);
    for (auto it = lo; it != hi; ++it)
        if (it->second.first == fp) {
            ++m_hits;
            return it->second.second;
        }
    ++m_misses;
    auto step = std::make_shared<const CompiledStep>(compile(graph, m_options));
    m_seconds += step->compile_seconds;
    m_steps.emplace(h, std::make_pair(fp, step));
    return step;
}

size_t CompileCache::size() const {
    return m_steps.size();
}

}  // namespace tpu::compiler
