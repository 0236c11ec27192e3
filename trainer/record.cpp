// SPDX-License-Identifier: Apache-2.0
#include "trainer/record.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "driver/kernels/vector_ops.h"
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
        // A timing-only board keeps no values: drawing them would cost host time for nothing.
        std::vector<float> values;
        if (m_ctx->keeps_values()) values = rp.initial_values();
        rp.tensor = m_ctx->parameter(rp.name, shape, {std::move(values)});
        rp.value = m_ctx->value(rp.tensor);
    } else {
        rp.value = m_g.parameter(shape, rp.name);
    }
    m_params.push_back(rp);
    m_in_graph.push_back(true);
    return rp.value;
}

Recorder::Scope Recorder::layer(const std::string& name, std::string_view kind) {
    if (!name.empty() && std::none_of(m_layers.begin(), m_layers.end(),
                                      [&](const auto& l) { return l.first == name; }))
        m_layers.emplace_back(name, std::string(kind));
    return Scope(m_g, name);
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
    m.layers = r.layers();
    return m;
}

double op_flops(const cc::Graph& g, const cc::Op& op) {
    const auto elements = [&](cc::ValueId v) { return double(g.shape(v).elements()); };
    if (op.results.empty()) return 0;
    const double out = elements(op.results[0]);
    switch (cc::op_class(op.kind)) {
        case cc::OpClass::Leaf:
        case cc::OpClass::Literal:
        case cc::OpClass::Movement:
            return 0;
        case cc::OpClass::Reduce:
            return elements(op.operands.at(0));
        case cc::OpClass::Contraction: {
            if (op.kind == cc::OpKind::Dot) {
                double k = 1;
                for (int64_t d : op.attrs.dot.lhs_contracting)
                    k *= double(g.shape(op.operands[0]).dims.at(size_t(d)));
                return 2 * out * k;
            }
            // Convolutions: every output (or gradient) element is a dot of the window with k·k·C
            // multiply-adds; the filter is HWIO, so that is its elements over its last dim.
            const cc::Shape& w = g.shape(
                op.kind == cc::OpKind::Conv2dFilterGrad ? op.results[0] : op.operands.at(1));
            const double window =
                double(w.elements()) / double(std::max<int64_t>(1, w.dims.back()));
            if (op.kind == cc::OpKind::Conv2dFilterGrad)
                return 2 * elements(op.operands.at(1)) * window;
            return 2 * out * window;
        }
        case cc::OpClass::Window:
            return out *
                   double(std::max<int64_t>(1, op.attrs.window.kernel * op.attrs.window.kernel));
        default:
            return out;
    }
}

