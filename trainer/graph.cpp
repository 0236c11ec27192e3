// SPDX-License-Identifier: Apache-2.0
#include "trainer/graph.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "driver/kernels/attention.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::trainer {

using driver::Tensor;

Runtime::Runtime(driver::Device& dev, driver::ProgramCache& cache, std::vector<uint32_t> cores,
                 PrecisionMode mode, Metrics& metrics)
    : m_dev(dev), m_cache(cache), m_cores(std::move(cores)), m_mode(mode), m_metrics(metrics) {}

Runtime::~Runtime() {
    // Frees scratch without throwing out of a destructor; the device reports misuse itself.
    try {
        end_step();
    } catch (...) {
    }
}

driver::Precision Runtime::matmul_precision() const {
    return m_mode == PrecisionMode::True32 ? driver::Precision::Fp32Pass3 : driver::Precision::Bf16;
}

Tensor Runtime::scratch(uint32_t rows, uint32_t cols) {
    m_scratch.push_back(driver::alloc_tensor(m_dev, m_cores, rows, cols));
    return m_scratch.back();
}

Var Runtime::leaf(uint32_t rows, uint32_t cols) {
    auto n = std::make_shared<Node>();
    n->value = scratch(rows, cols);
    return n;
}

Var Runtime::param(Parameter& p) {
    if (!p.placed())
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  "a parameter is used before the trainer placed it on the cores");
    for (const auto& [q, v] : m_params)
        if (q == &p) return v;
    auto n = std::make_shared<Node>();
    n->value = p.value;
    n->grad = p.grad;
    n->requires_grad = m_training;
    n->owns_grad = false;
    m_params.emplace_back(&p, n);
    return n;
}

std::vector<Parameter*> Runtime::params_without_grad() const {
    std::vector<Parameter*> out;
    for (const auto& [p, v] : m_params)
        if (!v->has_grad) out.push_back(p);
    return out;
}

Var Runtime::make(uint32_t rows, uint32_t cols, bool requires_grad) {
    auto n = std::make_shared<Node>();
    n->value = scratch(rows, cols);
    n->requires_grad = requires_grad;
    n->layer = m_layer;
    if (requires_grad) m_tape.push_back(n);
    return n;
}

LayerScope::~LayerScope() {
    m_rt->m_layer = m_previous;
}

LayerScope Runtime::layer(const std::string& name, std::string_view kind) {
    const int previous = m_layer;
    if (!name.empty()) {
        auto it = std::find_if(m_layers.begin(), m_layers.end(),
                               [&](const LayerProfile& p) { return p.name == name; });
        if (it == m_layers.end()) {
            LayerProfile p;
            p.name = name;
            p.kind = std::string(kind);
            p.work.name = name;
            m_layers.push_back(std::move(p));
            it = m_layers.end() - 1;
        }
        m_layer = int(it - m_layers.begin());
    }
    return LayerScope(*this, previous);
}

void Runtime::exec(std::string_view kernel, const std::function<driver::Event()>& call) {
    const driver::KernelStats k0 = m_layer >= 0 ? m_dev.kernel_totals() : driver::KernelStats{};
    const uint64_t c0 = m_dev.now_cycle();
    try {
        call();
    } catch (const driver::DeviceError& e) {
        throw driver::DeviceError(e.kind(), fmt::format("{}: {}", kernel, e.what()));
    }
    // The trainer turns calls and compiles into its per-graph metrics (ExecuteTime, CompileTime)
    // and the host timeline: each kernel call stands for an op recorded into the step's graph.
    ++m_kernel_calls;
    const int last = std::exchange(m_last_layer, m_layer);
    if (m_layer >= 0) {
        LayerProfile& p = m_layers[size_t(m_layer)];
        if (p.work.launches == 0) p.first_cycle = c0;
        p.last_cycle = m_dev.now_cycle();
        if (last == m_layer && !p.spans.empty())
            p.spans.back().second = p.last_cycle;
        else
            p.spans.emplace_back(c0, p.last_cycle);
        p.work += m_dev.kernel_totals().since(k0);
    }
}

