// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "compiler/ir.h"

/// Internal: passes rewrite a graph by copying it op by op into a new one (recording order is a
/// topological order, so the copy is too). Not a stable API.
namespace tpu::compiler::detail {

class Rewriter {
public:
    explicit Rewriter(const Graph& in) : m_in(in), m_map(in.values().size(), ~ValueId(0)) {}

    const Graph& in() const { return m_in; }
    Graph& out() { return m_out; }
    /// The new value of old value `v`.
    ValueId operator[](ValueId v) const { return m_map.at(v); }
    /// The new values of an op's operands.
    std::vector<ValueId> operands(const Op& op) const {
        std::vector<ValueId> r;
        for (ValueId v : op.operands) r.push_back(m_map.at(v));
        return r;
    }
    /// Maps old value `from` to new value `to`.
    void set(ValueId from, ValueId to) { m_map.at(from) = to; }
    /// Copies `op` unchanged (leaves keep their number order and preset layouts).
    void copy(const Op& op) {
        std::vector<ValueId> res;
        if (op_class(op.kind) == OpClass::Leaf) {
            const Value& v = m_in.value(op.results[0]);
            if (op.kind == OpKind::Parameter)
                res = {m_out.parameter(v.shape, op.name, v.layout)};
            else if (op.kind == OpKind::Input)
                res = {m_out.input(v.shape, op.name, v.layout)};
            else
                res = {m_out.constant(v.shape, m_in.constant_data(op.attrs.axis), op.name)};
        } else {
            const std::string saved = m_out.set_scope(op.name);
            res = m_out.add(op.kind, operands(op), op.attrs);
            m_out.set_scope(saved);
        }
        for (size_t i = 0; i < res.size(); ++i) m_map[op.results[i]] = res[i];
    }
    /// The outputs, mapped; returns the new graph.
    Graph finish() {
        for (const Output& o : m_in.outputs())
            m_out.add_output(m_map.at(o.value), o.name, o.updates_parameter);
        return std::move(m_out);
    }

private:
    const Graph& m_in;
    Graph m_out;
    std::vector<ValueId> m_map;
};

/// Sets the output graph's scope to an op's name while alive (its replacement ops keep it).
class OpScope {
public:
    OpScope(Graph& g, const std::string& name) : m_g(g), m_saved(g.set_scope(name)) {}
    ~OpScope() { m_g.set_scope(std::move(m_saved)); }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

private:
    Graph& m_g;
    std::string m_saved;
};

/// Removes ops whose results nothing needs (no user, not an output); leaves stay.
Graph remove_dead_ops(const Graph& g);

}  // namespace tpu::compiler::detail