std::vector<CompiledLayer> attribute_fusion_cycles(
    const cc::CompiledStep& step, const std::vector<uint64_t>& fusion_cycles,
    const std::vector<std::pair<std::string, std::string>>& kinds) {
    if (fusion_cycles.size() != step.fusions.size())
        throw std::invalid_argument(fmt::format("{} fusion cycle counts for {} fusions",
                                                fusion_cycles.size(), step.fusions.size()));
    std::vector<CompiledLayer> rows;
    for (const auto& [name, kind] : kinds) rows.push_back({name, kind});
    const auto row = [&](const std::string& name) -> CompiledLayer& {
        for (CompiledLayer& r : rows)
            if (r.name == name) return r;
        rows.push_back({name, name == "other" ? "outside every layer" : ""});
        return rows.back();
    };
    const cc::Graph& g = step.graph;
    for (size_t i = 0; i < step.fusions.size(); ++i) {
        const cc::Fusion& f = step.fusions[i];
        std::vector<std::pair<std::string, double>> weights;  // per layer, first-use order
        const auto weigh = [&](const std::string& layer, double flops) {
            if (layer.empty()) return;
            auto it = std::find_if(weights.begin(), weights.end(),
                                   [&](const auto& w) { return w.first == layer; });
            if (it == weights.end()) it = weights.insert(weights.end(), {layer, 0.0});
            it->second += flops;
        };
        for (cc::OpId id : f.ops) {
            const cc::Op& op = g.op(id);
            // A merged dot (Q, K and V as one) read only through slices in its fusion: each
            // slice's layer gets the flops of its columns.
            std::vector<const cc::Op*> slices;
            bool only_slices = op.kind == cc::OpKind::Dot;
            for (cc::OpId u : f.ops) {
                if (!only_slices) break;
                const cc::Op& user = g.op(u);
                if (std::find(user.operands.begin(), user.operands.end(), op.results[0]) ==
                    user.operands.end())
                    continue;
                if (user.kind == cc::OpKind::Slice)
                    slices.push_back(&user);
                else
                    only_slices = false;
            }
            if (only_slices && slices.size() > 1) {
                const double out = double(g.shape(op.results[0]).elements());
                for (const cc::Op* sl : slices)
                    weigh(sl->name,
                          op_flops(g, op) * double(g.shape(sl->results[0]).elements()) / out);
                continue;
            }
            weigh(op.name, op_flops(g, op));
        }
        if (weights.empty()) weights.emplace_back("other", 0.0);
        double total = 0;
        for (const auto& w : weights) total += w.second;
        uint64_t given = 0;
        size_t largest = 0;
        std::vector<uint64_t> share(weights.size());
        for (size_t j = 0; j < weights.size(); ++j) {
            const double frac =
                total > 0 ? weights[j].second / total : 1.0 / double(weights.size());
            share[j] = uint64_t(std::floor(frac * double(fusion_cycles[i])));
            given += share[j];
            if (share[j] > share[largest]) largest = j;
        }
        share[largest] += fusion_cycles[i] - given;
        for (size_t j = 0; j < weights.size(); ++j) {
            CompiledLayer& r = row(weights[j].first);
            r.cycles += share[j];
            r.flops += weights[j].second;
            ++r.fusions;
        }
    }
    // "other" last; layers that no fusion computes (an identity) are dropped.
    std::stable_partition(rows.begin(), rows.end(),
                          [](const CompiledLayer& r) { return r.name != "other"; });
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [](const CompiledLayer& r) { return r.fusions == 0; }),
               rows.end());
    return rows;
}

