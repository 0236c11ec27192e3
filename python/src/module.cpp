// SPDX-License-Identifier: Apache-2.0
// tpusim._core: the extension behind `import tpusim` (python/README.md). Errors become the
// Python exceptions the CLI's exit codes stand for: bad input (exit 2) ValueError, a device
// fault, deadlock or stop (exit 1) tpusim.DeviceError, Ctrl-C KeyboardInterrupt.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "driver/device.h"
#include "hw/board.h"
#include "hw/core/numerics.h"
#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "python/src/board.h"
#include "python/src/interrupts.h"
#include "sim/config_io.h"
#include "sim/interrupt.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/run_output.h"
#include "trainer/dataset.h"
#include "trainer/trainer.h"
#include "trainer/zoo.h"

#ifndef TPU_SOURCE_DIR
#define TPU_SOURCE_DIR "."
#endif
#ifndef TPU_BINARY_DIR
#define TPU_BINARY_DIR "."
#endif

// libsystemc's own main() calls sc_main. Python never runs that main, but the loader resolves
// every symbol of the library when the extension is imported, so one must exist.
extern "C" __attribute__((visibility("default"))) int sc_main(int, char*[]) {
    return 1;
}

namespace tpu::python {
namespace {

// Created in PYBIND11_MODULE; alive as long as the module.
PyObject* g_device_error = nullptr;
PyObject* g_asm_error = nullptr;

/// Raises `type(message)` with extra attributes.
void raise(PyObject* type, const std::string& message, const py::dict& attrs = {}) {
    py::object exc = py::reinterpret_borrow<py::object>(type)(message);
    for (const auto& [key, value] : attrs) exc.attr(key) = value;
    PyErr_SetObject(type, exc.ptr());
}

/// A stop requested by Ctrl-C becomes KeyboardInterrupt (the message keeps the state dump).
bool raise_if_interrupted(const std::string& message) {
    if (!sim::interrupt_requested()) return false;
    sim::clear_interrupt();
    PyErr_SetString(PyExc_KeyboardInterrupt, message.c_str());
    return true;
}

void translate(std::exception_ptr p) {
    try {
        if (p) std::rethrow_exception(p);
    } catch (const isa::AsmError& e) {
        py::dict a;
        a["file"] = e.file();
        a["line"] = e.line();
        a["col"] = e.col();
        raise(g_asm_error, e.what(), a);
    } catch (const cli::SourceError& e) {
        raise(g_asm_error, e.what());
    } catch (const cli::InputError& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const cli::RunError& e) {
        if (!raise_if_interrupted(e.what())) raise(g_device_error, e.what());
    } catch (const driver::DeviceError& e) {
        using driver::ErrorKind;
        if (e.kind() == ErrorKind::Usage || e.kind() == ErrorKind::OutOfMemory)
            PyErr_SetString(PyExc_ValueError, e.what());
        else if (!raise_if_interrupted(e.what()))
            raise(g_device_error, e.what());
    } catch (const hw::DeadlockError& e) {
        raise(g_device_error, e.what());
    } catch (const hw::StoppedError& e) {
        if (!raise_if_interrupted(e.what())) raise(g_device_error, e.what());
    } catch (const sim::ConfigError& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const isa::DecodeError& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const trainer::DataError& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    }
}

std::vector<py::ssize_t> shape_of(const py::array& a) {
    return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

}  // namespace

void bind_compiler(py::module_& m);  // compiler_bindings.cpp
}  // namespace tpu::python

PYBIND11_MODULE(_core, m) {
    namespace py = pybind11;
    using namespace tpu;
    using namespace tpu::python;
    // SystemC prints its banner when its kernel first starts; an explicit setting wins.
    setenv("SYSTEMC_DISABLE_COPYRIGHT_MESSAGE", "1", 0);
    m.doc() = "tpusim's simulator core; use the tpusim package, which wraps it.";

    g_device_error = PyErr_NewExceptionWithDoc(
        "tpusim.DeviceError",
        "A kernel faulted, deadlocked or was stopped on the simulated device (what the CLI "
        "reports with exit code 1); the message names the core, pc, instruction and cycle.",
        PyExc_RuntimeError, nullptr);
    g_asm_error = PyErr_NewExceptionWithDoc(
        "tpusim.AsmError",
        "Assembly text with an error: the message is 'FILE:LINE:COL: error: ...'; the "
        "attributes file, line and col locate it.",
        PyExc_ValueError, nullptr);
    m.attr("DeviceError") = py::reinterpret_borrow<py::object>(g_device_error);
    m.attr("AsmError") = py::reinterpret_borrow<py::object>(g_asm_error);
    py::register_exception_translator(translate);

    m.attr("SOURCE_DIR") = TPU_SOURCE_DIR;
    m.attr("BINARY_DIR") = TPU_BINARY_DIR;

    // ---- numerics -------------------------------------------------------------------------
    m.def(
        "to_bf16",
        [](const FloatArray& x) {
            py::array_t<uint16_t> out(shape_of(x));
            const float* in = x.data();
            uint16_t* o = out.mutable_data();
            for (py::ssize_t i = 0; i < x.size(); ++i) o[i] = hw::f32_to_bf16(in[i]);
            return out;
        },
        py::arg("x"));
    m.def(
        "from_bf16",
        [](const py::array_t<uint16_t, py::array::c_style>& bits) {
            py::array_t<float> out(shape_of(bits));
            const uint16_t* in = bits.data();
            float* o = out.mutable_data();
            for (py::ssize_t i = 0; i < bits.size(); ++i) o[i] = hw::bf16_to_f32(in[i]);
            return out;
        },
        py::arg("bits"));

    // ---- programs -------------------------------------------------------------------------
    py::class_<isa::Program>(m, "Program")
        .def_readwrite("name", &isa::Program::name)
        .def("__len__", [](const isa::Program& p) { return p.code.size(); })
        .def_property_readonly("labels",
                               [](const isa::Program& p) {
                                   py::dict d;
                                   for (const auto& [name, pc] : p.labels) d[py::str(name)] = pc;
                                   return d;
                               })
        .def("to_bytes",
             [](const isa::Program& p) {
                 const std::vector<uint8_t> image = isa::encode_program(p);
                 return py::bytes(reinterpret_cast<const char*>(image.data()), image.size());
             })
        .def_static("from_bytes",
                    [](const py::bytes& image) {
                        const std::string s = image;
                        return isa::decode_program(
                            std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
                    })
        .def("disassemble", [](const isa::Program& p) { return isa::disassemble(p); });
    m.def(
        "assemble",
        [](const std::string& text, const std::string& filename) {
            return isa::assemble(text, filename);
        },
        py::arg("text"), py::arg("filename"));
    m.def("load_kernel", &cli::load_kernel, py::arg("path"));

    // ---- boards ---------------------------------------------------------------------------
    m.def(
        "parse_cores",
        [](const std::string& text, uint32_t cores) { return hw::parse_core_set(text, cores); },
        py::arg("text"), py::arg("cores"));
    m.def("zoo_models", [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& z : trainer::zoo_models())
            out.emplace_back(std::string(z.name), std::string(z.help));
        return out;
    });

    py::class_<Outputs>(m, "Outputs")
        .def(py::init<>())
        .def_readwrite("trace", &Outputs::trace)
        .def_readwrite("trace_units", &Outputs::trace_units)
        .def_readwrite("trace_window", &Outputs::trace_window)
        .def_readwrite("stats", &Outputs::stats);
    py::class_<Region>(m, "Region")
        .def(py::init<>())
        .def_readwrite("cores", &Region::cores)
        .def_readwrite("hbm", &Region::hbm)
        .def_readwrite("addr", &Region::addr)
        .def_readwrite("bytes", &Region::bytes)
        .def_property(
            "data", [](const Region& r) { return py::bytes(r.data); },
            [](Region& r, const py::bytes& b) { r.data = std::string(b); })
        .def_readwrite("label", &Region::label);
    py::class_<driver::Buffer>(m, "Buffer")
        .def_readonly("core", &driver::Buffer::core)
        .def_readonly("addr", &driver::Buffer::addr)
        .def_readonly("bytes", &driver::Buffer::bytes);

    py::class_<Board>(m, "Board")
        .def(py::init<const std::string&, const std::vector<std::string>&>(), py::arg("config"),
             py::arg("sets"))
        .def("close", &Board::close)
        .def_property_readonly("closed", &Board::closed)
        .def_property_readonly("num_cores", [](Board& b) { return b.device().num_cores(); })
        .def_property_readonly("clock_mhz", [](Board& b) { return b.device().config().clock_mhz; })
        .def_property_readonly("cycle", [](Board& b) { return b.device().now_cycle(); })
        .def("config_json", &Board::config_json)
        .def("stats_json", &Board::stats_json)
        .def(
            "alloc",
            [](Board& b, uint64_t bytes, uint32_t core) { return b.device().alloc(bytes, core); },
            py::arg("bytes"), py::arg("core"))
        .def(
            "free", [](Board& b, const driver::Buffer& buf) { b.device().free(buf); },
            py::arg("buffer"))
        .def(
            "write",
            [](Board& b, const driver::Buffer& buf, const py::bytes& data, uint64_t offset) {
                const std::string s = data;
                b.device().write(buf, s.data(), s.size(), offset);
            },
            py::arg("buffer"), py::arg("data"), py::arg("offset"))
        .def(
            "read",
            [](Board& b, const driver::Buffer& buf, uint64_t bytes, uint64_t offset) {
                std::string s(bytes, '\0');
                {
                    InterruptScope ctrl_c;
                    b.device().read(buf, s.data(), bytes, offset);
                }
                return py::bytes(s);
            },
            py::arg("buffer"), py::arg("bytes"), py::arg("offset"))
        .def("run", &Board::run, py::arg("program"), py::arg("source"), py::arg("cores"),
             py::arg("loads"), py::arg("dumps"), py::arg("args"), py::arg("outputs"))
        .def("gemm", &Board::gemm, py::arg("a"), py::arg("w"), py::arg("m"), py::arg("k"),
             py::arg("n"), py::arg("precision"), py::arg("cores"), py::arg("outputs"))
        .def("conv2d", &Board::conv2d, py::arg("x"), py::arg("w"), py::arg("bias"),
             py::arg("shape"), py::arg("cores"), py::arg("outputs"))
        .def("layernorm", &Board::layernorm, py::arg("x"), py::arg("gamma"), py::arg("beta"),
             py::arg("rows"), py::arg("cols"), py::arg("cores"), py::arg("outputs"))
        .def("softmax", &Board::softmax, py::arg("x"), py::arg("rows"), py::arg("cols"),
             py::arg("cores"), py::arg("outputs"))
        .def("attention", &Board::attention, py::arg("q"), py::arg("k"), py::arg("v"),
             py::arg("shape"), py::arg("causal"), py::arg("cores"), py::arg("outputs"))
        .def("allreduce", &Board::allreduce, py::arg("x"), py::arg("cores"), py::arg("outputs"))
        .def("model", &Board::model, py::arg("name"), py::arg("sizes"), py::arg("batch"),
             py::arg("cores"), py::arg("train_step"), py::arg("precision"), py::arg("outputs"));

    bind_compiler(m);
}