void Runtime::cpu_fallback(std::string_view op) {
    std::string name(op);
    if (name.rfind("aten::", 0) != 0) name = "aten::" + name;
    // PyTorch/XLA counts each op that fell back to the CPU under its aten:: name.
    m_metrics.count(name);
    m_fallbacks.push_back(std::move(name));
}

std::vector<std::string> Runtime::take_cpu_fallbacks() {
    return std::exchange(m_fallbacks, {});
}

std::vector<float> Parameter::initial_values() const {
    std::vector<float> v(size_t(rows) * cols);
    if (init) init(v);
    return v;
}

void Runtime::upload(const Tensor& t, size_t index, const std::vector<float>& values) {
    const uint64_t c0 = m_dev.metrics().h2d_cycles;
    const auto t0 = std::chrono::steady_clock::now();
    driver::write_tensor(m_dev, t, index, values);
    const double host =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m_metrics.add_time("TransferToDeviceTime",
                       m_dev.config().clock().seconds(double(m_dev.metrics().h2d_cycles - c0)),
                       host);
    m_metrics.add_data("InboundData", t.bytes());
}

void Runtime::upload_timing(const Tensor& t, size_t index) {
    const uint64_t c0 = m_dev.metrics().h2d_cycles;
    const auto t0 = std::chrono::steady_clock::now();
    m_dev.write_timing(t.bufs.at(index), t.bytes());
    const double host =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m_metrics.add_time("TransferToDeviceTime",
                       m_dev.config().clock().seconds(double(m_dev.metrics().h2d_cycles - c0)),
                       host);
    m_metrics.add_data("InboundData", t.bytes());
}

std::vector<float> Runtime::download(const Tensor& t, size_t index) {
    const uint64_t c0 = m_dev.metrics().d2h_cycles;
    const auto t0 = std::chrono::steady_clock::now();
    auto out = driver::read_tensor(m_dev, t, index);
    const double host =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m_metrics.add_time("TransferFromDeviceTime",
                       m_dev.config().clock().seconds(double(m_dev.metrics().d2h_cycles - c0)),
                       host);
    m_metrics.add_data("OutboundData", t.bytes());
    m_metrics.count("HostSync");
    return out;
}

Tensor Runtime::grad_target(const Var& x, bool& accumulate) {
    accumulate = x->has_grad;
    if (accumulate) return scratch(x->value.rows, x->value.cols);
    if (x->owns_grad) x->grad = scratch(x->value.rows, x->value.cols);
    x->has_grad = true;
    return x->grad;
}

void Runtime::finish_grad(const Var& x, const Tensor& g, bool accumulate) {
    if (!accumulate) return;
    exec("grad_accumulate", [&] { return driver::add(m_dev, m_cache, x->grad, g, x->grad); });
}

void Runtime::backward(const Var& loss) {
    if (!loss->has_grad)
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  "backward: the value is not a loss (it has no gradient seed)");
    const int outside = m_layer;
    for (auto it = m_tape.rbegin(); it != m_tape.rend(); ++it) {
        Node& n = **it;
        m_layer = n.layer;  // a layer's backward kernels count towards that layer
        if (n.has_grad && n.backward) n.backward();
    }
    m_layer = outside;
    for (const Var& v : m_tape) v->backward = nullptr;  // break cycles through captures
    m_tape.clear();
}

void Runtime::end_step() {
    for (const Var& v : m_tape) v->backward = nullptr;
    m_tape.clear();
    m_params.clear();
    for (Tensor& t : m_scratch) driver::free_tensor(m_dev, t);
    m_scratch.clear();
}

namespace {

bool needs(const Var& v) {
    return v && v->requires_grad;
}

/// Rounds an op's output to bf16 in "bf16-true".
void maybe_round(Runtime& rt, const Var& y) {
    if (rt.mode() != PrecisionMode::Bf16True) return;
    rt.exec("round_bf16",
            [&] { return driver::round_bf16(rt.device(), rt.cache(), y->value, y->value); });
}

void check_cols(const char* op, const Tensor& a, uint32_t cols, const char* what) {
    if (a.cols != cols)
        throw driver::DeviceError(
            driver::ErrorKind::Usage,
            fmt::format("{}: {} has {} columns, expected {}", op, what, a.cols, cols));
}

}  // namespace

