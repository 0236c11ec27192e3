// SPDX-License-Identifier: Apache-2.0
#include "compiler/lazy.h"

#include <algorithm>

#include <fmt/format.h>

namespace tpu::compiler {

namespace detail {

/// A lazy tensor's state: its type, whether it lives across steps, and its current value: a
/// pending graph value (of generation `generation`) or data.
struct TensorState {
    Shape shape;
    std::string name;
    bool parameter = false;
    DataPtr data;
    ValueId value = ~ValueId(0);
    uint64_t generation = 0;
    bool pending() const { return value != ~ValueId(0); }
};

}  // namespace detail

namespace {

/// The host backend's data: one array per replica.
struct HostData : DeviceData {
    std::vector<HostArray> replicas;
};

const HostData& host(const DataPtr& d) {
    const auto* h = dynamic_cast<const HostData*>(d.get());
    if (!h) throw CompileError("host backend: data from another backend");
    return *h;
}

}  // namespace

// ---- HostBackend ------------------------------------------------------------------------------

HostBackend::HostBackend(size_t replicas, EvalOptions options)
    : m_replicas(replicas), m_options(std::move(options)) {
    if (replicas == 0) throw CompileError("host backend: at least one replica");
}

DataPtr HostBackend::upload(const Shape& s, const std::vector<std::vector<float>>& values) {
    if (values.size() != 1 && values.size() != m_replicas)
        throw CompileError(fmt::format("upload {}: {} value sets for {} replicas", s.to_string(),
                                       values.size(), m_replicas));
    auto d = std::make_shared<HostData>();
    d->shape = s;
    for (size_t r = 0; r < m_replicas; ++r)
        d->replicas.push_back(HostArray::from_floats(s, values[values.size() == 1 ? 0 : r]));
    return d;
}

std::vector<float> HostBackend::download(const DataPtr& d, size_t r) {
    return host(d).replicas.at(r).floats();
}

std::vector<DataPtr> HostBackend::execute(const CompiledStep& step,
                                          const std::vector<DataPtr>& parameters,
                                          const std::vector<DataPtr>& inputs) {
    Bindings b;
    b.parameters.resize(m_replicas);
    b.inputs.resize(m_replicas);
    for (size_t r = 0; r < m_replicas; ++r) {
        for (const DataPtr& p : parameters) b.parameters[r].push_back(host(p).replicas.at(r));
        for (const DataPtr& p : inputs) b.inputs[r].push_back(host(p).replicas.at(r));
    }
    const auto out = evaluate_compiled(step, b, m_options);
    std::vector<DataPtr> res;
    for (size_t i = 0; i < step.outputs.size(); ++i) {
        auto d = std::make_shared<HostData>();
        d->shape = step.outputs[i].shape;
        d->layout = step.outputs[i].layout;
        for (size_t r = 0; r < m_replicas; ++r) d->replicas.push_back(out[r][i]);
        res.push_back(std::move(d));
    }
    return res;
}

// ---- LazyTensor ---------------------------------------------------------------------------------

const Shape& LazyTensor::shape() const {
    if (!m_state) throw CompileError("an undefined lazy tensor has no shape");
    return m_state->shape;
}

bool LazyTensor::pending() const {
    return m_state && m_state->pending();
}

// ---- LazyContext
// ----------------------------------------------------------------------------------

LazyContext::LazyContext(Backend& backend, CompileOptions options)
    : m_backend(backend), m_cache(std::move(options)) {}

std::shared_ptr<detail::TensorState> LazyContext::make_state(const Shape& s, std::string name,
                                                             bool param) {
    auto st = std::make_shared<detail::TensorState>();
    st->shape = s;
    st->name = std::move(name);
    st->parameter = param;
    m_live.push_back(st);
    return st;
}

LazyTensor LazyContext::parameter(std::string name, const Shape& s,
                                  std::vector<std::vector<float>> values) {
    auto st = make_state(s, std::move(name), true);
    st->data = m_backend.upload(s, values);
    return LazyTensor(st);
}

LazyTensor LazyContext::input(std::string name, const Shape& s,
                              std::vector<std::vector<float>> values) {
    auto st = make_state(s, std::move(name), false);
    st->data = m_backend.upload(s, values);
    return LazyTensor(st);
}

ValueId LazyContext::value(const LazyTensor& t) {
    if (!t.m_state) throw CompileError("value(): an undefined lazy tensor");
    detail::TensorState& st = *t.m_state;
    if (st.pending()) {
        if (st.generation != m_generation)
            throw CompileError(
                fmt::format("tensor '{}' holds a value of a graph already cut", st.name));
        return st.value;
    }
    for (const auto& [v, d] : m_leaf_data)
        if (d == st.data) return v;
    // Data enters the graph as a leaf: parameters keep their layout (a constraint), inputs are
    // laid out by the compiler (the runtime converts them on transfer).
    const ValueId v = st.parameter ? m_graph.parameter(st.shape, st.name, st.data->layout)
                                   : m_graph.input(st.shape, st.name, st.data->layout);
    m_leaf_data.emplace_back(v, st.data);
    if (st.parameter) m_param_leaves.emplace_back(v, t.m_state);
    return v;
}

LazyTensor LazyContext::wrap(ValueId v, std::string name) {
    if (v >= m_graph.values().size())
        throw CompileError(fmt::format("wrap: %{} is not a value of the pending graph", v));
    auto st = make_state(m_graph.shape(v), std::move(name), false);
    st->value = v;
    st->generation = m_generation;
    return LazyTensor(st);
}

void LazyContext::assign(const LazyTensor& t, ValueId v) {
    if (!t.m_state) throw CompileError("assign: an undefined lazy tensor");
    if (!(m_graph.shape(v) == t.m_state->shape))
        throw CompileError(fmt::format("assign: tensor '{}' is {}, the value {}", t.m_state->name,
                                       t.m_state->shape.to_string(), m_graph.shape(v).to_string()));
    t.m_state->value = v;
    t.m_state->generation = m_generation;
}

void LazyContext::run(const std::vector<std::shared_ptr<detail::TensorState>>& states) {
    if (states.empty()) return;
    std::vector<Output> outs;
    const auto params = m_graph.leaves(OpKind::Parameter);
    for (const auto& st : states) {
        Output o{st->value, st->name, -1};
        // A parameter whose old data this graph read is updated in place.
        if (st->parameter)
            for (const auto& [leaf, weak] : m_param_leaves)
                if (weak.lock() == st) {
                    const auto it = std::find(params.begin(), params.end(), leaf);
                    o.updates_parameter = int64_t(it - params.begin());
                }
        outs.push_back(o);
    }
    std::vector<ValueId> map;
    Graph g = m_graph.extract(outs, &map);
    const uint64_t hits = m_cache.hits();
    const double seconds = m_cache.compile_seconds();
    const auto step = m_cache.get(g);
    if (m_cache.hits() > hits)
        ++m_stats.cached_compiles;
    else
        ++m_stats.uncached_compiles;
    m_stats.compile_seconds += m_cache.compile_seconds() - seconds;
    const auto data_of = [&](ValueId new_leaf) {
        const ValueId old = map.at(new_leaf);
        for (const auto& [v, d] : m_leaf_data)
            if (v == old) return d;
        throw CompileError("lazy: a leaf without data (a compiler bug)");
    };
    std::vector<DataPtr> pdata, idata;
    for (ValueId v : g.leaves(OpKind::Parameter)) pdata.push_back(data_of(v));
    for (ValueId v : g.leaves(OpKind::Input)) idata.push_back(data_of(v));
    const auto results = m_backend.execute(*step, pdata, idata);
    ++m_stats.executions;
    // Leaves now lie in the layouts the step gave them.
    for (size_t i = 0; i < pdata.size(); ++i) pdata[i]->layout = step->parameters[i].layout;
    for (size_t i = 0; i < states.size(); ++i) {
        states[i]->data = results[i];
        states[i]->value = ~ValueId(0);
    }
    m_last = step;
    m_last_graph = std::move(g);
}

std::vector<float> LazyContext::to_host(const LazyTensor& t, size_t r) {
    if (!t.m_state) throw CompileError("to_host: an undefined lazy tensor");
    if (r >= m_backend.replicas())
        throw CompileError(fmt::format("to_host: replica {} of {}", r, m_backend.replicas()));
    if (t.m_state->pending()) {
        ++m_stats.host_syncs;
        run({t.m_state});
    }
    return m_backend.download(t.m_state->data, r);
}

void LazyContext::mark_step() {
    ++m_stats.mark_steps;
    std::vector<std::shared_ptr<detail::TensorState>> pending;
    std::vector<std::weak_ptr<detail::TensorState>> live;
    for (const auto& w : m_live)
        if (auto st = w.lock()) {
            live.push_back(w);
            if (st->pending() && st->generation == m_generation) pending.push_back(st);
        }
    m_live = std::move(live);
    run(pending);
    reset_graph();
}

void LazyContext::reset_graph() {
    m_graph = Graph();
    m_leaf_data.clear();
    m_param_leaves.clear();
    ++m_generation;
}

}  // namespace tpu::compiler
