// SPDX-License-Identifier: Apache-2.0
#include "trainer/record.h"

#include <stdexcept>

#include <fmt/format.h>

#include "trainer/module.h"

namespace tpu::trainer {

namespace cc = tpu::compiler;

std::vector<float> RecordedParameter::initial_values() const {
    std::vector<float> v = param->initial_values();
    if (!transposed) return v;
    std::vector<float> t(v.size());
    for (uint32_t r = 0; r < param->rows; ++r)
        for (uint32_t c = 0; c < param->cols; ++c)
            t[size_t(c) * param->rows + r] = v[size_t(r) * param->cols + c];
    return t;
}

Recorder::Recorder(cc::Graph& g, PrecisionMode mode, std::map<const Parameter*, std::string> names)
    : m_g(g),
      // The eager trainer's matmul precision (Runtime::matmul_precision): fp32-3pass in 32-true.
      m_linear(mode == PrecisionMode::True32 ? cc::Precision::High : cc::Precision::Default),
      m_names(std::move(names)) {
    if (mode == PrecisionMode::Bf16True)
        throw std::invalid_argument(
            "bf16-true: recording into the compiler does not round every activation to bf16 yet "
            "(use 32-true or bf16-mixed)");
}

Recorder::Recorder(cc::LazyContext& ctx, PrecisionMode mode,
                   std::map<const Parameter*, std::string> names)
    : Recorder(ctx.graph(), mode, std::move(names)) {
    m_ctx = &ctx;
}

void Recorder::new_step() {
    m_in_graph.assign(m_params.size(), false);
}

cc::ValueId Recorder::param(const ParamPtr& p, std::vector<int64_t> dims, bool transposed) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    if (uint64_t(n) != uint64_t(p->rows) * p->cols)
        throw std::invalid_argument(fmt::format(
            "recording: a {} x {} parameter viewed with {} values", p->rows, p->cols, n));
    for (size_t i = 0; i < m_params.size(); ++i) {
        RecordedParameter& rp = m_params[i];
        if (rp.param != p) continue;
        if (rp.transposed != transposed || rp.dims != dims)
            throw std::invalid_argument(
                fmt::format("recording: parameter {} is used in two layouts", rp.name));
        if (m_ctx && !m_in_graph[i]) {
            rp.value = m_ctx->value(rp.tensor);
            m_in_graph[i] = true;
        }
        return rp.value;
    }
    const auto it = m_names.find(p.get());
    RecordedParameter rp;
    rp.name = it != m_names.end() ? it->second : fmt::format("param.{}", m_params.size());
    rp.param = p;
    rp.transposed = transposed;
    rp.dims = dims;
    const cc::Shape shape{cc::DType::F32, std::move(dims)};
    if (m_ctx) {
        rp.tensor = m_ctx->parameter(rp.name, shape, {rp.initial_values()});
        rp.value = m_ctx->value(rp.tensor);
    } else {
        rp.value = m_g.parameter(shape, rp.name);
    }
    m_params.push_back(rp);
    m_in_graph.push_back(true);
    return rp.value;
}

Recorder::Scope::Scope(cc::Graph& g, const std::string& name)
    : m_g(g), m_previous(name.empty() ? g.scope() : g.set_scope(name)) {}

std::map<const Parameter*, std::string> parameter_names(const Module& module) {
    std::map<const Parameter*, std::string> names;
    for (const auto& [name, p] : module.named_parameters()) names.emplace(p.get(), name);
    return names;
}

namespace {

cc::Shape input_shape(const Module& module, uint32_t rows, uint32_t features) {
    return module.token_input() ? cc::Shape{cc::DType::S32, {rows}}
                                : cc::Shape{cc::DType::F32, {rows, features}};
}

}  // namespace

cc::LazyTensor record_forward_step(cc::LazyContext& ctx, Recorder& r, Module& module, uint32_t rows,
                                   uint32_t features, std::vector<std::vector<float>> inputs) {
    const cc::LazyTensor x = ctx.input("x", input_shape(module, rows, features), std::move(inputs));
    return ctx.wrap(module.record_forward(r, ctx.value(x)), "y");
}

RecordedModel record_inference(Module& module, uint32_t rows, uint32_t features,
                               PrecisionMode mode) {
    RecordedModel m;
    Recorder r(m.graph, mode, parameter_names(module));
    m.input = m.graph.input(input_shape(module, rows, features), "x");
    m.output = module.record_forward(r, m.input);
    m.graph.add_output(m.output, "y");
    m.parameters = r.parameters();
    return m;
}

std::vector<float> recorded_input_values(const Dataset& d, uint32_t first, uint32_t count) {
    if (uint64_t(first) + count > d.count)
        throw std::invalid_argument(fmt::format("examples {}..{} of a dataset of {}", first,
                                                uint64_t(first) + count, d.count));
    std::vector<float> v;
    if (d.context) {
        v.reserve(size_t(count) * d.context);
        for (uint32_t e = first; e < first + count; ++e)
            for (uint32_t t = 0; t < d.context; ++t)
                v.push_back(float(d.tokens[uint64_t(e) * d.stride + t]));
        return v;
    }
    const size_t per = size_t(d.rows) * d.features;
    return {d.x.begin() + ptrdiff_t(first * per), d.x.begin() + ptrdiff_t((first + count) * per)};
}

}  // namespace tpu::trainer
