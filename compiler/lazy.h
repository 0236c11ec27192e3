// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/compiler.h"
#include "compiler/evaluator.h"
#include "compiler/ir.h"

/// Lazy tensors (compiler/README.md, "Recording"): ops record into a pending graph instead of
/// running; the graph is cut at mark_step() (the optimizer step) and wherever the host reads a
/// value, as PyTorch/XLA's LazyGraphExecutor does. A cut compiles the graph (or finds it in the
/// cache) and runs it on a Backend.
namespace tpu::compiler {

/// One tensor's data on every replica, held by a Backend.
struct DeviceData {
    virtual ~DeviceData() = default;
    Shape shape{};    ///< its type
    Layout layout{};  ///< how it lies in memory (unassigned until a compiled step placed it)
};
using DataPtr = std::shared_ptr<DeviceData>;

/// Where compiled steps run: the host evaluator now, the device once code generation exists.
class Backend {
public:
    virtual ~Backend() = default;
    /// Replicas (cores) each step runs on.
    virtual size_t replicas() const = 0;
    /// Whether uploaded values are kept: false on a timing-only board, whose upload() takes
    /// empty value vectors (so callers need not make values nobody reads).
    virtual bool keeps_values() const { return true; }
    /// Host values to data: one vector for every replica, or one per replica.
    virtual DataPtr upload(const Shape& s, const std::vector<std::vector<float>>& values) = 0;
    /// Replica `r` of `d` to the host.
    virtual std::vector<float> download(const DataPtr& d, size_t r) = 0;
    /// Runs `step` on parameter and input data (by number); returns one datum per output.
    virtual std::vector<DataPtr> execute(const CompiledStep& step,
                                         const std::vector<DataPtr>& parameters,
                                         const std::vector<DataPtr>& inputs) = 0;
};

/// The CPU path: steps run on the host evaluator (evaluate_compiled), replica by replica.
class HostBackend : public Backend {
public:
    explicit HostBackend(size_t replicas = 1, EvalOptions options = {});
    size_t replicas() const override { return m_replicas; }
    DataPtr upload(const Shape& s, const std::vector<std::vector<float>>& values) override;
    std::vector<float> download(const DataPtr& d, size_t r) override;
    std::vector<DataPtr> execute(const CompiledStep& step, const std::vector<DataPtr>& parameters,
                                 const std::vector<DataPtr>& inputs) override;

private:
    size_t m_replicas;
    EvalOptions m_options;
};

namespace detail {
struct TensorState;
}

/// A lazy tensor: a handle on a value that is either recorded (pending) or data.
class LazyTensor {
public:
    LazyTensor() = default;
    /// Holds a value.
    bool defined() const { return m_state != nullptr; }
    /// Its type.
    const Shape& shape() const;
    /// Its value is recorded and not run yet.
    bool pending() const;

private:
    friend class LazyContext;
    explicit LazyTensor(std::shared_ptr<detail::TensorState> s) : m_state(std::move(s)) {}
    std::shared_ptr<detail::TensorState> m_state;
};

/// What the lazy layer did, in PyTorch/XLA's metric names.
struct LazyStats {
    uint64_t mark_steps = 0;         ///< MarkStep
    uint64_t host_syncs = 0;         ///< cuts for a host read (tensor.cpu(), loss.item())
    uint64_t executions = 0;         ///< graphs run
    uint64_t uncached_compiles = 0;  ///< UncachedCompile
    uint64_t cached_compiles = 0;    ///< CachedCompile
    double compile_seconds = 0;      ///< CompileTime (host)
};

/// The recording context of one training or inference loop.
class LazyContext {
public:
    explicit LazyContext(Backend& backend, CompileOptions options = {});

    /// A tensor that lives across steps (a weight, an optimizer buffer), from host values (one
    /// vector for every replica, or one per replica).
    LazyTensor parameter(std::string name, const Shape& s, std::vector<std::vector<float>> values);
    /// Data the host sends for this step (a batch: one shard per replica, or one for all).
    LazyTensor input(std::string name, const Shape& s, std::vector<std::vector<float>> values);

    /// The pending graph: record ops into it with the builder functions on value()s.
    Graph& graph() { return m_graph; }
    /// `t`'s value in the pending graph (data becomes a leaf of it on first use).
    ValueId value(const LazyTensor& t);
    /// A new tensor holding recorded value `v`.
    LazyTensor wrap(ValueId v, std::string name = {});
    /// In-place update (an optimizer's param.add_()): `t` now holds `v`; at the next cut the
    /// step writes it over t's data (an input/output alias).
    void assign(const LazyTensor& t, ValueId v);

    /// A host read of replica `r`: runs the graph `t` needs (only that, as PyTorch/XLA's
    /// tensor.cpu() does: other pending values stay pending) and makes `t` data.
    std::vector<float> to_host(const LazyTensor& t, size_t r = 0);
    /// The step's cut (xm.mark_step()): every live tensor with a pending value becomes data.
    void mark_step();

    /// Whether its backend keeps uploaded values (Backend::keeps_values).
    bool keeps_values() const { return m_backend.keeps_values(); }
    const LazyStats& stats() const { return m_stats; }
    const CompileCache& cache() const { return m_cache; }
    /// The compiled step of the last cut (nullptr before the first).
    std::shared_ptr<const CompiledStep> last_step() const { return m_last; }
    /// The graph of the last cut, as compiled (extracted from the pending graph).
    const Graph& last_graph() const { return m_last_graph; }

private:
    std::shared_ptr<detail::TensorState> make_state(const Shape& s, std::string name, bool param);
    /// Runs the outputs `states` need; they become data.
    void run(const std::vector<std::shared_ptr<detail::TensorState>>& states);
    void reset_graph();

    Backend& m_backend;
    CompileCache m_cache;
    Graph m_graph;
    uint64_t m_generation = 0;
    std::vector<std::weak_ptr<detail::TensorState>> m_live;
    std::vector<std::pair<ValueId, DataPtr>> m_leaf_data;  // leaves of m_graph and their data
    std::vector<std::pair<ValueId, std::weak_ptr<detail::TensorState>>> m_param_leaves;
    LazyStats m_stats;
    std::shared_ptr<const CompiledStep> m_last;
    Graph m_last_graph;
};

}  // namespace tpu::compiler
