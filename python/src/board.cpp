// SPDX-License-Identifier: Apache-2.0
#include "python/src/board.h"

#include <cstring>
#include <span>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "driver/kernels/gemm.h"
#include "hw/board.h"
#include "python/src/interrupts.h"
#include "sim/config_io.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/op_runs.h"
#include "tools/tpusim/run_output.h"
#include "trainer/zoo.h"

namespace tpu::python {
namespace {

std::vector<float> to_vector(const FloatArray& a) {
    return std::vector<float>(a.data(), a.data() + a.size());
}

cli::PerCore to_blocks(const std::vector<FloatArray>& blocks) {
    cli::PerCore out;
    out.reserve(blocks.size());
    for (const FloatArray& b : blocks) out.push_back(to_vector(b));
    return out;
}

/// `copies` copies of one block (the same gain on every core).
cli::PerCore repeat(const FloatArray& a, size_t copies) {
    return cli::PerCore(copies, to_vector(a));
}

py::array_t<float> to_array(const std::vector<float>& v) {
    py::array_t<float> a(static_cast<py::ssize_t>(v.size()));
    std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(float));
    return a;
}

cli::CommonOptions options_of(const Outputs& out) {
    cli::CommonOptions o;
    o.trace = out.trace;
    o.trace_units = out.trace_units;
    o.trace_window = out.trace_window;
    o.stats = out.stats;
    return o;
}

/// The op's result as the CLI reports it, and the values.
py::dict op_result(const std::string& kind, const cli::OpRun& r, size_t cores,
                   const hw::BoardConfig& cfg) {
    py::dict d;
    d["summary"] = cli::op_json(kind, r, cores, cfg, false).dump();
    d["output"] = to_array(r.result);
    return d;
}

}  // namespace

Board::Board(const std::string& config, const std::vector<std::string>& sets) {
    cli::CommonOptions o;
    o.config = config;
    o.sets = sets;
    const hw::BoardConfig cfg = o.board_config();
    m_dev = driver::Device::open(cfg);
}

Board::~Board() = default;

void Board::close() {
    m_dev.reset();
}

driver::Device& Board::device() {
    if (!m_dev) throw std::invalid_argument("the board is closed");
    return *m_dev;
}

std::string Board::config_json() {
    hw::BoardConfig copy = device().config();
    return sim::dump_json(sim::root_of(copy));
}

std::string Board::stats_json() {
    driver::Device& dev = device();
    dev.board().sync_stats();
    std::ostringstream os;
    cli::write_stats(os, false, dev.board(), dev.kernel_stats());
    return os.str();
}

template <class F>
py::dict Board::with_outputs(const Outputs& out, F&& body) {
    driver::Device& dev = device();
    const cli::CommonOptions opts = options_of(out);
    cli::RunTrace trace(opts, dev.config());
    dev.set_tracer(trace.get());
    // A failing call stops tracing before its trace file closes.
    struct Untrace {
        driver::Device& dev;
        ~Untrace() { dev.set_tracer(nullptr); }
    } untrace{dev};
    py::dict result;
    {
        InterruptScope ctrl_c;
        result = body(trace.get());
    }
    cli::write_stats_file(opts, dev.board(), dev.kernel_stats());
    dev.set_tracer(nullptr);
    trace.finish();
    result["stats"] = stats_json();
    return result;
}

py::dict Board::run(const isa::Program& program, const std::string& source,
                    const std::vector<uint32_t>& cores, const std::vector<Region>& loads,
                    const std::vector<Region>& dumps, const std::vector<uint32_t>& args,
                    const Outputs& out) {
    driver::Device& dev = device();
    const cli::CommonOptions opts = options_of(out);
    cli::RunSession session(dev, opts);
    hw::Board& board = dev.board();
    for (const Region& r : loads)
        cli::load_memory(board, r.cores, r.hbm, r.addr,
                         std::span(reinterpret_cast<const uint8_t*>(r.data.data()), r.data.size()),
                         r.label);
    for (const Region& r : dumps)
        cli::check_dump(board, r.cores.at(0), r.hbm, r.addr, r.bytes, r.label);
    // Loading first keeps the instruction-memory error as the board words it (as tpusim run).
    for (uint32_t c : cores) {
        try {
            board.load(c, program);
        } catch (const std::invalid_argument& e) {
            throw cli::InputError(e.what());
        }
    }
    hw::LaunchResult res;
    {
        InterruptScope ctrl_c;
        res = session.launch(source, program, cores, args);
    }
    py::list dumped;
    for (const Region& r : dumps) {
        std::string data(r.bytes, '\0');
        board.fetch(r.cores[0], r.hbm, r.addr,
                    std::span(reinterpret_cast<uint8_t*>(data.data()), data.size()));
        dumped.append(py::bytes(data));
    }
    py::dict d;
    d["summary"] = session.result_json(res);
    session.finish();
    d["dumps"] = dumped;
    d["stats"] = stats_json();
    return d;
}