Var linear(Runtime& rt, const Var& x, const Var& w, const Var& b) {
    const Tensor &X = x->value, &W = w->value;
    if (X.cols != W.rows)
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  fmt::format("linear: input has {} features, the weight "
                                              "expects {} ({} x {})",
                                              X.cols, W.rows, W.rows, W.cols));
    if (b) check_cols("linear", b->value, W.cols, "the bias");
    const bool grad = needs(x) || needs(w) || needs(b);
    Var y = rt.make(X.rows, W.cols, grad);
    const auto prec = rt.matmul_precision();
    // The bias rides the matmul's epilogue: one launch, C written once.
    rt.exec("linear.matmul", [&] {
        return driver::matmul(rt.device(), rt.cache(), X, false, W, false, y->value, prec,
                              b ? &b->value : nullptr);
    });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, w, b, yp, prec] {
        const Tensor& dY = yp->grad;
        auto& dev = rt.device();
        auto& cache = rt.cache();
        if (needs(w)) {
            bool acc = false;
            Tensor dW = rt.grad_target(w, acc);
            rt.exec("linear.dweight", [&] {
                return driver::matmul(dev, cache, x->value, true, dY, false, dW, prec);
            });
            rt.finish_grad(w, dW, acc);
        }
        if (needs(b)) {
            bool acc = false;
            Tensor db = rt.grad_target(b, acc);
            rt.exec("linear.dbias", [&] { return driver::col_sum(dev, cache, dY, db); });
            rt.finish_grad(b, db, acc);
        }
        if (needs(x)) {
            bool acc = false;
            Tensor dX = rt.grad_target(x, acc);
            rt.exec("linear.dinput", [&] {
                return driver::matmul(dev, cache, dY, false, w->value, true, dX, prec);
            });
            rt.finish_grad(x, dX, acc);
        }
    };
    return y;
}

namespace {

/// An elementwise op y = f(x) whose backward is dx = g(x, dy).
Var unary(Runtime& rt, const Var& x, const char* name,
          driver::Event (*fwd)(driver::Device&, driver::ProgramCache&, const Tensor&,
                               const Tensor&),
          driver::Event (*bwd)(driver::Device&, driver::ProgramCache&, const Tensor&, const Tensor&,
                               const Tensor&)) {
    Var y = rt.make(x->value.rows, x->value.cols, needs(x));
    rt.exec(name, [&] { return fwd(rt.device(), rt.cache(), x->value, y->value); });
    maybe_round(rt, y);
    if (!needs(x)) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, yp, name, bwd] {
        bool acc = false;
        Tensor dX = rt.grad_target(x, acc);
        rt.exec(std::string(name) + ".grad",
                [&] { return bwd(rt.device(), rt.cache(), x->value, yp->grad, dX); });
        rt.finish_grad(x, dX, acc);
    };
    return y;
}

}  // namespace

Var relu(Runtime& rt, const Var& x) {
    return unary(rt, x, "relu", &driver::relu, &driver::relu_grad);
}

Var gelu(Runtime& rt, const Var& x) {
    return unary(rt, x, "gelu", &driver::gelu, &driver::gelu_grad);
}

Var dropout(Runtime& rt, const Var& x, float p, uint32_t seed) {
    if (!(p >= 0.0f && p < 1.0f))
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  fmt::format("dropout probability has to be between 0 and 1, "
                                              "but got {}",
                                              p));
    if (!rt.training() || p == 0.0f) return x;
    Var y = rt.make(x->value.rows, x->value.cols, needs(x));
    Tensor mask = rt.scratch(x->value.rows, x->value.cols);
    rt.exec("dropout", [&] {
        return driver::dropout(rt.device(), rt.cache(), x->value, p, seed, mask, y->value);
    });
    if (!needs(x)) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, yp, mask] {
        bool acc = false;
        Tensor dX = rt.grad_target(x, acc);
        rt.exec("dropout.grad",
                [&] { return driver::mul(rt.device(), rt.cache(), yp->grad, mask, dX); });
        rt.finish_grad(x, dX, acc);
    };
    return y;
}

