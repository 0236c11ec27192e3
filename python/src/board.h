// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "driver/device.h"
#include "driver/program_cache.h"
#include "isa/isa.h"

/// The Python module's side of the simulator (tpusim._core): a board with the CLI's ways of
/// running kernels, ops and models. The Python package (python/tpusim) turns numpy arguments
/// into the flat arrays and plain values taken here and wraps the results.
namespace tpu::python {

namespace py = pybind11;

/// A C-contiguous fp32 array; other float and int arrays are converted.
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

/// What a call writes besides its result, as the CLI's --trace, --trace-units, --trace-window
/// and --stats (empty: nothing).
struct Outputs {
    std::string trace;         ///< Chrome/Perfetto trace JSON
    std::string trace_units;   ///< trace only these tracks (prefixes, comma-separated)
    std::string trace_window;  ///< trace only cycles START:END
    std::string stats;         ///< statistics file (.json or .csv) and FILE.config.json
};

/// One memory range of `run`: a load (data) or a dump (bytes).
struct Region {
    std::vector<uint32_t> cores;  ///< every core to load; the one core to dump
    bool hbm = true;              ///< HBM, else VMEM
    uint64_t addr = 0;            ///< byte address
    uint64_t bytes = 0;           ///< dump size
    std::string data;             ///< load contents
    std::string label;            ///< names the region in errors ("loads[0x8000]")
};

/// A simulated board held open across calls: its device, a program cache for the ops, and the
/// CLI's run, op and model code paths on it.
class Board {
public:
    /// `config`: a JSON preset path ("" = the built-in v3-8-like board); `sets`: key=value
    /// overrides, as --config and --set.
    Board(const std::string& config, const std::vector<std::string>& sets);
    ~Board();

    /// Destroys the simulation; any later call raises.
    void close();
    bool closed() const { return !m_dev; }
    /// The device (raises once closed).
    driver::Device& device();
    /// The device, shared: a holder keeps it alive after close() (lazy tensors' device data
    /// must not outlive it).
    std::shared_ptr<driver::Device> shared_device() {
        device();
        return m_dev;
    }
    /// The effective config as JSON (what --stats writes beside the statistics).
    std::string config_json();

    /// The statistics tree (stats.json) with the per-kernel totals, as JSON text.
    std::string stats_json();

    /// Runs `program` as `tpusim run` does: `loads` first, then the launch on `cores` with
    /// `args` in s1, s2, ..., then `dumps`. Returns {"summary": result JSON text, "dumps":
    /// [bytes]}.
    py::dict run(const isa::Program& program, const std::string& source,
                 const std::vector<uint32_t>& cores, const std::vector<Region>& loads,
                 const std::vector<Region>& dumps, const std::vector<uint32_t>& args,
                 const Outputs& out);

    /// The library GEMM C = A W (M x K times K x N) as `tpusim gemm`.
    py::dict gemm(const FloatArray& a, const FloatArray& w, uint32_t M, uint32_t K, uint32_t N,
                  const std::string& precision, const std::vector<uint32_t>& cores,
                  const Outputs& out);
    /// The CLI's ops on given values; x etc. hold one block per core (see tools/tpusim/op_runs.h).
    py::dict conv2d(const FloatArray& x, const FloatArray& w, const FloatArray& bias,
                    const std::vector<uint32_t>& shape, const std::vector<uint32_t>& cores,
                    const Outputs& out);
    py::dict layernorm(const std::vector<FloatArray>& x, const FloatArray& gamma,
                       const FloatArray& beta, uint32_t rows, uint32_t cols,
                       const std::vector<uint32_t>& cores, const Outputs& out);
    py::dict softmax(const std::vector<FloatArray>& x, uint32_t rows, uint32_t cols,
                     const std::vector<uint32_t>& cores, const Outputs& out);
    py::dict attention(const std::vector<FloatArray>& q, const std::vector<FloatArray>& k,
                       const std::vector<FloatArray>& v, const std::vector<uint32_t>& shape,
                       bool causal, const std::vector<uint32_t>& cores, const Outputs& out);
    py::dict allreduce(const std::vector<FloatArray>& x, const std::vector<uint32_t>& cores,
                       const Outputs& out);
    /// A zoo model as `tpusim model`: {"summary": JSON text with the per-layer table}.
    py::dict model(const std::string& name, const py::dict& sizes, uint32_t batch,
                   const std::vector<uint32_t>& cores, bool train_step,
                   const std::string& precision, const Outputs& out);

private:
    /// Runs `body` with `out`'s trace on the device, then writes its stats and trace files.
    template <class F>
    py::dict with_outputs(const Outputs& out, F&& body);

    std::shared_ptr<driver::Device> m_dev;
    driver::ProgramCache m_cache;
};

}  // namespace tpu::python