std::vector<cc::ValueId> record_gradients(cc::Graph& g, cc::ValueId y, cc::ValueId dy,
                                          const std::vector<cc::ValueId>& wrt) {
    // Values on a path from a wrt value to y: only those get gradients.
    std::vector<bool> from(g.values().size(), false);
    for (cc::ValueId v : wrt) from.at(v) = true;
    for (const cc::Op& op : g.ops())
        for (cc::ValueId o : op.operands)
            if (from[o])
                for (cc::ValueId res : op.results) from[res] = true;
    std::map<cc::ValueId, cc::ValueId> grad;
    const auto accumulate = [&](cc::ValueId v, cc::ValueId d) {
        if (!from[v]) return;
        const auto it = grad.find(v);
        if (it == grad.end())
            grad.emplace(v, d);
        else
            it->second = cc::add(g, it->second, d);
    };
    accumulate(y, dy);
    const size_t n_ops = g.ops().size();  // ops recorded from here on are the backward's
    for (size_t i = n_ops; i-- > 0;) {
        const cc::Op& op = g.op(cc::OpId(i));
        if (op.results.size() != 1) {
            for (cc::ValueId res : op.results)
                if (grad.count(res))
                    throw std::invalid_argument(fmt::format(
                        "record_gradients: the backward of op {} (in {}) is not recorded yet",
                        cc::op_name(op.kind), op.name.empty() ? "no layer" : op.name));
            continue;
        }
        const auto it = grad.find(op.results[0]);
        if (it == grad.end() || op.operands.empty()) continue;  // leaves end the chain
        const cc::ValueId d = it->second;
        const cc::Op fwd = op;  // the deque may grow while the rules record
        // A layer's backward counts towards the layer, as in the eager table.
        const Recorder::Scope scope(g, fwd.name.empty() ? std::string("backward") : fwd.name);
        const auto& in = fwd.operands;
        const auto needs = [&](size_t k) { return from[in[k]]; };
        const cc::Shape xs = in.empty() ? cc::Shape{} : g.shape(in[0]);
        switch (fwd.kind) {
            case cc::OpKind::Add:
                accumulate(in[0], d);
                accumulate(in[1], d);
                break;
            case cc::OpKind::Sub:
                accumulate(in[0], d);
                if (needs(1)) accumulate(in[1], cc::neg(g, d));
                break;
            case cc::OpKind::Div:
                if (needs(1))
                    throw std::invalid_argument(
                        "record_gradients: a division by a value that needs a gradient");
                accumulate(in[0], cc::div(g, d, in[1]));
                break;
            case cc::OpKind::Relu: {
                const cc::ValueId zero = cc::full(g, 0.0, xs);
                accumulate(in[0],
                           cc::select(g, cc::compare(g, in[0], zero, cc::Comparison::Gt), d, zero));
                break;
            }
            case cc::OpKind::Reshape:
                accumulate(in[0], cc::reshape(g, d, xs.dims));
                break;
            case cc::OpKind::Broadcast: {
                std::vector<int64_t> reduced;
                const cc::Shape& ys = g.shape(fwd.results[0]);
                for (int64_t k = 0; k < ys.rank(); ++k)
                    if (std::find(fwd.attrs.dims.begin(), fwd.attrs.dims.end(), k) ==
                        fwd.attrs.dims.end())
                        reduced.push_back(k);
                cc::ValueId r = reduced.empty() ? d : cc::reduce(g, d, reduced, cc::Reducer::Sum);
                if (g.shape(r).dims != xs.dims) r = cc::reshape(g, r, xs.dims);
                accumulate(in[0], r);
                break;
            }
            case cc::OpKind::Reduce: {
                if (fwd.attrs.reducer != cc::Reducer::Sum)
                    throw std::invalid_argument("record_gradients: a max reduction");
                std::vector<int64_t> kept;
                for (int64_t k = 0; k < xs.rank(); ++k)
                    if (std::find(fwd.attrs.dims.begin(), fwd.attrs.dims.end(), k) ==
                        fwd.attrs.dims.end())
                        kept.push_back(k);
                accumulate(in[0], cc::broadcast(g, d, xs.dims, kept));
                break;
            }
            case cc::OpKind::Dot: {
                const cc::DotDims& dd = fwd.attrs.dot;
                const cc::Shape& ws = g.shape(in[1]);
                if (!dd.lhs_batch.empty() || xs.rank() != 2 || ws.rank() != 2 ||
                    dd.lhs_contracting != std::vector<int64_t>{1} ||
                    dd.rhs_contracting != std::vector<int64_t>{1})
                    throw std::invalid_argument(
                        "record_gradients: a dot other than a linear layer's x W^T");
                if (needs(0)) {  // dx = dy W: [B, out] x [out, in]
                    cc::DotDims dx;
                    dx.lhs_contracting = {1};
                    dx.rhs_contracting = {0};
                    accumulate(in[0], cc::dot(g, d, in[1], dx, fwd.attrs.precision));
                }
                if (needs(1)) {  // dW = dy^T x: [out, in]
                    cc::DotDims dw;
                    dw.lhs_contracting = {0};
                    dw.rhs_contracting = {0};
                    accumulate(in[1], cc::dot(g, d, in[0], dw, fwd.attrs.precision));
                }
                break;
            }
            case cc::OpKind::Conv2d: {
                const cc::Window& w = fwd.attrs.window;
                if (needs(0))
                    accumulate(in[0], cc::conv2d_input_grad(g, d, in[1], xs.dims, w.stride, w.pad,
                                                            fwd.attrs.precision));
                if (needs(1))
                    accumulate(in[1], cc::conv2d_filter_grad(g, in[0], d, w.kernel, w.stride, w.pad,
                                                             fwd.attrs.precision));
                break;
            }
            case cc::OpKind::Pool: {
                const cc::Window& w = fwd.attrs.window;
                accumulate(in[0],
                           fwd.attrs.pool == cc::PoolKind::Max
                               ? cc::max_pool_grad(g, in[0], d, w.kernel, w.stride, w.pad)
                               : cc::avg_pool_grad(g, d, xs.dims, w.kernel, w.stride, w.pad));
                break;
            }
            default:
                throw std::invalid_argument(fmt::format(
                    "record_gradients: the backward of op {} (in {}) is not recorded yet",
                    cc::op_name(fwd.kind), fwd.name.empty() ? "no layer" : fwd.name));
        }
    }
    std::vector<cc::ValueId> out;
    for (cc::ValueId v : wrt) {
        const auto it = grad.find(v);
        out.push_back(it != grad.end() ? it->second : cc::full(g, 0.0, g.shape(v)));
    }
    return out;
}