Var layer_norm(Runtime& rt, const Var& x, const Var& gamma, const Var& beta, float eps) {
    check_cols("layer_norm", gamma->value, x->value.cols, "gamma");
    check_cols("layer_norm", beta->value, x->value.cols, "beta");
    const bool grad = needs(x) || needs(gamma) || needs(beta);
    Var y = rt.make(x->value.rows, x->value.cols, grad);
    Tensor mean = rt.scratch(x->value.rows, 1), rstd = rt.scratch(x->value.rows, 1);
    rt.exec("layer_norm", [&] {
        return driver::layer_norm(rt.device(), rt.cache(), x->value, gamma->value, beta->value, eps,
                                  y->value, mean, rstd);
    });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, gamma, beta, yp, mean, rstd] {
        // The kernel produces all three gradients; unused ones go to scratch.
        bool ax = false, ag = false, ab = false;
        Tensor dX = needs(x) ? rt.grad_target(x, ax) : rt.scratch(x->value.rows, x->value.cols);
        Tensor dG = needs(gamma) ? rt.grad_target(gamma, ag) : rt.scratch(1, x->value.cols);
        Tensor dB = needs(beta) ? rt.grad_target(beta, ab) : rt.scratch(1, x->value.cols);
        rt.exec("layer_norm.grad", [&] {
            return driver::layer_norm_grad(rt.device(), rt.cache(), x->value, yp->grad,
                                           gamma->value, mean, rstd, dX, dG, dB);
        });
        if (needs(x)) rt.finish_grad(x, dX, ax);
        if (needs(gamma)) rt.finish_grad(gamma, dG, ag);
        if (needs(beta)) rt.finish_grad(beta, dB, ab);
    };
    return y;
}

namespace {

/// Sends dY, unchanged, into the gradient of x: the gradient of an identity path.
void pass_grad(Runtime& rt, const Var& x, const Tensor& dY, bool alias) {
    if (!needs(x)) return;
    if (x->has_grad) {
        rt.exec("grad_accumulate",
                [&] { return driver::add(rt.device(), rt.cache(), x->grad, dY, x->grad); });
    } else if (alias && x->owns_grad) {
        // The output's gradient is read by nothing after this backward, so x can take it over.
        x->grad = dY;
        x->has_grad = true;
    } else {
        bool acc = false;
        Tensor dX = rt.grad_target(x, acc);
        rt.exec("grad_copy", [&] { return driver::copy(rt.device(), rt.cache(), dY, dX); });
    }
}

/// `t` seen as `rows` x (elements / rows): the same bytes, another row length.
Tensor reshaped(const Tensor& t, uint32_t rows) {
    return driver::view(t, 0, rows, uint32_t(t.elements() / rows));
}

}  // namespace

Var add(Runtime& rt, const Var& a, const Var& b) {
    driver::check_same(a->value, b->value, "add: the operands");
    const bool grad = needs(a) || needs(b);
    Var y = rt.make(a->value.rows, a->value.cols, grad);
    rt.exec("add",
            [&] { return driver::add(rt.device(), rt.cache(), a->value, b->value, y->value); });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, a, b, yp] {
        // b first: a may take over dY, after which accumulating into a's gradient changes it.
        pass_grad(rt, b, yp->grad, false);
        pass_grad(rt, a, yp->grad, a != b);
    };
    return y;
}

Var add_relu(Runtime& rt, const Var& a, const Var& b) {
    driver::check_same(a->value, b->value, "add_relu: the operands");
    const bool grad = needs(a) || needs(b);
    Var y = rt.make(a->value.rows, a->value.cols, grad);
    rt.exec("add_relu", [&] {
        return driver::add_relu(rt.device(), rt.cache(), a->value, b->value, y->value);
    });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, a, b, yp] {
        // y > 0 exactly where a + b > 0 (relu keeps the sign and rounding to bf16 keeps it), so
        // the mask comes from y and the sum is never needed.
        Tensor dZ = rt.scratch(yp->value.rows, yp->value.cols);
        rt.exec("add_relu.grad", [&] {
            return driver::relu_grad(rt.device(), rt.cache(), yp->value, yp->grad, dZ);
        });
        // b first: a may take over dZ, after which accumulating into a's gradient changes it.
        pass_grad(rt, b, dZ, false);
        pass_grad(rt, a, dZ, a != b);
    };
    return y;
}