py::dict Board::gemm(const FloatArray& a, const FloatArray& w, uint32_t M, uint32_t K, uint32_t N,
                     const std::string& precision, const std::vector<uint32_t>& cores,
                     const Outputs& out) {
    driver::Precision p;
    try {
        p = driver::parse_precision(precision);
    } catch (const driver::DeviceError& e) {
        throw cli::InputError(fmt::format("precision: {}", e.what()));
    }
    return with_outputs(out, [&](sim::Tracer*) {
        const driver::GemmResult r =
            driver::gemm(device(), m_cache, to_vector(a), to_vector(w), M, K, N, p, cores);
        py::dict d;
        d["summary"] = cli::gemm_json(r, M, K, N, cores.size(), p, device().config()).dump();
        d["output"] = to_array(r.c);
        return d;
    });
}

py::dict Board::conv2d(const FloatArray& x, const FloatArray& w, const FloatArray& bias,
                       const std::vector<uint32_t>& shape, const std::vector<uint32_t>& cores,
                       const Outputs& out) {
    if (shape.size() != 8) throw std::invalid_argument("conv2d: shape needs 8 sizes");
    const driver::Conv2dShape s{shape[0], shape[1], shape[2], shape[3],
                                shape[4], shape[5], shape[6], shape[7]};
    s.validate();
    return with_outputs(out, [&](sim::Tracer*) {
        const cli::OpRun r = cli::run_conv2d(device(), m_cache, cores, s, to_vector(x),
                                             to_vector(w), to_vector(bias), false);
        return op_result("conv2d", r, cores.size(), device().config());
    });
}

py::dict Board::layernorm(const std::vector<FloatArray>& x, const FloatArray& gamma,
                          const FloatArray& beta, uint32_t rows, uint32_t cols,
                          const std::vector<uint32_t>& cores, const Outputs& out) {
    return with_outputs(out, [&](sim::Tracer*) {
        const cli::OpRun r = cli::run_layernorm(device(), m_cache, cores, rows, cols, to_blocks(x),
                                                repeat(gamma, cores.size()),
                                                repeat(beta, cores.size()), false, true);
        return op_result("layernorm", r, cores.size(), device().config());
    });
}

py::dict Board::softmax(const std::vector<FloatArray>& x, uint32_t rows, uint32_t cols,
                        const std::vector<uint32_t>& cores, const Outputs& out) {
    return with_outputs(out, [&](sim::Tracer*) {
        const cli::OpRun r =
            cli::run_softmax(device(), m_cache, cores, rows, cols, to_blocks(x), false, true);
        return op_result("softmax", r, cores.size(), device().config());
    });
}

py::dict Board::attention(const std::vector<FloatArray>& q, const std::vector<FloatArray>& k,
                          const std::vector<FloatArray>& v, const std::vector<uint32_t>& shape,
                          bool causal, const std::vector<uint32_t>& cores, const Outputs& out) {
    if (shape.size() != 4) throw std::invalid_argument("attention: shape needs 4 sizes");
    const driver::AttentionShape s{shape[0], shape[1], shape[2], shape[3], causal};
    return with_outputs(out, [&](sim::Tracer*) {
        const cli::OpRun r = cli::run_attention(device(), m_cache, cores, s, to_blocks(q),
                                                to_blocks(k), to_blocks(v), false, true);
        return op_result("attention", r, cores.size(), device().config());
    });
}

py::dict Board::allreduce(const std::vector<FloatArray>& x, const std::vector<uint32_t>& cores,
                          const Outputs& out) {
    return with_outputs(out, [&](sim::Tracer*) {
        const cli::OpRun r =
            cli::run_allreduce(device(), m_cache, cores, to_blocks(x), false, true);
        return op_result("allreduce", r, cores.size(), device().config());
    });
}

py::dict Board::model(const std::string& name, const py::dict& sizes, uint32_t batch,
                      const std::vector<uint32_t>& cores, bool train_step,
                      const std::string& precision, const Outputs& out) {
    trainer::ZooOptions z;
    const std::pair<const char*, uint32_t*> fields[] = {
        {"image", &z.image}, {"hidden", &z.hidden}, {"heads", &z.heads}, {"seq", &z.seq},
        {"ffn", &z.ffn},     {"layers", &z.layers}, {"vocab", &z.vocab}, {"seed", &z.seed}};
    for (const auto& [key, field] : fields)
        if (sizes.contains(key)) *field = sizes[key].cast<uint32_t>();
    return with_outputs(out, [&](sim::Tracer* tracer) {
        const cli::ModelRun run =
            cli::run_model(device(), name, z, batch, cores, train_step, precision);
        cli::trace_model(tracer, run, name, batch, train_step);
        py::dict d;
        d["summary"] =
            cli::model_json(run, name, batch, cores.size(), train_step, precision, device())
                .dump();
        return d;
    });
}

}  // namespace tpu::python
