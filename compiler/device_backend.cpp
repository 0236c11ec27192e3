// SPDX-License-Identifier: Apache-2.0
#include "compiler/device_backend.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "driver/kernels/allreduce.h"
#include "hw/board.h"
#include "hw/core/core_model.h"

namespace tpu::compiler {

/// One buffer per replica, freed with the last datum that holds it.
struct DeviceBackend::Allocation {
    driver::Device* dev = nullptr;
    std::vector<driver::Buffer> bufs;  ///< by replica
    uint64_t bytes = 0;                ///< per replica
    std::shared_ptr<DeviceBackendStats> stats;

    /// `wide`: above the 4 GiB window when it is full (Device::alloc_wide); a step that
    /// touches such a buffer runs wide programs (CodegenOptions::wide_addresses).
    Allocation(driver::Device& d, const std::vector<uint32_t>& cores, uint64_t n,
               std::shared_ptr<DeviceBackendStats> s, bool wide = true)
        : dev(&d), bytes(n), stats(std::move(s)) {
        for (uint32_t c : cores)
            bufs.push_back(wide ? d.alloc_wide(std::max<uint64_t>(n, 4), c)
                                : d.alloc(std::max<uint64_t>(n, 4), c));
        stats->device_bytes += bytes;
        stats->peak_device_bytes = std::max(stats->peak_device_bytes, stats->device_bytes);
    }
    ~Allocation() {
        for (const driver::Buffer& b : bufs) {
            try {
                dev->free(b);
            } catch (...) {  // a destructor must not throw; the device reports its own errors
            }
        }
        stats->device_bytes -= bytes;
    }
    Allocation(const Allocation&) = delete;
    Allocation& operator=(const Allocation&) = delete;
};

namespace {

using Alloc = DeviceBackend::Allocation;

/// A tensor of the device backend: host values until a step places it, then HBM in a layout.
/// A tensor of the device backend: host values until a step places it, then HBM in a layout.
struct DeviceTensor : DeviceData {
    std::vector<HostArray> host;  ///< by replica, while not on the device
    std::shared_ptr<Alloc> mem;   ///< on the device, in `layout`
    uint64_t rewrites = 0;        ///< steps that wrote `mem` in place (derived buffers go stale)
};

DeviceTensor& tensor(const DataPtr& d) {
    auto* t = dynamic_cast<DeviceTensor*>(d.get());
    if (!t) throw CompileError("device backend: data from another backend");
    return *t;
}

}  // namespace

EvalOptions device_eval_options(const hw::BoardConfig& cfg, const std::vector<uint32_t>& cores,
                                EvalOptions o) {
    o.mxu_rows = cfg.core.mxu_rows;
    o.vpu_lanes = cfg.core.vpu_lanes;
    o.vpu_sublanes = cfg.core.vpu_sublanes;
    if (!o.all_reduce)
        o.all_reduce = [cfg, cores](const std::vector<std::vector<float>>& rs, float scale) {
            return driver::allreduce_reference(cfg, cores, rs, scale);
        };
    return o;
}

DeviceBackend::DeviceBackend(driver::Device& device, std::vector<uint32_t> cores,
                             CodegenOptions codegen, EvalOptions host)
    : m_dev(device),
      m_cores(std::move(cores)),
      m_codegen(std::move(codegen)),
      m_host(std::move(host)),
      m_stats(std::make_shared<DeviceBackendStats>()) {
    if (m_cores.empty()) throw CompileError("device backend: no cores");
    // The program's all-reduces ring over this backend's replica set.
    m_codegen.replicas = uint32_t(m_cores.size());
    m_codegen.replica_cores = m_cores;
    m_host = device_eval_options(m_codegen.board, m_cores, std::move(m_host));
}

bool DeviceBackend::keeps_values() const {
    return m_dev.config().sim.functional;
}

DataPtr DeviceBackend::upload(const Shape& s, const std::vector<std::vector<float>>& values) {
    if (values.size() != 1 && values.size() != m_cores.size())
        throw CompileError(fmt::format("upload {}: {} value sets for {} replicas", s.to_string(),
                                       values.size(), m_cores.size()));
    auto d = std::make_shared<DeviceTensor>();
    d->shape = s;
    // A timing-only board keeps no values (hw::SparseMemory's Backing::None): nor does the
    // backend, so host memory does not grow with the data (the values may be empty).
    if (!m_dev.config().sim.functional) return d;
    for (size_t r = 0; r < m_cores.size(); ++r)
        d->host.push_back(HostArray::from_floats(s, values[values.size() == 1 ? 0 : r]));
    return d;
}

namespace {

std::vector<uint8_t> read_bytes(driver::Device& dev, const driver::Buffer& b, uint64_t offset,
                                uint64_t bytes) {
    std::vector<uint8_t> mem(bytes);
    if (bytes) dev.read(b, mem.data(), bytes, offset);
    return mem;
}

/// Puts `t` on the device in layout `l` (a timed write; a tensor already there in another
/// layout is read back and written again, as a runtime relayouts a buffer).
void place(driver::Device& dev, const std::vector<uint32_t>& cores,
           const std::shared_ptr<DeviceBackendStats>& stats, DeviceTensor& t, const Layout& l) {
    if (t.mem && t.layout == l) return;
    if (!dev.config().sim.functional) {
        // Timing only: the same transfers, timed and counted, without their bytes.
        const uint64_t bytes = layout_bytes(t.shape, l);
        const uint64_t start = dev.metrics().h2d_cycles;
        if (t.mem)
            for (const driver::Buffer& b : t.mem->bufs) dev.read_timing(b, t.mem->bytes);
        auto mem = std::make_shared<Alloc>(dev, cores, bytes, stats);
        for (const driver::Buffer& b : mem->bufs) dev.write_timing(b, bytes);
        stats->h2d_cycles += dev.metrics().h2d_cycles - start;
        t.mem = std::move(mem);
        t.layout = l;
        t.host.clear();
        return;
    }
    if (t.mem) {
        t.host.clear();
        for (const driver::Buffer& b : t.mem->bufs)
            t.host.push_back(
                array_from_layout_bytes(read_bytes(dev, b, 0, t.mem->bytes), t.shape, t.layout));
    }
    const uint64_t bytes = layout_bytes(t.shape, l);
    auto mem = std::make_shared<Alloc>(dev, cores, bytes, stats);
    // Writes are posted (the host goes on), so their time is the link's, not the host clock's.
    const uint64_t start = dev.metrics().h2d_cycles;
    for (size_t r = 0; r < cores.size(); ++r) {
        const auto raw = layout_bytes_of(t.host.at(r), l);
        dev.write(mem->bufs[r], raw.data(), raw.size());
    }
    stats->h2d_cycles += dev.metrics().h2d_cycles - start;
    t.mem = std::move(mem);
    t.layout = l;
    t.host.clear();
}

}  // namespace

std::vector<float> DeviceBackend::download(const DataPtr& d, size_t r) {
    DeviceTensor& t = tensor(d);
    if (r >= m_cores.size())
        throw CompileError(fmt::format("download: replica {} of {}", r, m_cores.size()));
    if (!t.mem && t.host.empty()) return std::vector<float>(size_t(t.shape.elements()), 0.0f);
    if (!t.mem) return t.host.at(r).floats();
    return array_from_layout_bytes(read_bytes(m_dev, t.mem->bufs[r], 0, t.mem->bytes), t.shape,
                                   t.layout)
        .floats();
}

const StepProgram& DeviceBackend::program(const CompiledStep& step) {
    return program(step, wide(step));
}

const StepProgram& DeviceBackend::program(const CompiledStep& step, bool wide_addresses) {
    // The compiler's CompileCache holds one compiled step per graph structure (source_hash), and
    // this backend's code generation options are fixed but for the addressing, so the hash and
    // it name the program.
    auto it = m_programs.find({step.source_hash, wide_addresses});
    if (it == m_programs.end()) {
        CodegenOptions o = m_codegen;
        o.wide_addresses = wide_addresses;
        auto p = std::make_shared<const StepProgram>(generate_step(step, o));
        m_stats->codegen_seconds += p->seconds;
        ++m_stats->programs_generated;
        it = m_programs.emplace(std::pair{step.source_hash, wide_addresses}, std::move(p)).first;
    }
    return *it->second;
}

bool DeviceBackend::wide(const CompiledStep& step) const {
    // A step whose buffers fit the driver's 4 GiB window runs with 32-bit byte addresses, as
    // every kernel does; a larger one sets a window base per fusion (CodegenOptions).
    return step.memory.peak_bytes() > driver::Device::window_bytes(m_dev.config());
}

void DeviceBackend::check_window(const CompiledStep& step) const {
    // A step whose plan exceeds what the driver can give a core is refused here, with its
    // memory plan, rather than by an allocation later. Above the 4 GiB window the HBM ends
    // below the programs the runtime keeps at its top (Device::alloc_wide).
    const hw::BoardConfig& cfg = m_dev.config();
    const uint64_t window = driver::Device::window_bytes(cfg);
    const uint64_t reach = std::max(window, cfg.hbm.bytes_per_core > cfg.core.imem_bytes
                                                ? cfg.hbm.bytes_per_core - cfg.core.imem_bytes
                                                : 0);
    const MemoryPlan& m = step.memory;
    if (m.peak_bytes() <= reach) return;
    throw CompileError(fmt::format(
        "the step needs {} bytes of HBM per core ({} parameter + {} input + {} output + {} temp "
        "by liveness, {} without reuse); the driver offers {} of a core's {} (the top {} hold "
        "the runtime's programs)",
        m.peak_bytes(), m.parameter_bytes, m.input_bytes, m.output_bytes, m.temp_bytes,
        m.temp_unshared_bytes, reach, cfg.hbm.bytes_per_core, cfg.core.imem_bytes));
}

std::vector<DataPtr> DeviceBackend::execute(const CompiledStep& step,
                                            const std::vector<DataPtr>& parameters,
                                            const std::vector<DataPtr>& inputs) {
    if (parameters.size() != step.parameters.size() || inputs.size() != step.inputs.size())
        throw CompileError(fmt::format(
            "execute: {} parameters and {} inputs bound; the step has "
            "{} and {}",
            parameters.size(), inputs.size(), step.parameters.size(), step.inputs.size()));
    check_window(step);
    for (size_t i = 0; i < parameters.size(); ++i) {
        DeviceTensor& t = tensor(parameters[i]);
        if (!(t.shape == step.parameters[i].shape))
            throw CompileError(fmt::format(
                "execute: parameter {} \"{}\" is {}, bound {}", i, step.parameters[i].name,
                step.parameters[i].shape.to_string(), t.shape.to_string()));
        place(m_dev, m_cores, m_stats, t, step.parameters[i].layout);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
        DeviceTensor& t = tensor(inputs[i]);
        if (!(t.shape == step.inputs[i].shape))
            throw CompileError(fmt::format("execute: input {} \"{}\" is {}, bound {}", i,
                                           step.inputs[i].name, step.inputs[i].shape.to_string(),
                                           t.shape.to_string()));
        place(m_dev, m_cores, m_stats, t, step.inputs[i].layout);
    }
    std::vector<std::shared_ptr<Alloc>> constants, outputs;
    for (const LeafBuffer& lb : step.constants) {
        auto t = std::make_shared<DeviceTensor>();
        t->shape = lb.shape;
        if (m_dev.config().sim.functional)
            t->host.assign(
                m_cores.size(),
                HostArray::from_floats(
                    lb.shape, step.graph.constant_data(step.graph.producer(lb.value).attrs.axis)));
        place(m_dev, m_cores, m_stats, *t, lb.layout);
        constants.push_back(t->mem);
    }
    // An output of a value an earlier output already holds shares that output's buffer
    // (buffer assignment gives it the earlier index): only an output's own index allocates.
    for (size_t i = 0; i < step.outputs.size(); ++i) {
        const BufferRef& b = step.outputs[i].buffer;
        outputs.push_back(b.space == BufferRef::Space::Output && b.index == i
                              ? std::make_shared<Alloc>(m_dev, m_cores, b.bytes, m_stats)
                              : nullptr);
    }
    const auto temp = step.memory.temp_bytes
                          ? std::make_shared<Alloc>(m_dev, m_cores, step.memory.temp_bytes, m_stats)
                          : nullptr;
    const auto alloc_of = [&](BufferRef::Space space, uint32_t index) -> const Alloc& {
        switch (space) {
            case BufferRef::Space::Parameter:
                return *tensor(parameters.at(index)).mem;
            case BufferRef::Space::Input:
                return *tensor(inputs.at(index)).mem;
            case BufferRef::Space::Constant:
                return *constants.at(index);
            case BufferRef::Space::Output:
                return *outputs.at(index);
            case BufferRef::Space::Temp:
                break;
        }
        if (!temp) throw CompileError("execute: a temp buffer in a step without a temp arena");
        return *temp;
    };

    // A step whose plan exceeds the window, or that touches a buffer placed above it (the
    // window was full), runs programs that set their window base per fusion.
    bool beyond = wide(step);
    const auto above = [&](const Alloc* a) {
        for (const driver::Buffer& b : a ? a->bufs : std::vector<driver::Buffer>{})
            beyond |= b.addr + std::max<uint64_t>(b.bytes, 4) > driver::kHbmWindowBytes;
    };
    for (const DataPtr& d : parameters) above(tensor(d).mem.get());
    for (const DataPtr& d : inputs) above(tensor(d).mem.get());
    for (const auto& a : constants) above(a.get());
    for (const auto& a : outputs) above(a.get());
    above(temp.get());
    const StepProgram& prog = program(step, beyond);

    // Each segment's derived arena (ProgramSegment::derived), kept with the program: a buffer is
    // stale until a launch computed it from its parameter's current memory and contents.
    std::vector<DerivedArena*> arenas;
    for (size_t si = 0; si < prog.segments.size(); ++si) {
        const ProgramSegment& seg = prog.segments[si];
        if (seg.derived.empty()) {
            arenas.push_back(nullptr);
            continue;
        }
        DerivedArena& a = m_derived[{step.source_hash, si}];
        const DerivedBuffer& last = seg.derived.back();
        if (!a.mem) {
            // Aligned to kDerivedAlign: the launch argument's low bits are the stale mask.
            a.mem = std::make_shared<Alloc>(
                m_dev, m_cores, last.offset + last.bytes + kDerivedAlign, m_stats, false);
            a.made.assign(seg.derived.size(), {});
        }
        arenas.push_back(&a);
    }
    const auto stale_mask = [&](size_t si) {
        uint32_t mask = 0;
        const auto& derived = prog.segments[si].derived;
        for (size_t j = 0; j < derived.size(); ++j) {
            const DeviceTensor& t = tensor(parameters.at(derived[j].parameter));
            const DerivedArena::Made& m = arenas[si]->made[j];
            if (m.source.expired() || m.source.lock() != t.mem || m.rewrites != t.rewrites)
                mask |= 1u << j;
        }
        return mask;
    };

    uint64_t first_cycle = 0, last_cycle = 0;
    bool any = false;
    // Fusion timing: device fusions from the first core's instruction record, host fusions
    // from the device time between the launches around them.
    std::vector<uint64_t>& fusion_cycles = m_stats->last_fusion_cycles;
    std::vector<std::pair<uint64_t, uint64_t>>& spans = m_stats->last_fusion_spans;
    fusion_cycles.assign(m_time_fusions ? step.fusions.size() : 0, 0);
    spans.assign(fusion_cycles.size(), {0, 0});
    std::vector<size_t> host_run;  // host fusions since the last launch
    uint64_t host_run_begin = 0;   // device cycle the run began
    const auto close_host_run = [&](uint64_t end) {
        const uint64_t begin = std::min(end, host_run_begin);
        uint64_t at = begin;
        for (size_t k = 0; k < host_run.size(); ++k) {
            const size_t i = host_run[k];
            fusion_cycles[i] = (end - begin) / host_run.size();
            if (k + 1 == host_run.size()) fusion_cycles[i] += (end - begin) % host_run.size();
            spans[i] = {at, at + fusion_cycles[i]};
            at += fusion_cycles[i];
        }
        host_run.clear();
    };
    hw::CoreModel* timed = m_time_fusions ? &m_dev.board().core(m_cores.at(0)) : nullptr;
    for (size_t si = 0; si < prog.segments.size(); ++si) {
        const ProgramSegment& seg = prog.segments[si];
        if (seg.host_fusion < 0) {
            if (timed) timed->record(true, seg.fusion_pcs);
            const size_t n = m_cores.size();
            const uint32_t stale = arenas[si] ? stale_mask(si) : 0;
            // Wide programs: arguments in hbm.map units (isa::kHbmMapUnit).
            const bool scaled = !seg.windows.empty();
            const auto base_of = [&](const ProgramArg& pa, size_t i) -> uint64_t {
                return alloc_of(pa.space, pa.index).bufs.at(i).addr;
            };
            const driver::Event ev = m_dev.launch(m_cores, seg.program, [&](size_t i) {
                std::vector<uint32_t> a;
                for (const ProgramArg& pa : seg.args) switch (pa.what) {
                        case ProgramArg::What::Base:
                            a.push_back(uint32_t(scaled ? base_of(pa, i) / isa::kHbmMapUnit
                                                        : base_of(pa, i)));
                            break;
                        case ProgramArg::What::Position:
                            a.push_back(uint32_t(i));
                            break;
                        case ProgramArg::What::Next:
                            a.push_back(m_cores[(i + 1) % n]);
                            break;
                        case ProgramArg::What::Prev:
                            a.push_back(m_cores[(i + n - 1) % n]);
                            break;
                        case ProgramArg::What::Derived: {
                            const uint64_t base = arenas[si]->mem->bufs.at(i).addr;
                            const uint64_t aligned =
                                (base + kDerivedAlign - 1) / kDerivedAlign * kDerivedAlign;
                            a.push_back(uint32_t(aligned) | stale);
                            break;
                        }
                    }
                return a;
            });
            for (size_t j = 0; j < seg.derived.size(); ++j) {
                const DeviceTensor& t = tensor(parameters.at(seg.derived[j].parameter));
                arenas[si]->made[j] = {t.mem, t.rewrites};
            }
            ++m_stats->launches;
            m_stats->last_launch = ev;
            if (timed) {
                close_host_run(ev.start_cycle);
                // A fusion's first instruction issues once the previous kernel has waited for
                // everything it issued: the boundaries are exact, and the fusions tile the launch.
                std::vector<uint64_t> begin(seg.fusions.size(), ev.start_cycle);
                std::vector<bool> seen(seg.fusions.size(), false);
                seen[0] = true;
                std::map<uint32_t, size_t> at;
                for (size_t k = 1; k < seg.fusion_pcs.size(); ++k) at[seg.fusion_pcs[k]] = k;
                for (const hw::InstrRecord& r : timed->records()) {
                    const auto it = at.find(r.pc);
                    if (it == at.end() || seen[it->second]) continue;
                    seen[it->second] = true;
                    begin[it->second] = std::clamp(r.issue, ev.start_cycle, ev.end_cycle);
                }
                timed->record(false);
                for (size_t k = 0; k < seg.fusions.size(); ++k) {
                    const uint64_t end = k + 1 < seg.fusions.size() ? begin[k + 1] : ev.end_cycle;
                    fusion_cycles[seg.fusions[k]] = end - std::min(end, begin[k]);
                    spans[seg.fusions[k]] = {std::min(end, begin[k]), end};
                }
                host_run_begin = ev.end_cycle;
            }
            if (!any) first_cycle = ev.start_cycle;
            last_cycle = ev.end_cycle;
            any = true;
            continue;
        }
        // A custom fusion on the host: its operands come over the host link, its results go back.
        const Fusion& f = step.fusions[size_t(seg.host_fusion)];
        if (m_time_fusions) {
            if (!any && host_run.empty()) host_run_begin = m_dev.now_cycle();
            host_run.push_back(size_t(seg.host_fusion));
        }
        ++m_stats->host_fusions;
        if (!seg.fallback.empty()) {
            ++m_stats->fallback_fusions;
            ++m_stats->fallbacks[seg.fallback];
        }
        if (!m_dev.config().sim.functional) {
            // Timing only: the same transfers, timed and counted, without their bytes. The board
            // holds no values (reads are zeros, writes are dropped), so evaluating the fusion
            // would only cost host time and memory (gigabytes for a large convolution's grad).
            const auto offset = [](const FusionValue& fv) {
                return fv.buffer.space == BufferRef::Space::Temp ? fv.buffer.offset : 0;
            };
            for (size_t r = 0; r < m_cores.size(); ++r)
                for (const FusionValue& fv : f.operands)
                    if (const uint64_t bytes = layout_bytes(fv.shape, fv.layout))
                        m_dev.read_timing(alloc_of(fv.buffer.space, fv.buffer.index).bufs[r], bytes,
                                          offset(fv));
            for (size_t r = 0; r < m_cores.size(); ++r)
                for (const FusionValue& fv : f.results)
                    m_dev.write_timing(alloc_of(fv.buffer.space, fv.buffer.index).bufs[r],
                                       layout_bytes(fv.shape, fv.layout), offset(fv));
            continue;
        }
        Graph g;
        std::map<ValueId, ValueId> map;
        for (const FusionValue& fv : f.operands) map[fv.value] = g.input(fv.shape, "operand");
        for (OpId id : f.ops) {
            const Op& op = step.graph.op(id);
            std::vector<ValueId> ins;
            for (ValueId v : op.operands) ins.push_back(map.at(v));
            const auto res = g.add(op.kind, ins, op.attrs);
            for (size_t k = 0; k < res.size(); ++k) map[op.results[k]] = res[k];
        }
        for (const FusionValue& fv : f.results) g.add_output(map.at(fv.value));
        Bindings b;
        b.inputs.resize(m_cores.size());
        for (size_t r = 0; r < m_cores.size(); ++r)
            for (const FusionValue& fv : f.operands) {
                const Alloc& a = alloc_of(fv.buffer.space, fv.buffer.index);
                const uint64_t off =
                    fv.buffer.space == BufferRef::Space::Temp ? fv.buffer.offset : 0;
                b.inputs[r].push_back(array_from_layout_bytes(
                    read_bytes(m_dev, a.bufs[r], off, layout_bytes(fv.shape, fv.layout)), fv.shape,
                    fv.layout));
            }
        const auto out = evaluate(g, b, m_host);
        for (size_t r = 0; r < m_cores.size(); ++r)
            for (size_t k = 0; k < f.results.size(); ++k) {
                const FusionValue& fv = f.results[k];
                const Alloc& a = alloc_of(fv.buffer.space, fv.buffer.index);
                const uint64_t off =
                    fv.buffer.space == BufferRef::Space::Temp ? fv.buffer.offset : 0;
                const auto raw = layout_bytes_of(out[r][k], fv.layout);
                m_dev.write(a.bufs[r], raw.data(), raw.size(), off);
            }
    }
    // A parameter the step rewrote in place: what was derived from it is stale.
    for (const OutputBuffer& ob : step.outputs)
        if (ob.buffer.space == BufferRef::Space::Parameter && ob.updates_parameter >= 0)
            ++tensor(parameters.at(ob.buffer.index)).rewrites;
    if (m_time_fusions) {
        m_dev.synchronize();  // the trailing host fusions' writes
        close_host_run(m_dev.now_cycle());
    }
    ++m_stats->executions;
    m_stats->last_step_cycles = any ? last_cycle - first_cycle : 0;

    std::vector<DataPtr> res;
    for (size_t i = 0; i < step.outputs.size(); ++i) {
        const OutputBuffer& ob = step.outputs[i];
        switch (ob.buffer.space) {
            case BufferRef::Space::Parameter:
                res.push_back(parameters.at(ob.buffer.index));
                break;
            case BufferRef::Space::Input:
                res.push_back(inputs.at(ob.buffer.index));
                break;
            default: {
                auto t = std::make_shared<DeviceTensor>();
                t->shape = ob.shape;
                t->layout = ob.layout;
                t->mem = ob.buffer.space == BufferRef::Space::Output
                             ? outputs.at(ob.buffer.index)
                             : constants.at(ob.buffer.index);
                res.push_back(std::move(t));
            }
        }
    }
    return res;
}

}  // namespace tpu::compiler