Var add_periodic(Runtime& rt, const Var& x, const Var& table) {
    const Tensor &X = x->value, &T = table->value;
    check_cols("add_periodic", T, X.cols, "the table");
    if (T.rows == 0 || X.rows % T.rows != 0)
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  fmt::format("add_periodic: {} rows are not whole blocks of the "
                                              "table's {} rows",
                                              X.rows, T.rows));
    const bool grad = needs(x) || needs(table);
    Var y = rt.make(X.rows, X.cols, grad);
    // Seen as (rows / T.rows) rows of T.rows x cols values, the table is one bias row.
    const uint32_t blocks = X.rows / T.rows;
    rt.exec("add_periodic", [&] {
        return driver::bias_add(rt.device(), rt.cache(), reshaped(X, blocks), reshaped(T, 1),
                                reshaped(y->value, blocks));
    });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, table, yp, blocks] {
        if (needs(table)) {
            bool acc = false;
            Tensor dT = rt.grad_target(table, acc);
            rt.exec("add_periodic.dtable", [&] {
                return driver::col_sum(rt.device(), rt.cache(), reshaped(yp->grad, blocks),
                                       reshaped(dT, 1));
            });
            rt.finish_grad(table, dT, acc);
        }
        pass_grad(rt, x, yp->grad, true);
    };
    return y;
}

Var linear_transposed(Runtime& rt, const Var& x, const Var& w) {
    const Tensor &X = x->value, &W = w->value;
    if (X.cols != W.cols)
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  fmt::format("linear_transposed: input has {} features, the "
                                              "weight ({} x {}) expects {}",
                                              X.cols, W.rows, W.cols, W.cols));
    const bool grad = needs(x) || needs(w);
    Var y = rt.make(X.rows, W.rows, grad);
    const auto prec = rt.matmul_precision();
    rt.exec("linear_t.matmul", [&] {
        return driver::matmul(rt.device(), rt.cache(), X, false, W, true, y->value, prec);
    });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, w, yp, prec] {
        const Tensor& dY = yp->grad;
        if (needs(w)) {
            bool acc = false;
            Tensor dW = rt.grad_target(w, acc);
            rt.exec("linear_t.dweight", [&] {
                return driver::matmul(rt.device(), rt.cache(), dY, true, x->value, false, dW, prec);
            });
            rt.finish_grad(w, dW, acc);
        }
        if (needs(x)) {
            bool acc = false;
            Tensor dX = rt.grad_target(x, acc);
            rt.exec("linear_t.dinput", [&] {
                return driver::matmul(rt.device(), rt.cache(), dY, false, w->value, false, dX,
                                      prec);
            });
            rt.finish_grad(x, dX, acc);
        }
    };
    return y;
}

