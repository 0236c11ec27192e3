// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/compiled_step.h"
#include "driver/device.h"
#include "driver/kernels/attention.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/gemm.h"
#include "driver/program_cache.h"
#include "tools/tpusim/commands.h"
#include "trainer/graph.h"
#include "trainer/record.h"
#include "trainer/zoo.h"

namespace tpu::sim {
class Tracer;
}

/// Single ops and zoo models as `tpusim op`, `tpusim model`, `tpusim validate` and the Python
/// module (`import tpusim`) run them, so a validation row or a Python call measures exactly what
/// the command reports.
namespace tpu::cli {

/// Host values of an op's operand, one block per core of the run (each core's share, the same
/// shape on every core).
using PerCore = std::vector<std::vector<float>>;

/// What one run of an op reports.
struct OpRun {
    nlohmann::ordered_json params;  ///< the kind's sizes, as given
    driver::Event event;            ///< the op's launches, merged
    uint64_t macs = 0;              ///< useful multiply-accumulates
    double mxu_utilization = 0;     ///< macs over the cores' MXU peak for the op's cycles
    uint64_t hbm_bytes = 0;         ///< bytes the op's DMAs moved between HBM and VMEM
    std::string plan;               ///< the tiling, one line
    // --check: the device against the bit-exact host reference, and the reference against fp64.
    bool bitexact = false;     ///< device result == host reference, bit for bit
    double max_abs_error = 0;  ///< max |device - fp64|
    double max_rel_error = 0;  ///< max_abs_error / max |fp64|
    std::string digest;        ///< FNV-1a of the device result's bytes (ops that compute one)
    /// The device result, every core's block in core order (with `keep_result` only).
    std::vector<float> result;
};

// Size checks, in 64 bits against the board, before anything is allocated on the host or the
// device: each core's share of the op's tensors must fit the HBM its kernels address. Errors
// are InputError naming the sizes through `name` (options for `op`, CSV fields for `validate`).

/// Layer norm or softmax of `rows_total` x `cols` over `cores` cores.
void check_rows_op(const hw::BoardConfig& cfg, size_t cores, uint64_t rows_total, uint64_t cols,
                   const SizeName& name);
/// Attention of `shape` (shape.batch sequences in all) over `cores` cores.
void check_attention(const hw::BoardConfig& cfg, size_t cores, const driver::AttentionShape& shape,
                     const SizeName& name);
/// conv2d of `shape` (shape.batch images in all) over `cores` cores, including the kernel's own
/// limits (Conv2dShape::validate on one core's share).
void check_conv2d(const hw::BoardConfig& cfg, size_t cores, const driver::Conv2dShape& shape,
                  const SizeName& name);
/// The library GEMM of M x K x N in `precision` over `cores` cores: however it splits, some
/// core holds at least a cores-th of A, W and C.
void check_gemm(const hw::BoardConfig& cfg, size_t cores, uint64_t M, uint64_t K, uint64_t N,
                driver::Precision precision, const SizeName& name);
/// Zoo model `model` on `batch` examples over `cores` cores: each core's share of the inputs
/// and labels (the sizes themselves are make_zoo_model's to check).
void check_model(const hw::BoardConfig& cfg, const std::string& model,
                 const trainer::ZooOptions& options, uint64_t batch, size_t cores, bool train_step,
                 const SizeName& name);
/// The all-reduce of `elements` fp32 values per core.
void check_allreduce(const hw::BoardConfig& cfg, uint64_t elements, const SizeName& name);

/// Fills the --check fields from the device result, the bit-exact reference and fp64.
void compare(OpRun& r, const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<double>& exact);

/// Each core's share of `total` rows or sequences: even shares, the last ones padded (as XLA
/// pads a sharded dimension), so every replica has one shape.
uint32_t core_share(uint32_t total, size_t cores);

/// Layer normalisation of `rows_total` x `cols` random values (random gain and bias), the rows
/// data-parallel over `cores` in even, padded shares; `check` compares with the references.
/// Runs as the one-op program PyTorch/XLA compiles (compiler/, one launch) when the code
/// generator covers the shape, else the hand-written kernel; OpRun::plan says which.
OpRun run_layernorm(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                    bool check, uint32_t seed);
/// As above on given values: x[i] is core i's core_share(rows_total) x cols block, gamma[i] and
/// beta[i] its cols gain and bias values.
OpRun run_layernorm(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                    const PerCore& x, const PerCore& gamma, const PerCore& beta, bool check,
                    bool keep_result);
/// Softmax over each of `rows_total` rows of `cols` random values, as run_layernorm.
OpRun run_softmax(driver::Device& dev, driver::ProgramCache& cache,
                  const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                  bool check, uint32_t seed);
/// As above on given values (x as in run_layernorm).
OpRun run_softmax(driver::Device& dev, driver::ProgramCache& cache,
                  const std::vector<uint32_t>& cores, uint32_t rows_total, uint32_t cols,
                  const PerCore& x, bool check, bool keep_result);
/// Attention of `shape` (shape.batch sequences in all, data-parallel over `cores`) on random
/// values. `engine`: "compiled" runs PyTorchSim's attention graph (the validation rows':
/// `k q^T / sqrt(d)`, softmax over the keys, `v^T p`, out [heads, dhead, seq]) as one compiled
/// program; "library" the hand-written fused kernel (`p v`, out [heads, seq, dhead]; causal
/// masks); "auto" the compiled program, or the library kernel (its plan says why) where the code
/// generator does not cover the shape.
OpRun run_attention(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const driver::AttentionShape& shape,
                    bool check, uint32_t seed, const std::string& engine = "auto");
/// As above on given values: q[i], k[i], v[i] hold core i's core_share(shape.batch) sequences,
/// layout [batch, heads, seq, dhead].
OpRun run_attention(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const driver::AttentionShape& shape,
                    const PerCore& q, const PerCore& k, const PerCore& v, bool check,
                    bool keep_result);
/// y = conv2d(x, w) + bias over `cores`, data-parallel over the batch (driver::conv2d on host
/// arrays: x NHWC, w HWIO, bias Cout); the result is always kept (the driver reads it back).
OpRun run_conv2d(driver::Device& dev, driver::ProgramCache& cache,
                 const std::vector<uint32_t>& cores, const driver::Conv2dShape& shape,
                 const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& bias, bool check);
/// The ring all-reduce (sum) of x[i] (one vector per core of `cores`, all of one length) in
/// HBM, with the digest of every replica's result and its bandwidth-latency formula in the plan.
OpRun run_allreduce(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, const PerCore& x, bool check,
                    bool keep_result);
/// Makes replica i's input of `n` values into `out` (resized by the caller).
using AllreduceInput = std::function<void(size_t i, std::vector<float>& out)>;
/// As above, with each input of `n` values made by `input` only where it is needed: with
/// `check` every input is kept for the reference; otherwise an input is made only where the
/// board holds values for its core (this rank's cores of a functional board) and dropped once
/// written, and every replica's result leaves the device as a digest alone. A v3-2048 board's
/// inputs are 32 GiB at the CLI's default size.
OpRun run_allreduce(driver::Device& dev, driver::ProgramCache& cache,
                    const std::vector<uint32_t>& cores, uint32_t n, const AllreduceInput& input,
                    bool check, bool keep_result);

/// The result of `tpusim op KIND --json`: the kind, its sizes, cycles, utilisation, HBM bytes,
/// the plan, and with `check` the comparison.
nlohmann::ordered_json op_json(const std::string& kind, const OpRun& r, size_t cores,
                               const hw::BoardConfig& cfg, bool check);
/// The result of `tpusim gemm --json` without the check: sizes, cycles, utilisation, the split.
nlohmann::ordered_json gemm_json(const driver::GemmResult& r, uint32_t M, uint32_t K, uint32_t N,
                                 size_t cores, driver::Precision precision,
                                 const hw::BoardConfig& cfg);

/// What one run of a zoo model reports.
struct ModelRun {
    std::string description;                    ///< the model's shape
    uint64_t cycles = 0;                        ///< the forward pass, or the training step
    uint64_t begin_cycle = 0;                   ///< board cycle the measured span began
    double host_seconds = 0;                    ///< host time of the same span
    std::vector<trainer::LayerProfile> layers;  ///< per-layer work, in first-use order
};

/// One inference (the forward pass, no transfers) or one training step of zoo model `name`
/// on `batch` examples, data-parallel over `cores`. Bad options throw InputError.
ModelRun run_model(driver::Device& dev, const std::string& name, const trainer::ZooOptions& options,
                   uint32_t batch, const std::vector<uint32_t>& cores, bool train_step,
                   const std::string& precision);
/// The result of `tpusim model --json`: the model, mode, cycles of the inference or step alone,
/// the whole run's cycles (uploads included), the per-layer table and the run's energy estimate.
nlohmann::ordered_json model_json(const ModelRun& run, const std::string& name, uint32_t batch,
                                  size_t cores, bool train_step, const std::string& precision,
                                  driver::Device& dev);
/// One span per layer run on the trace's host/layers track, and the span the command reports on
/// host/model (nothing without a tracer).
void trace_model(sim::Tracer* tracer, const ModelRun& run, const std::string& name, uint32_t batch,
                 bool train_step);

/// A fusion of the compiled step that ran on the host.
struct HostFusion {
    std::string fusion;   ///< "fusion.3 output dot+reshape"
    std::string layers;   ///< its layers, comma-separated
    std::string reason;   ///< the NotYetGenerated message (or "custom call")
    uint64_t cycles = 0;  ///< device cycles its host round trip took
};

/// One fusion of a compiled step, as `tpusim model --fusions` lists it.
struct FusionRow {
    std::string fusion;        ///< "fusion.3 output dot+reshape"
    std::string layers;        ///< its layers, comma-separated
    bool on_host = false;      ///< a host fallback or custom call (cycles: its host round trip)
    uint64_t cycles = 0;       ///< its device cycles in the step (DeviceBackendStats)
    uint64_t begin_cycle = 0;  ///< where those cycles lie on the device's clock
    /// bytes of the arrays it reads and writes, each counted once: the least HBM traffic it
    /// can have (a kernel that streams an operand more than once moves more)
    uint64_t hbm_bytes = 0;
};

/// What one compiled inference reports.
struct CompiledRun {
    std::string description;       ///< the model's shape
    uint64_t cycles = 0;           ///< the step: every fusion's cycles, host fallbacks included
    uint64_t device_cycles = 0;    ///< of those, the fusions generated for the device
    uint64_t step_cycles = 0;      ///< first launch's start to last launch's end (launches too)
    double host_seconds = 0;       ///< host time of the step (recording, compiling, running)
    double compile_seconds = 0;    ///< of which the compiler's passes
    double codegen_seconds = 0;    ///< and code generation
    uint64_t launches = 0;         ///< device programs the step launched
    uint32_t steps = 1;            ///< steps run; the figures are the last one's
    size_t fusions = 0;            ///< fusions of the compiled step
    std::vector<HostFusion> host;  ///< the fusions that ran on the host
    std::vector<FusionRow> fusion_rows;  ///< every fusion, in program order
    compiler::MemoryPlan memory;   ///< HBM per core
    std::vector<trainer::CompiledLayer> layers, device_layers;  ///< all cycles; device only
};

/// One inference (or training step) of zoo model `name` recorded into the compiler and run as
/// one compiled step (LazyContext on a DeviceBackend over `cores`, host fallback on).
CompiledRun run_model_compiled(driver::Device& dev, const std::string& name,
                               const trainer::ZooOptions& options, uint32_t batch,
                               const std::vector<uint32_t>& cores, const std::string& precision,
                               bool train_step, uint32_t steps = 1);

}  // namespace tpu::cli
