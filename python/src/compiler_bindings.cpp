// SPDX-License-Identifier: Apache-2.0
// tpusim._core.compiler: the compiler's recording API for Python front ends (tpusim.torch).
// A LazyContext on a backend (the host evaluator, or the device of a tpusim.Board), its tensors,
// and the builder functions of compiler/builder.h on its pending graph, bound one to one.
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "compiler/builder.h"
#include "compiler/codegen.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "python/src/board.h"
#include "python/src/interrupts.h"

namespace tpu::python {

namespace py = pybind11;
using namespace tpu::compiler;

namespace {

/// Host values of a leaf: one C-contiguous fp32 array for every replica, or one per replica;
/// each must hold the shape's elements.
std::vector<std::vector<float>> leaf_values(const Shape& s, const std::vector<FloatArray>& arrays,
                                            const std::string& name) {
    if (arrays.empty()) throw CompileError(name + ": no values");
    std::vector<std::vector<float>> out;
    for (const FloatArray& a : arrays) {
        if (a.size() != s.elements())
            throw CompileError(name + ": " + std::to_string(a.size()) + " values for " +
                               s.to_string());
        out.emplace_back(a.data(), a.data() + a.size());
    }
    return out;
}

/// The board's evaluator numerics (the MXU's K per pass, the VPU's lanes).
EvalOptions eval_options(const hw::BoardConfig& cfg) {
    EvalOptions o;
    o.mxu_rows = cfg.core.mxu_rows;
    o.vpu_lanes = cfg.core.vpu_lanes;
    return o;
}

/// Holds the board's device until the backend (and so, through keep_alive, every lazy tensor
/// with data on it) is gone: a base, so it is destroyed after the DeviceBackend.
struct DeviceOwner {
    std::shared_ptr<driver::Device> device;
};

/// A DeviceBackend that keeps its device alive (a closed Board's device lives on until the
/// tensors on it are gone).
class OwningDeviceBackend : private DeviceOwner, public DeviceBackend {
public:
    OwningDeviceBackend(std::shared_ptr<driver::Device> dev, std::vector<uint32_t> cores,
                        CodegenOptions cg, EvalOptions host)
        : DeviceOwner{std::move(dev)},
          DeviceBackend(*DeviceOwner::device, std::move(cores), std::move(cg), std::move(host)) {}
};

}  // namespace

void bind_compiler(py::module_& parent) {
    py::module_ m =
        parent.def_submodule("compiler",
                             "The compiler's lazy recording API (compiler/README.md): LazyContext, "
                             "backends and the builder functions of compiler/builder.h.");
    // Alive as long as the module (as module.cpp's exception types).
    static PyObject* compile_error = PyErr_NewExceptionWithDoc(
        "tpusim.compiler.CompileError",
        "A graph that cannot be recorded or compiled: the message names the op and the problem.",
        PyExc_ValueError, nullptr);
    static PyObject* not_generated = PyErr_NewExceptionWithDoc(
        "tpusim.compiler.NotYetGenerated",
        "A compiled step the code generator cannot emit yet (names the fusion).", compile_error,
        nullptr);
    m.attr("CompileError") = py::reinterpret_borrow<py::object>(compile_error);
    m.attr("NotYetGenerated") = py::reinterpret_borrow<py::object>(not_generated);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const NotYetGenerated& e) {
            PyErr_SetString(not_generated, e.what());
        } catch (const CompileError& e) {
            PyErr_SetString(compile_error, e.what());
        }
    });

    py::enum_<DType>(m, "DType")
        .value("F32", DType::F32)
        .value("BF16", DType::BF16)
        .value("S32", DType::S32)
        .value("Pred", DType::Pred);
    py::enum_<Comparison>(m, "Comparison")
        .value("Eq", Comparison::Eq)
        .value("Ne", Comparison::Ne)
        .value("Lt", Comparison::Lt)
        .value("Le", Comparison::Le)
        .value("Gt", Comparison::Gt)
        .value("Ge", Comparison::Ge);
    py::enum_<Reducer>(m, "Reducer").value("Sum", Reducer::Sum).value("Max", Reducer::Max);
    py::enum_<Precision>(m, "Precision")
        .value("Default", Precision::Default)
        .value("High", Precision::High)
        .value("Highest", Precision::Highest);
    py::enum_<PoolKind>(m, "PoolKind").value("Max", PoolKind::Max).value("Avg", PoolKind::Avg);

    py::class_<Shape>(m, "Shape")
        .def(py::init([](DType t, std::vector<int64_t> dims) {
                 return Shape{t, std::move(dims)};
             }),
             py::arg("dtype"), py::arg("dims"))
        .def_readonly("dtype", &Shape::dtype)
        .def_readonly("dims", &Shape::dims)
        .def("elements", &Shape::elements)
        .def("__repr__", &Shape::to_string)
        .def("__eq__", [](const Shape& a, const Shape& b) { return a == b; });
    py::class_<DotDims>(m, "DotDims")
        .def(py::init([](std::vector<int64_t> lb, std::vector<int64_t> rb, std::vector<int64_t> lc,
                         std::vector<int64_t> rc) {
                 return DotDims{std::move(lb), std::move(rb), std::move(lc), std::move(rc)};
             }),
             py::arg("lhs_batch"), py::arg("rhs_batch"), py::arg("lhs_contracting"),
             py::arg("rhs_contracting"));

    // ---- The pending graph and the builder functions ------------------------------------------
    py::class_<Graph>(m, "Graph")
        .def("shape", &Graph::shape, py::arg("value"), py::return_value_policy::copy)
        .def("set_scope", &Graph::set_scope, py::arg("scope"),
             "Ops recorded from now on are named under `scope`; returns the previous scope.")
        .def_property_readonly("scope", &Graph::scope)
        .def("num_ops", [](const Graph& g) { return g.ops().size(); })
        .def("hash", &Graph::hash)
        .def("to_string", &Graph::to_string);
    m.attr("NO_VALUE") = kNoValue;
    // One line per builder function (compiler/builder.h documents each).
    m.def("neg", &compiler::neg);
    m.def("abs", &compiler::abs);
    m.def("exp", &compiler::exp);
    m.def("log", &compiler::log);
    m.def("rsqrt", &compiler::rsqrt);
    m.def("sqrt", &compiler::sqrt);
    m.def("tanh", &compiler::tanh);
    m.def("erf", &compiler::erf);
    m.def("convert", &compiler::convert);
    m.def("add", &compiler::add);
    m.def("sub", &compiler::sub);
    m.def("mul", &compiler::mul);
    m.def("div", &compiler::div);
    m.def("max", &compiler::max);
    m.def("min", &compiler::min);
    m.def("pow", &compiler::pow);
    m.def("compare", &compiler::compare);
    m.def("select", &compiler::select);
    m.def("literal", &compiler::literal, py::arg("g"), py::arg("value"),
          py::arg("dtype") = DType::F32);
    m.def("full", &compiler::full);
    m.def("broadcast", &compiler::broadcast);
    m.def("reshape", &compiler::reshape);
    m.def("transpose", &compiler::transpose);
    m.def("slice", &compiler::slice);
    m.def("concatenate", &compiler::concatenate);
    m.def("iota", &compiler::iota, py::arg("g"), py::arg("dims"), py::arg("axis"),
          py::arg("dtype") = DType::S32);
    m.def("reduce", &compiler::reduce);
    m.def("dot", &compiler::dot);
    m.def("matmul", &compiler::matmul);
    m.def("linear", &compiler::linear);
    m.def("conv2d", &compiler::conv2d);
    m.def("conv2d_input_grad", &compiler::conv2d_input_grad);
    m.def("conv2d_filter_grad", &compiler::conv2d_filter_grad);
    m.def("pool", &compiler::pool);
    m.def("max_pool_grad", &compiler::max_pool_grad);
    m.def("avg_pool_grad", &compiler::avg_pool_grad);
    m.def("global_avg_pool", &compiler::global_avg_pool);
    m.def("gather_rows", &compiler::gather_rows);
    m.def("scatter_add_rows", &compiler::scatter_add_rows);
    m.def("rng_uniform", &compiler::rng_uniform);
    m.def("all_reduce", &compiler::all_reduce);
    m.def("relu", &compiler::relu);
    m.def("gelu", &compiler::gelu);
    m.def("gelu_grad", &compiler::gelu_grad);
    m.def("softmax", &compiler::softmax);
    m.def("softmax_grad", &compiler::softmax_grad);
    m.def("log_softmax", &compiler::log_softmax);
    m.def("log_softmax_grad", &compiler::log_softmax_grad);
    m.def("layer_norm", [](Graph& g, ValueId x, ValueId gamma, ValueId beta, double eps) {
        const LayerNormResult r = layer_norm(g, x, gamma, beta, eps);
        return py::make_tuple(r.y, r.mean, r.rstd);
    });
    m.def("batch_norm_training",
          [](Graph& g, ValueId x, ValueId scale, ValueId offset, double eps, int64_t feature) {
              const BatchNormResult r = batch_norm_training(g, x, scale, offset, eps, feature);
              return py::make_tuple(r.y, r.mean, r.var);
          });
    m.def("batch_norm_inference", &compiler::batch_norm_inference);
    m.def("batch_norm_grad", [](Graph& g, ValueId x, ValueId scale, ValueId mean, ValueId var,
                                ValueId dy, double eps, int64_t feature) {
        const BatchNormGradResult r = batch_norm_grad(g, x, scale, mean, var, dy, eps, feature);
        return py::make_tuple(r.dx, r.dscale, r.doffset);
    });
    m.def("cross_entropy", &compiler::cross_entropy);

    // ---- Backends -----------------------------------------------------------------------------
    py::class_<Backend>(m, "Backend").def_property_readonly("replicas", &Backend::replicas);
    py::class_<HostBackend, Backend>(
        m, "HostBackend",
        "Steps run on the host evaluator, replica by replica; with `board`, in the numerics "
        "a DeviceBackend on `cores` of it gives (its MXU's passes, VPU lanes and all-reduce "
        "order: the torus on a torus board), replica r being cores[r].")
        .def(py::init([](size_t replicas, uint32_t mxu_rows, uint32_t vpu_lanes, Board* board,
                         std::vector<uint32_t> cores) {
                 EvalOptions o;
                 o.mxu_rows = mxu_rows;
                 o.vpu_lanes = vpu_lanes;
                 if (!board) {
                     if (!cores.empty()) throw CompileError("host backend: cores without a board");
                     return std::make_unique<HostBackend>(replicas, o);
                 }
                 // The same options as DeviceBackend's host fallback, so that the reference
                 // sums an all-reduce in the order the board's code does.
                 const hw::BoardConfig& cfg = board->device().config();
                 if (cores.empty())
                     for (uint32_t c = 0; c < replicas; ++c) cores.push_back(c);
                 if (cores.size() != replicas)
                     throw CompileError("host backend: " + std::to_string(cores.size()) +
                                        " cores for " + std::to_string(replicas) + " replicas");
                 for (uint32_t c : cores)
                     if (c >= cfg.cores())
                         throw CompileError("host backend: core " + std::to_string(c) +
                                            " is not on the board");
                 return std::make_unique<HostBackend>(replicas, device_eval_options(cfg, cores));
             }),
             py::arg("replicas") = 1, py::arg("mxu_rows") = 128, py::arg("vpu_lanes") = 128,
             py::arg("board") = nullptr, py::arg("cores") = std::vector<uint32_t>{});
    py::class_<DeviceBackend, Backend>(m, "DeviceBackendBase");
    py::class_<OwningDeviceBackend, DeviceBackend>(
        m, "DeviceBackend",
        "Steps run as generated programs on cores of a board (replica r on cores[r]).")
        .def(py::init([](Board& board, std::vector<uint32_t> cores, bool host_fallback) {
                 std::shared_ptr<driver::Device> dev = board.shared_device();
                 if (cores.empty()) throw CompileError("device backend: no cores");
                 CodegenOptions cg;
                 cg.board = dev->config();
                 cg.replicas = uint32_t(cores.size());
                 cg.host_fallback = host_fallback;
                 const EvalOptions host = eval_options(dev->config());
                 return std::make_unique<OwningDeviceBackend>(std::move(dev), std::move(cores), cg,
                                                              host);
             }),
             py::arg("board"), py::arg("cores"), py::arg("host_fallback") = true,
             py::keep_alive<1, 2>())
        .def("stats", [](const OwningDeviceBackend& b) {
            const DeviceBackendStats& s = b.stats();
            py::dict d;
            d["executions"] = s.executions;
            d["launches"] = s.launches;
            d["host_fusions"] = s.host_fusions;
            d["fallback_fusions"] = s.fallback_fusions;
            d["fallbacks"] = s.fallbacks;
            d["programs_generated"] = s.programs_generated;
            d["codegen_seconds"] = s.codegen_seconds;
            d["device_bytes"] = s.device_bytes;
            d["peak_device_bytes"] = s.peak_device_bytes;
            d["last_step_cycles"] = s.last_step_cycles;
            d["h2d_cycles"] = s.h2d_cycles;
            return d;
        });

    // ---- Lazy tensors -------------------------------------------------------------------------
    py::class_<LazyTensor>(m, "LazyTensor")
        .def_property_readonly("shape", &LazyTensor::shape, py::return_value_policy::copy)
        .def_property_readonly("pending", &LazyTensor::pending)
        .def_property_readonly("defined", &LazyTensor::defined);
    py::class_<LazyContext>(m, "LazyContext",
                            "PyTorch/XLA's lazy graph executor in miniature (compiler/lazy.h).")
        .def(py::init(
                 [](Backend& backend, Board* board, bool multi_output_fusion, bool may_duplicate) {
                     CompileOptions o;
                     // The planner's board (the stationary operand of each dot).
                     if (board) o.board = board->device().config();
                     o.multi_output_fusion = multi_output_fusion;
                     o.may_duplicate = may_duplicate;
                     return std::make_unique<LazyContext>(backend, o);
                 }),
             py::arg("backend"), py::arg("board") = nullptr, py::arg("multi_output_fusion") = true,
             py::arg("may_duplicate") = true, py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
        .def(
            "parameter",
            [](LazyContext& c, std::string name, const Shape& s,
               const std::vector<FloatArray>& values) {
                auto v = leaf_values(s, values, name);
                InterruptScope ctrl_c;
                return c.parameter(std::move(name), s, std::move(v));
            },
            py::arg("name"), py::arg("shape"), py::arg("values"), py::keep_alive<0, 1>())
        .def(
            "input",
            [](LazyContext& c, std::string name, const Shape& s,
               const std::vector<FloatArray>& values) {
                auto v = leaf_values(s, values, name);
                InterruptScope ctrl_c;
                return c.input(std::move(name), s, std::move(v));
            },
            py::arg("name"), py::arg("shape"), py::arg("values"), py::keep_alive<0, 1>())
        .def_property_readonly("graph", &LazyContext::graph,
                               py::return_value_policy::reference_internal)
        .def("value", &LazyContext::value, py::arg("tensor"))
        .def("wrap", &LazyContext::wrap, py::arg("value"), py::arg("name") = "",
             py::keep_alive<0, 1>())
        .def("assign", &LazyContext::assign, py::arg("tensor"), py::arg("value"))
        .def(
            "to_host",
            [](LazyContext& c, const LazyTensor& t, size_t r) {
                std::vector<float> v;
                {
                    InterruptScope ctrl_c;
                    v = c.to_host(t, r);
                }
                py::array_t<float> out(py::ssize_t(v.size()));
                std::copy(v.begin(), v.end(), out.mutable_data());
                return out;
            },
            py::arg("tensor"), py::arg("replica") = 0)
        .def("mark_step",
             [](LazyContext& c) {
                 InterruptScope ctrl_c;
                 c.mark_step();
             })
        .def("stats",
             [](const LazyContext& c) {
                 const LazyStats& s = c.stats();
                 py::dict d;
                 d["mark_steps"] = s.mark_steps;
                 d["host_syncs"] = s.host_syncs;
                 d["executions"] = s.executions;
                 d["uncached_compiles"] = s.uncached_compiles;
                 d["cached_compiles"] = s.cached_compiles;
                 d["compile_seconds"] = s.compile_seconds;
                 d["cached_graphs"] = c.cache().size();
                 return d;
             })
        .def("last_summary",
             [](const LazyContext& c) {
                 const auto s = c.last_step();
                 return s ? s->summary() : std::string();
             })
        .def("last_listing",
             [](const LazyContext& c) {
                 const auto s = c.last_step();
                 return s ? s->to_string() : std::string();
             })
        .def("last_fusions",
             [](const LazyContext& c) {
                 // Per fusion: (name, kind, layers): the per-layer view of the last step.
                 py::list out;
                 if (const auto s = c.last_step())
                     for (const Fusion& f : s->fusions)
                         out.append(py::make_tuple(f.name, std::string(fusion_kind_name(f.kind)),
                                                   f.layers));
                 return out;
             })
        .def("last_graph", [](const LazyContext& c) { return c.last_graph().to_string(); });
}

}  // namespace tpu::python