namespace {

/// Moves head blocks between the token layout (n x heads·d) and the head-major one
/// (heads·n x d): `to_heads` gathers columns into row blocks, otherwise it scatters back.
void move_heads(Runtime& rt, const Tensor& tokens, const Tensor& heads_major, uint32_t heads,
                bool to_heads) {
    const uint32_t n = tokens.rows, d = tokens.cols / heads;
    for (uint32_t h = 0; h < heads; ++h) {
        const Tensor block = driver::view(heads_major, uint64_t(h) * n * d, n, d);
        if (to_heads)
            rt.exec("split_heads", [&] {
                return driver::copy_columns(rt.device(), rt.cache(), tokens, h * d, block);
            });
        else
            rt.exec("merge_heads", [&] {
                return driver::copy_into_columns(rt.device(), rt.cache(), block, tokens, h * d);
            });
    }
}

/// split_heads (to_heads) or merge_heads: y's layout from x's, and back for the gradient.
Var regroup_heads(Runtime& rt, const Var& x, uint32_t heads, bool to_heads) {
    const Tensor& X = x->value;
    const uint32_t width = to_heads ? X.cols : X.cols * heads;
    if (heads == 0 || width % heads != 0 || (!to_heads && X.rows % heads != 0))
        throw driver::DeviceError(
            driver::ErrorKind::Usage,
            fmt::format("{}: a {} x {} tensor does not split into {} heads",
                        to_heads ? "split_heads" : "merge_heads", X.rows, X.cols, heads));
    Var y = to_heads ? rt.make(X.rows * heads, X.cols / heads, needs(x))
                     : rt.make(X.rows / heads, X.cols * heads, needs(x));
    if (to_heads)
        move_heads(rt, X, y->value, heads, true);
    else
        move_heads(rt, y->value, X, heads, false);
    maybe_round(rt, y);
    if (!needs(x)) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, yp, heads, to_heads] {
        // Every element of dX is written (the heads cover all columns), so no zeroing.
        bool acc = false;
        Tensor dX = rt.grad_target(x, acc);
        if (to_heads)
            move_heads(rt, dX, yp->grad, heads, false);
        else
            move_heads(rt, yp->grad, dX, heads, true);
        rt.finish_grad(x, dX, acc);
    };
    return y;
}

}  // namespace

Var split_heads(Runtime& rt, const Var& x, uint32_t heads) {
    return regroup_heads(rt, x, heads, true);
}

Var merge_heads(Runtime& rt, const Var& x, uint32_t heads) {
    return regroup_heads(rt, x, heads, false);
}

Var attention(Runtime& rt, const Var& q, const Var& k, const Var& v, uint32_t seq, bool causal) {
    driver::check_same(q->value, k->value, "attention: q and k");
    driver::check_same(q->value, v->value, "attention: q and v");
    if (seq == 0 || q->value.rows % seq != 0)
        throw driver::DeviceError(
            driver::ErrorKind::Usage,
            fmt::format("attention: {} rows are not whole sequences of {}", q->value.rows, seq));
    // Head-major blocks are independent problems: the kernel's (batch, heads) is only their
    // count.
    driver::AttentionShape shape;
    shape.batch = q->value.rows / seq;
    shape.heads = 1;
    shape.seq = seq;
    shape.dhead = q->value.cols;
    shape.causal = causal;
    const bool grad = needs(q) || needs(k) || needs(v);
    Var o = rt.make(q->value.rows, q->value.cols, grad);
    const Tensor p = rt.scratch(q->value.rows, seq);
    rt.exec("attention", [&] {
        return driver::attention(rt.device(), rt.cache(), shape, q->value, k->value, v->value,
                                 o->value, p);
    });
    maybe_round(rt, o);
    if (!grad) return o;
    Node* op = o.get();
    o->backward = [&rt, q, k, v, op, p, shape] {
        bool aq = false, ak = false, av = false;
        const auto target = [&](const Var& x, bool& acc) {
            return needs(x) ? rt.grad_target(x, acc) : rt.scratch(x->value.rows, x->value.cols);
        };
        const Tensor dq = target(q, aq), dk = target(k, ak), dv = target(v, av);
        rt.exec("attention.grad", [&] {
            return driver::attention_grad(rt.device(), rt.cache(), shape, q->value, k->value,
                                          v->value, p, op->grad, dq, dk, dv);
        });
        if (needs(q)) rt.finish_grad(q, dq, aq);
        if (needs(k)) rt.finish_grad(k, dk, ak);
        if (needs(v)) rt.finish_grad(v, dv, av);
    };
    return o;
}

Var softmax(Runtime& rt, const Var& x) {
    Var y = rt.make(x->value.rows, x->value.cols, needs(x));
    rt.exec("softmax",
            [&] { return driver::softmax(rt.device(), rt.cache(), x->value, y->value); });
    maybe_round(rt, y);
    if (!needs(x)) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, yp] {
        bool acc = false;
        Tensor dX = rt.grad_target(x, acc);
        rt.exec("softmax.grad", [&] {
            return driver::softmax_grad(rt.device(), rt.cache(), yp->value, yp->grad, dX);
        });
        rt.finish_grad(x, dX, acc);
    };
    return y;
}