cc::LazyTensor record_train_step(cc::LazyContext& ctx, Recorder& r, Module& module, uint32_t rows,
                                 uint32_t features, uint32_t classes,
                                 std::vector<std::vector<float>> inputs,
                                 std::vector<std::vector<float>> onehot, uint32_t step,
                                 size_t replicas) {
    if (step == 0) throw std::invalid_argument("record_train_step: steps count from 1");
    cc::Graph& g = ctx.graph();
    const cc::LazyTensor x = ctx.input("x", input_shape(module, rows, features), std::move(inputs));
    const cc::LazyTensor y =
        ctx.input("onehot", cc::Shape{cc::DType::F32, {rows, classes}}, std::move(onehot));
    const cc::ValueId logits = module.record_forward(r, ctx.value(x));
    if (g.shape(logits).dims != std::vector<int64_t>{rows, classes})
        throw std::invalid_argument(fmt::format(
            "record_train_step: the forward gives {}, not the logits of {} x {} labels (a training "
            "step that adds a head to the forward, as bert-block's, is not recorded yet)",
            g.shape(logits).to_string(), rows, classes));
    cc::ValueId loss, dlogits;
    {
        const auto scope = r.layer("loss", "cross_entropy");
        loss = cc::cross_entropy(g, logits, ctx.value(y));
        // The eager seed: (softmax - onehot) * fp32(1 / rows).
        const cc::ValueId p = cc::softmax(g, logits, 1);
        dlogits = cc::mul(g, cc::sub(g, p, ctx.value(y)),
                          cc::full(g, double(1.0f / float(rows)), g.shape(logits)));
    }
    std::vector<RecordedParameter>& params = r.parameters();
    std::vector<cc::ValueId> wrt;
    for (const RecordedParameter& p : params) wrt.push_back(p.value);
    std::vector<cc::ValueId> grads;
    grads = record_gradients(g, logits, dlogits, wrt);
    const OptimizerConfig opt = module.configure_optimizers();
    cc::LazyTensor lr, lr_c1, c2;
    if (opt.kind == OptimizerConfig::Kind::Sgd) {
        lr = ctx.input("lr", cc::Shape{cc::DType::F32, {}}, {{opt.lr}});
    } else {
        const driver::AdamScalars k =
            driver::adam_scalars(opt.lr, opt.beta1, opt.beta2, opt.eps, step);
        lr_c1 = ctx.input("lr_c1", cc::Shape{cc::DType::F32, {}}, {{k.lr_c1}});
        c2 = ctx.input("c2", cc::Shape{cc::DType::F32, {}}, {{k.c2}});
    }
    for (size_t i = 0; i < params.size(); ++i) {
        RecordedParameter& p = params[i];
        const cc::Shape& s = g.shape(p.value);
        cc::ValueId grad;
        {
            const auto scope = r.layer("allreduce", "gradient all-reduce");
            grad = cc::all_reduce(g, grads[i], 1.0 / double(replicas));
        }
        const auto scope = r.layer(
            "optimizer", opt.kind == OptimizerConfig::Kind::Sgd ? "sgd (momentum)" : "adam");
        const std::vector<float> zeros(ctx.keeps_values() ? size_t(s.elements()) : 0, 0.0f);
        if (!p.state1.defined()) p.state1 = ctx.parameter(p.name + ".state1", s, {zeros});
        if (opt.kind == OptimizerConfig::Kind::Sgd) {
            const cc::SgdResult u = cc::sgd_momentum(g, p.value, grad, ctx.value(p.state1),
                                                     ctx.value(lr), opt.momentum);
            ctx.assign(p.tensor, u.w);
            ctx.assign(p.state1, u.v);
        } else {
            if (!p.state2.defined()) p.state2 = ctx.parameter(p.name + ".state2", s, {zeros});
            const cc::AdamResult u =
                cc::adam(g, p.value, grad, ctx.value(p.state1), ctx.value(p.state2),
                         ctx.value(lr_c1), ctx.value(c2), opt.beta1, opt.beta2, opt.eps);
            ctx.assign(p.tensor, u.w);
            ctx.assign(p.state1, u.m);
            ctx.assign(p.state2, u.v);
        }
    }
    return ctx.wrap(loss, "loss");
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