namespace {

enum class PoolKind : uint8_t { Max, Avg, Global };

/// The three poolings: image rows viewed as the kernels' NHWC pixel rows, and back.
Var pool(Runtime& rt, const Var& x, PoolWindow w, PoolKind kind) {
    static constexpr const char* kNames[] = {"max_pool2d", "avg_pool2d", "global_avg_pool"};
    const char* name = kNames[int(kind)];
    const Tensor& X = x->value;
    const uint64_t image = uint64_t(w.height) * w.width * w.channels;
    if (image == 0 || X.cols != image)
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  fmt::format("{}: rows of {} values are not {}x{}x{} images", name,
                                              X.cols, w.height, w.width, w.channels));
    w.batch = X.rows;
    w.validate(name);
    const uint32_t out_pixels = kind == PoolKind::Global ? 1 : w.out_height() * w.out_width();
    Var y = rt.make(X.rows, out_pixels * w.channels, needs(x));
    const Tensor xp = reshaped(X, X.rows * w.height * w.width),
                 yp = reshaped(y->value, X.rows * out_pixels);
    rt.exec(name, [&] {
        auto& dev = rt.device();
        auto& cache = rt.cache();
        switch (kind) {
            case PoolKind::Max:
                return driver::max_pool2d(dev, cache, w, xp, yp);
            case PoolKind::Avg:
                return driver::avg_pool2d(dev, cache, w, xp, yp);
            case PoolKind::Global:
                return driver::global_avg_pool(dev, cache, w, xp, yp);
        }
        return driver::Event{};
    });
    maybe_round(rt, y);
    if (!needs(x)) return y;
    Node* ynode = y.get();
    y->backward = [&rt, x, ynode, w, kind, name, out_pixels] {
        bool acc = false;
        Tensor dX = rt.grad_target(x, acc);
        const Tensor dxp = reshaped(dX, w.batch * w.height * w.width),
                     dyp = reshaped(ynode->grad, w.batch * out_pixels),
                     xp = reshaped(x->value, w.batch * w.height * w.width);
        rt.exec(std::string(name) + ".grad", [&] {
            auto& dev = rt.device();
            auto& cache = rt.cache();
            switch (kind) {
                case PoolKind::Max:
                    return driver::max_pool2d_grad(dev, cache, w, xp, dyp, dxp);
                case PoolKind::Avg:
                    return driver::avg_pool2d_grad(dev, cache, w, dyp, dxp);
                case PoolKind::Global:
                    return driver::global_avg_pool_grad(dev, cache, w, dyp, dxp);
            }
            return driver::Event{};
        });
        rt.finish_grad(x, dX, acc);
    };
    return y;
}

}  // namespace

Var max_pool2d(Runtime& rt, const Var& x, const PoolWindow& w) {
    return pool(rt, x, w, PoolKind::Max);
}

Var avg_pool2d(Runtime& rt, const Var& x, const PoolWindow& w) {
    return pool(rt, x, w, PoolKind::Avg);
}

Var global_avg_pool(Runtime& rt, const Var& x, const PoolWindow& w) {
    return pool(rt, x, w, PoolKind::Global);
}

Var conv2d(Runtime& rt, const Var& x, const Var& w, const Var& b, driver::Conv2dShape s) {
    const Tensor &X = x->value, &W = w->value;
    const uint64_t image = uint64_t(s.height) * s.width * s.cin;
    if (X.cols != image)
        throw driver::DeviceError(driver::ErrorKind::Usage,
                                  fmt::format("conv2d: rows of {} values are not {}x{}x{} images",
                                              X.cols, s.height, s.width, s.cin));
    if (W.rows != s.kernel * s.kernel * s.cin || W.cols != s.cout)
        throw driver::DeviceError(
            driver::ErrorKind::Usage,
            fmt::format("conv2d: the weight is {} x {}, expected {} x {} (k·k·Cin x Cout)", W.rows,
                        W.cols, s.kernel * s.kernel * s.cin, s.cout));
    if (b) check_cols("conv2d", b->value, s.cout, "the bias");
    s.batch = X.rows;
    s.validate();
    const uint32_t pixels_in = s.height * s.width, pixels_out = s.out_height() * s.out_width();
    const bool grad = needs(x) || needs(w) || needs(b);
    Var y = rt.make(X.rows, pixels_out * s.cout, grad);
    // Without a bias the kernel still adds one: zeros, in step scratch.
    Tensor bias = b ? b->value : rt.scratch(1, s.cout);
    if (!b)
        rt.exec("conv2d.zero_bias",
                [&] { return driver::scale(rt.device(), rt.cache(), bias, 0.0f, bias); });
    rt.exec("conv2d", [&] {
        return driver::conv2d(rt.device(), rt.cache(), s, reshaped(X, X.rows * pixels_in), W, bias,
                              reshaped(y->value, X.rows * pixels_out));
    });
    maybe_round(rt, y);
    if (!grad) return y;
    Node* yp = y.get();
    y->backward = [&rt, x, w, b, yp, s, pixels_in, pixels_out] {
        bool ax = false, aw = false, ab = false;
        // An input that needs no gradient (the images) gets no dx: no dcol GEMM, no col2im.
        const Tensor dX = needs(x) ? rt.grad_target(x, ax) : Tensor{};
        const Tensor dW =
            needs(w) ? rt.grad_target(w, aw) : rt.scratch(w->value.rows, w->value.cols);
        const Tensor dB = needs(b) ? rt.grad_target(b, ab) : rt.scratch(1, s.cout);
        rt.exec("conv2d.grad", [&] {
            return driver::conv2d_grad(
                rt.device(), rt.cache(), s, reshaped(x->value, s.batch * pixels_in), w->value,
                reshaped(yp->grad, s.batch * pixels_out),
                needs(x) ? reshaped(dX, s.batch * pixels_in) : Tensor{}, dW, dB);
        });
        if (needs(x)) rt.finish_grad(x, dX, ax);
        if (needs(w)) rt.finish_grad(w, dW, aw);
        if (needs(b)) rt.finish_grad(b, dB, ab);
    };
    return y;
}

Var embedding(Runtime& rt, const Var& onehot, const Var& table) {
    return linear(rt, onehot, table, nullptr);
}

Var cross_entropy(Runtime& rt, const Var& logits, const Var& onehot) {
    const Tensor& L = logits->value;
    if (onehot->value.rows != L.rows || onehot->value.cols != L.cols)
        throw driver::DeviceError(
            driver::ErrorKind::Usage,
            fmt::format("cross_entropy: logits are {} x {} but labels are "
                        "{} x {}",
                        L.rows, L.cols, onehot->value.rows, onehot->value.cols));
    Tensor per_row = rt.scratch(L.rows, 1);
    // The kernel writes d(mean loss)/dlogits straight into the logits' gradient.
    bool acc = false;
    Tensor dL = needs(logits) ? rt.grad_target(logits, acc) : rt.scratch(L.rows, L.cols);
    rt.exec("cross_entropy", [&] {
        return driver::softmax_cross_entropy(rt.device(), rt.cache(), L, onehot->value, per_row,
                                             dL);
    });
    if (needs(logits)) rt.finish_grad(logits, dL, acc);
    // The mean: the rows x 1 column read as one row, summed, times fp32(1 / rows).
    Tensor as_row = per_row;
    as_row.rows = 1;
    as_row.cols = L.rows;
    Var loss = rt.make(1, 1, false);
    rt.exec("cross_entropy.mean",
            [&] { return driver::row_sum(rt.device(), rt.cache(), as_row, loss->value); });
    rt.exec("cross_entropy.mean", [&] {
        return driver::scale(rt.device(), rt.cache(), loss->value, 1.0f / float(L.rows),
                             loss->value);
    });
    loss->has_grad = true;  // marks it as a loss for backward()
    return loss;
}

}  // namespace tpu::trainer
