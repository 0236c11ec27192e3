// SPDX-License-Identifier: Apache-2.0
// tpusim validate: published real-TPU timings (validation/tpuv3.csv) against this board.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "driver/kernels/conv2d.h"
#include "driver/kernels/gemm.h"
#include "sim/cluster.h"
#include "sim/config_io.h"
#include "sim/file_io.h"
#include "tools/tpusim/bench_cases.h"
#include "tools/tpusim/commands.h"
#include "tools/tpusim/op_runs.h"

#ifndef TPU_SOURCE_DIR
#define TPU_SOURCE_DIR "."
#endif

namespace tpu::cli {
namespace {

/// A row's `key=value` parameters (bare words such as a layout tag `NHWC` map to "").
using Params = std::map<std::string, std::string>;

/// One row of the file, checked.
struct Row {
    size_t line = 0;
    std::string workload, params_text;
    Params params;
    uint64_t real_cycles = 0;
    double clock_mhz = 0;
    uint32_t cores = 0;
    std::string config;     ///< the `config` column: the board the row runs on ("" = --config's)
    hw::BoardConfig board;  ///< that board, with the command's --set overrides
    std::string engine = "auto";  ///< a model row's engine: auto, eager or compiled (--engine)
};

/// What running one row gave: its cycles and, for a model row, the engine that ran it.
struct RowRun {
    uint64_t cycles = 0;
    std::string engine;      ///< "compiled", or "eager" with why not compiled ("" for an op row)
    bool run_eager = false;  ///< auto: the compiled step falls back; run the row eagerly instead
};

/// The board a row names in its `config` column: a preset of configs/ by name ("v4-8") or a
/// JSON file (a path with a '/' or ending in .json, relative to the CSV's folder), with the
/// command's --set overrides on top; "" is the command's own board.
using BoardOf = std::function<hw::BoardConfig(const std::string& config)>;

/// Runs one row's workload on the device; returns its cycles from launch to completion.
using Runner = std::function<RowRun(driver::Device&, driver::ProgramCache&, const Row&)>;

/// A runner of an op row, which runs one library kernel or compiled op (no engine to report).
Runner op_row(uint64_t (*run)(driver::Device&, driver::ProgramCache&, const Row&)) {
    return [run](driver::Device& dev, driver::ProgramCache& cache, const Row& r) {
        return RowRun{run(dev, cache, r), ""};
    };
}

/// One row kind: the parameters it takes (all required) and, once its kernel exists, a runner.
struct Kind {
    std::vector<std::string> keys;          ///< required `key=` parameters
    std::vector<std::string> tags;          ///< accepted bare words (layouts)
    Runner run;                             ///< empty: the kind is known but not simulated yet
    std::string missing;                    ///< why `run` is empty
    std::vector<std::string> zero_ok = {};  ///< keys that may be 0 (the others are >= 1)
    /// Checks a row's values together when the file is read, against the board and the row's
    /// cores, before anything runs (empty: nothing to check).
    std::function<void(const Row&, const hw::BoardConfig&)> check = {};
    std::vector<std::string> optional = {};  ///< `key=` parameters that may be left out
};

/// The parameter `key` of a row as an integer below 1e9, at least `min`; the error names the
/// line and key.
uint32_t whole(const Params& p, const std::string& key, size_t line, uint32_t min) {
    const std::string& v = p.at(key);
    uint64_t x = 0;
    const bool digits =
        !v.empty() && v.size() <= 9 && v.find_first_not_of("0123456789") == std::string::npos;
    if (digits) x = std::stoull(v);
    if (!digits || x < min)
        throw InputError(fmt::format("line {}: parameter {}={} is not a{} integer below 1e9", line,
                                     key, v, min ? " positive" : " non-negative"));
    return static_cast<uint32_t>(x);
}

/// The parameter `key` of a row as a positive integer.
uint32_t positive(const Params& p, const std::string& key, size_t line) {
    return whole(p, key, line, 1);
}

uint64_t run_gemm(driver::Device& dev, driver::ProgramCache& cache, const Row& r) {
    const uint32_t M = positive(r.params, "M", r.line), K = positive(r.params, "K", r.line),
                   N = positive(r.params, "N", r.line);
    // Values do not matter for timing; the board runs timing-only (identical cycles).
    const std::vector<float> a(size_t(M) * K, 0.5f), w(size_t(K) * N, 0.25f);
    std::vector<uint32_t> cores(r.cores);
    for (uint32_t i = 0; i < r.cores; ++i) cores[i] = i;
    const auto res = driver::gemm(dev, cache, a, w, M, K, N, driver::Precision::Bf16, cores);
    return res.event.end_cycle - res.event.start_cycle;
}

driver::Conv2dShape conv2d_shape(const Params& p, size_t line) {
    auto get = [&](const char* key) { return positive(p, key, line); };
    return driver::Conv2dShape{get("B"),    get("H"), get("W"),      get("Cin"),
                               get("Cout"), get("k"), get("stride"), whole(p, "pad", line, 0)};
}

void check_conv2d_row(const Row& r, const hw::BoardConfig& cfg) {
    const driver::Conv2dShape s = conv2d_shape(r.params, r.line);
    try {
        s.validate();
    } catch (const driver::DeviceError& e) {
        throw InputError(fmt::format("line {}: {}", r.line, e.what()));
    }
    // The row's CSV keys (B=, H=, ...) name its sizes.
    const SizeName name = [](std::string_view key, uint64_t v) {
        static const std::map<std::string_view, std::string_view> csv = {
            {"batch", "B"},   {"height", "H"}, {"width", "W"},       {"cin", "Cin"},
            {"cout", "Cout"}, {"kernel", "k"}, {"stride", "stride"}, {"pad", "pad"}};
        return fmt::format("{}={}", csv.at(key), v);
    };
    check_conv2d(cfg, r.cores, s, name);
}

uint64_t run_conv2d(driver::Device& dev, driver::ProgramCache& cache, const Row& r) {
    const driver::Conv2dShape s = conv2d_shape(r.params, r.line);
    // Values do not matter for timing; the board runs timing-only (identical cycles).
    const std::vector<float> x(size_t(s.batch) * s.height * s.width * s.cin, 0.5f),
        w(size_t(s.kernel) * s.kernel * s.cin * s.cout, 0.25f), b(s.cout, 0.0f);
    std::vector<uint32_t> cores(r.cores);
    for (uint32_t i = 0; i < r.cores; ++i) cores[i] = i;
    const auto res = driver::conv2d(dev, cache, x, w, b, s, cores);
    return res.event.end_cycle - res.event.start_cycle;
}

/// Cores 0 .. n-1 of a row that used n cores.
std::vector<uint32_t> row_cores(const Row& r) {
    std::vector<uint32_t> cores(r.cores);
    for (uint32_t i = 0; i < r.cores; ++i) cores[i] = i;
    return cores;
}

/// An optional parameter, or its default.
uint32_t optional(const Params& p, const std::string& key, size_t line, uint32_t fallback) {
    return p.count(key) ? positive(p, key, line) : fallback;
}

uint64_t cycles_of(const OpRun& run) {
    return run.event.end_cycle - run.event.start_cycle;
}

uint64_t run_rows_op(driver::Device& dev, driver::ProgramCache& cache, const Row& r) {
    const uint32_t rows = positive(r.params, "rows", r.line),
                   cols = positive(r.params, "cols", r.line);
    return cycles_of(r.workload == "layernorm"
                         ? run_layernorm(dev, cache, row_cores(r), rows, cols, false, 1)
                         : run_softmax(dev, cache, row_cores(r), rows, cols, false, 1));
}

/// An attention row: PyTorchSim's attention graph compiled into one program (what the real row
/// ran through PyTorch/XLA), or with --engine eager the library's fused kernel; auto falls back
/// to the library kernel where the code generator does not cover the shape, the row saying why.
RowRun run_attention_row(driver::Device& dev, driver::ProgramCache& cache, const Row& r) {
    driver::AttentionShape s;
    s.batch = optional(r.params, "batch", r.line, 1);
    s.heads = positive(r.params, "heads", r.line);
    s.seq = positive(r.params, "seq", r.line);
    s.dhead = positive(r.params, "dhead", r.line);
    s.causal = r.params.count("causal") != 0;
    const std::string engine = r.engine == "eager" ? "library" : r.engine;
    const OpRun run = run_attention(dev, cache, row_cores(r), s, false, 1, engine);
    const std::string marker = " (the library's fused kernel: ";
    const size_t at = run.plan.find(marker);
    // The library kernel is the eager path's (one launch, the trainer's kernel).
    if (engine == "library") return RowRun{cycles_of(run), "eager"};
    if (at == std::string::npos) return RowRun{cycles_of(run), "compiled"};
    return RowRun{cycles_of(run),
                  "eager (the library's fused kernel: " + run.plan.substr(at + marker.size())};
}

/// The zoo sizes of a model row (0: the model's default).
trainer::ZooOptions zoo_options(const Row& r) {
    trainer::ZooOptions z;
    const auto get = [&](const char* key) { return optional(r.params, key, r.line, 0); };
    z.hidden = get("hidden");
    z.heads = get("heads");
    z.seq = get("seq");
    z.ffn = get("ffn");
    z.image = get("image");
    // PyTorchSim's EncoderBlock, what the bert-block rows measure, uses ReLU between its ffn
    // layers (validation/README.md); the tag `gelu` runs BERT's GELU instead.
    z.activation =
        r.params.count("gelu") ? trainer::FfnActivation::Gelu : trainer::FfnActivation::Relu;
    return z;
}

/// A zoo model's inference (forward pass) on the row's cores. `auto` runs it as one compiled
/// step (what PyTorch/XLA runs on a TPU) when every fusion of the step is generated for the
/// device, and on the eager engine otherwise (a step with host fallbacks would count host-link
/// traffic, not device work); the row says which ran and why.
RowRun run_model_row(driver::Device& dev, driver::ProgramCache&, const Row& r) {
    const uint32_t batch = optional(r.params, "batch", r.line, 1);
    std::string why;
    if (r.engine != "eager") {
        // The third step: a measured TPU step runs compiled, its parameters resident in the
        // layouts their kernels read (tpusim model --steps).
        const CompiledRun c = run_model_compiled(dev, r.workload, zoo_options(r), batch,
                                                 row_cores(r), "bf16-mixed", false, 3);
        if (c.host.empty()) return RowRun{c.step_cycles, "compiled"};
        std::map<std::string, size_t> reasons;
        for (const HostFusion& h : c.host) ++reasons[h.reason];
        why = fmt::format("{} of {} fusions not generated yet: ", c.host.size(), c.fusions);
        bool first = true;
        for (const auto& [reason, n] : reasons) {
            why += fmt::format("{}{} x {}", first ? "" : "; ", n, reason);
            first = false;
        }
        if (r.engine == "compiled")
            throw InputError(
                fmt::format("line {}: {} with --engine compiled: {}", r.line, r.workload, why));
        // The eager run goes on a board of its own (run_isolated), as every row does.
        return RowRun{0, fmt::format("eager (compiled: {})", why), true};
    }
    const uint64_t cycles =
        run_model(dev, r.workload, zoo_options(r), batch, row_cores(r), false, "bf16-mixed").cycles;
    return RowRun{cycles, "eager"};
}

void check_gemm_row(const Row& r, const hw::BoardConfig& cfg) {
    const SizeName name = [](std::string_view key, uint64_t v) {
        return fmt::format("{}={}", key == "m" ? "M" : key == "k" ? "K" : "N", v);
    };
    check_gemm(cfg, r.cores, positive(r.params, "M", r.line), positive(r.params, "K", r.line),
               positive(r.params, "N", r.line), driver::Precision::Bf16, name);
}

void check_rows_row(const Row& r, const hw::BoardConfig& cfg) {
    check_rows_op(cfg, r.cores, positive(r.params, "rows", r.line),
                  positive(r.params, "cols", r.line), field_names());
}

void check_attention_row(const Row& r, const hw::BoardConfig& cfg) {
    driver::AttentionShape s;
    s.batch = optional(r.params, "batch", r.line, 1);
    s.heads = positive(r.params, "heads", r.line);
    s.seq = positive(r.params, "seq", r.line);
    s.dhead = positive(r.params, "dhead", r.line);
    check_attention(cfg, r.cores, s, field_names());
}

void check_model_row(const Row& r, const hw::BoardConfig& cfg) {
    if (r.params.count("gelu") && r.params.count("relu"))
        throw InputError(
            fmt::format("line {}: {}: tags gelu and relu name two activations; "
                        "give one",
                        r.line, r.workload));
    const trainer::ZooOptions z = zoo_options(r);
    const uint32_t batch = optional(r.params, "batch", r.line, 1);
    try {
        trainer::check_zoo_options(r.workload, z, batch);
    } catch (const std::invalid_argument& e) {
        throw InputError(fmt::format("line {}: {}: {}", r.line, r.workload, e.what()));
    }
    check_model(cfg, r.workload, z, batch, r.cores, false, field_names());
}

/// The row kinds `tpusim validate` knows. A kind whose kernel is not in the library yet is
/// listed with the reason, so its rows are reported as not simulated rather than rejected.
const std::map<std::string, Kind>& kinds() {
    static const std::map<std::string, Kind> k = [] {
        std::map<std::string, Kind> m;
        m["gemm"] = Kind{{"M", "K", "N"}, {}, op_row(run_gemm), {}, {}, check_gemm_row};
        m["conv2d"] = Kind{{"B", "H", "W", "Cin", "Cout", "k", "stride", "pad"},
                           {"NHWC"},
                           op_row(run_conv2d),
                           {},
                           {"pad"},
                           check_conv2d_row};
        m["layernorm"] = Kind{{"rows", "cols"}, {}, op_row(run_rows_op), {}, {}, check_rows_row};
        m["softmax"] = Kind{{"rows", "cols"}, {}, op_row(run_rows_op), {}, {}, check_rows_row};
        m["attention"] = Kind{{"heads", "seq", "dhead"}, {"causal"}, run_attention_row, {}, {},
                              check_attention_row,       {"batch"}};
        m["resnet18"] = Kind{{"batch", "image"}, {}, run_model_row, {}, {}, check_model_row};
        m["resnet50"] = Kind{{"batch", "image"}, {}, run_model_row, {}, {}, check_model_row};
        m["bert-block"] = Kind{{"hidden", "seq", "heads"},
                               {"relu", "gelu"},
                               run_model_row,
                               {},
                               {},
                               check_model_row,
                               {"batch", "ffn"}};
        return m;
    }();
    return k;
}

/// Splits one CSV line into fields: commas separate, double quotes enclose a field that may
/// hold commas, and "" inside quotes is one quote.
std::vector<std::string> csv_fields(const std::string& line, size_t line_no) {
    std::vector<std::string> out(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quoted) {
            if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
                out.back() += '"';
                ++i;
            } else if (c == '"') {
                quoted = false;
            } else {
                out.back() += c;
            }
        } else if (c == '"' && out.back().empty()) {
            quoted = true;
        } else if (c == ',') {
            out.emplace_back();
        } else {
            out.back() += c;
        }
    }
    if (quoted) throw InputError(fmt::format("line {}: a quoted field is not closed", line_no));
    return out;
}

/// A whole number of at most 19 digits (no sign: "-5" is not a count of cycles), or nullopt.
std::optional<uint64_t> digits(const std::string& text) {
    if (text.empty() || text.size() > 19 ||
        text.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    return std::stoull(text);
}

/// One checked row from `f`, the fields of line `n`; errors name the line, and `where` (its
/// "FILE:LINE") where the message does not start with "line N".
Row read_row(const std::vector<std::string>& f, size_t n, const std::string& where,
             const BoardOf& board_of) {
    Row r;
    r.line = n;
    r.config = f.size() > 6 ? f[6] : std::string();
    try {
        r.board = board_of(r.config);
    } catch (const InputError& e) {
        throw InputError(fmt::format("{}: config '{}': {}", where, r.config, e.what()));
    }
    const hw::BoardConfig& cfg = r.board;
    r.workload = f[0];
    r.params_text = f[1];
    const auto kind = kinds().find(r.workload);
    if (kind == kinds().end()) {
        std::vector<std::string> names;
        for (const auto& [name, k] : kinds()) names.push_back(name);
        throw InputError(fmt::format("{}: unknown workload '{}' (known: {})", where, r.workload,
                                     fmt::join(names, ", ")));
    }
    std::istringstream ps(f[1]);
    for (std::string tok; ps >> tok;) {
        const size_t eq = tok.find('=');
        const std::string key = tok.substr(0, eq);
        const bool tag = eq == std::string::npos;
        const auto& k = kind->second;
        std::vector<std::string> allowed = tag ? k.tags : k.keys;
        if (!tag) allowed.insert(allowed.end(), k.optional.begin(), k.optional.end());
        if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
            throw InputError(fmt::format(
                "{}: {} '{}' is not a {} parameter (takes {}{}{}{})", where, tag ? "word" : "key",
                key, r.workload, fmt::join(k.keys, "= "), k.keys.empty() ? "" : "=",
                k.optional.empty() ? ""
                                   : fmt::format(", optionally {}=", fmt::join(k.optional, "= ")),
                k.tags.empty() ? "" : fmt::format(" and {}", fmt::join(k.tags, ", "))));
        if (!r.params.emplace(key, tag ? "" : tok.substr(eq + 1)).second)
            throw InputError(fmt::format("{}: parameter {} appears twice", where, key));
    }
    for (const auto& key : kind->second.keys)
        if (!r.params.count(key))
            throw InputError(fmt::format("{}: {} needs parameter {}=", where, r.workload, key));
    for (const auto& [key, value] : r.params) {
        const auto& k = kind->second;
        if (std::find(k.tags.begin(), k.tags.end(), key) != k.tags.end()) continue;
        whole(r.params, key, n,
              std::find(k.zero_ok.begin(), k.zero_ok.end(), key) == k.zero_ok.end() ? 1 : 0);
    }
    const std::optional<uint64_t> real = digits(f[2]);
    if (!real || *real == 0)
        throw InputError(
            fmt::format("{}: real_cycles '{}' is not a positive integer", where, f[2]));
    r.real_cycles = *real;
    try {
        size_t used = 0;
        r.clock_mhz = std::stod(f[3], &used);
        if (used != f[3].size() || !(r.clock_mhz > 0) || !std::isfinite(r.clock_mhz))
            throw std::invalid_argument("");
    } catch (const std::exception&) {
        throw InputError(fmt::format("{}: clock_mhz '{}' is not a positive number", where, f[3]));
    }
    const std::optional<uint64_t> c = digits(f[4]);
    if (!c || *c == 0)
        throw InputError(fmt::format("{}: cores '{}' is not a positive integer", where, f[4]));
    if (*c > cfg.cores())
        throw InputError(
            fmt::format("{}: the row uses {} cores; the board has {}", where, *c, cfg.cores()));
    r.cores = static_cast<uint32_t>(*c);
    if (f[5].empty())
        throw InputError(fmt::format("{}: the source of the measurement is missing", where));
    // Last: the sizes against the board and the row's cores.
    if (kind->second.check) {
        try {
            kind->second.check(r, cfg);
        } catch (const InputError& e) {
            const std::string what = e.what();
            if (what.rfind("line ", 0) == 0) throw;
            throw InputError(fmt::format("{}: {}", where, what));
        }
    }
    return r;
}

std::vector<Row> read_rows(const std::string& path, const BoardOf& board_of) {
    if (std::filesystem::is_directory(path))
        throw InputError(fmt::format("--data {}: is a directory, not a CSV file", path));
    if (!std::ifstream(path))
        throw InputError(fmt::format("--data {}: cannot open the file", path));
    std::string text;
    try {
        text = sim::read_input_file(path, kMaxCsvBytes);
    } catch (const sim::InputFileError& e) {
        throw InputError(fmt::format("--data: {}", e.what()));
    }
    // A seventh column, `config`, may name each row's board.
    static const std::vector<std::string> kHeader = {"workload",  "params", "real_cycles",
                                                     "clock_mhz", "cores",  "source"};
    std::vector<std::string> header = kHeader;
    std::vector<Row> rows;
    std::istringstream in(text);
    std::string line;
    size_t n = 0;
    auto where = [&](size_t l) { return fmt::format("{}:{}", path, l); };
    while (std::getline(in, line)) {
        ++n;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        // A CSV is text: a control byte (a NUL would also cut every later message short) is
        // refused where it is.
        const auto bad = std::find_if(line.begin(), line.end(), [](char ch) {
            return static_cast<unsigned char>(ch) < 0x20 && ch != '\t';
        });
        if (bad != line.end())
            throw InputError(fmt::format("{}: byte 0x{:02x} at column {}: a CSV row is text",
                                         where(n), static_cast<unsigned char>(*bad),
                                         bad - line.begin() + 1));
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        try {
            auto f = csv_fields(line, n);
            if (n == 1) {
                std::vector<std::string> with_config = kHeader;
                with_config.push_back("config");
                if (f != kHeader && f != with_config)
                    throw InputError(fmt::format(
                        "{}: the header must be '{}' (with an optional seventh column config)",
                        where(n), fmt::join(kHeader, ",")));
                header = f;
                continue;
            }
            if (f.size() != header.size())
                throw InputError(fmt::format("{}: {} fields, expected {} ({})", where(n), f.size(),
                                             header.size(), fmt::join(header, ",")));
            rows.push_back(read_row(f, n, where(n), board_of));
        } catch (const InputError& e) {
            // Messages that name only "line N" get the file too.
            const std::string what = e.what();
            if (what.rfind("line ", 0) == 0) throw InputError(fmt::format("{}: {}", path, what));
            throw;
        }
    }
    if (n == 0) throw InputError(fmt::format("--data {}: the file is empty", path));
    if (rows.empty()) throw InputError(fmt::format("--data {}: no rows after the header", path));
    return rows;
}

/// Runs one row on a board of its own, so no row sees the HBM state (open rows, refresh
/// phase) an earlier row left behind: the bench's runner (each board owns its SystemC context,
/// so every row starts on a fresh board at cycle 0), timing-only.
RowRun run_isolated(const hw::BoardConfig& cfg, const Kind& kind, const Row& r,
                    const std::string& path) {
    RowRun out;
    const bench::BenchCase c{fmt::format("{}:{}", path, r.line),
                             r.workload,
                             false,
                             true,
                             std::nullopt,
                             [&](driver::Device& dev) {
                                 driver::ProgramCache cache;
                                 bench::CaseRun run;
                                 out = kind.run(dev, cache, r);
                                 run.cycles = out.cycles;
                                 return run;
                             }};
    try {
        out.cycles = bench::run_case(cfg, c).cycles;
        return out;
    } catch (const driver::DeviceError& e) {
        if (e.kind() == driver::ErrorKind::Usage || e.kind() == driver::ErrorKind::OutOfMemory)
            throw InputError(e.what());
        throw RunError(e.what());
    }
}

}  // namespace

void register_validate_command(CLI::App& app) {
    struct Opts {
        CommonOptions common;
        std::string data = std::string(TPU_SOURCE_DIR) + "/validation/tpuv3.csv";
        std::string engine = "auto";
    };
    auto o = std::make_shared<Opts>();
    auto* cmd = app.add_subcommand(
        "validate", "compare simulated cycles with published real-TPU timings (a CSV)");
    cmd->add_option("--data", o->data,
                    "CSV of real timings (workload,params,real_cycles,"
                    "clock_mhz,cores,source)")
        ->capture_default_str();
    cmd->add_option("--engine", o->engine,
                    "how model rows (resnet18, resnet50, bert-block) and attention rows run: "
                    "auto = one compiled step (tpusim model --engine compiled; attention: "
                    "PyTorchSim's graph compiled) when every fusion of it is generated for the "
                    "device, else the eager engine (attention: the library's fused kernel), the "
                    "row saying why; compiled = fail where a fusion is not generated; eager = one "
                    "launch per op (attention: the library kernel)")
        ->check(CLI::IsMember({"auto", "eager", "compiled"}))
        ->capture_default_str();
    add_config_options(*cmd, o->common);
    cmd->add_flag("--json", o->common.json,
                  "print {\"rows\":[{workload,params,sim_cycles,real_cycles,error}],\"mae\"}");
    cmd->callback([o] {
        // The published rows are single-board timings: split over ranks, every rank would run
        // every row and print the table again.
        if (sim::Cluster::distributed())
            throw InputError(
                "validate runs each row on a board of its own in one process; run it without "
                "mpirun");
        const hw::BoardConfig cfg = o->common.board_config();
        // Timing only: cycle counts are identical with the arithmetic on (hw/README.md).
        const auto timing_only = [](hw::BoardConfig b) {
            b.sim.functional = false;
            return b;
        };
        const std::filesystem::path folder = std::filesystem::path(o->data).parent_path();
        const BoardOf board_of = [&](const std::string& name) {
            if (name.empty()) return timing_only(cfg);
            const bool file = name.find('/') != std::string::npos ||
                              (name.size() > 5 && name.substr(name.size() - 5) == ".json");
            const std::string path =
                file ? (folder / name).string()
                     : std::string(TPU_SOURCE_DIR) + "/configs/" + name + ".json";
            if (!file && !std::filesystem::is_regular_file(path))
                throw InputError(fmt::format("no preset {} in {}/configs", name, TPU_SOURCE_DIR));
            try {
                return timing_only(hw::BoardConfig::load(path, o->common.sets));
            } catch (const sim::ConfigError& e) {
                throw InputError(e.what());
            }
        };
        std::vector<Row> rows = read_rows(o->data, board_of);
        for (Row& r : rows) r.engine = o->engine;
        nlohmann::ordered_json out;
        out["rows"] = nlohmann::ordered_json::array();
        double abs_sum = 0;
        size_t simulated = 0;
        std::string table = fmt::format("{:<8} {:<58} {:>12} {:>12} {:>8}\n", "workload", "params",
                                        "sim cycles", "real cycles", "error");
        for (const Row& r : rows) {
            nlohmann::ordered_json j;
            j["workload"] = r.workload;
            j["params"] = r.params_text;
            if (!r.config.empty()) j["config"] = r.config;
            const Kind& kind = kinds().at(r.workload);
            // Real cycles count the row's clock: compare durations, shown in board cycles.
            const double real_board = double(r.real_cycles) * r.board.clock_mhz / r.clock_mhz;
            if (!kind.run) {
                j["sim_cycles"] = nullptr;
                j["real_cycles"] = r.real_cycles;
                j["error"] = nullptr;
                j["skipped"] = kind.missing;
                table +=
                    fmt::format("{:<8} {:<58} {:>12} {:>12} {:>8}  (not simulated: {})\n",
                                r.workload, r.params_text, "-", r.real_cycles, "-", kind.missing);
                out["rows"].push_back(j);
                continue;
            }
            RowRun run = run_isolated(r.board, kind, r, o->data);
            if (run.run_eager) {
                Row eager = r;
                eager.engine = "eager";
                run.cycles = run_isolated(r.board, kind, eager, o->data).cycles;
            }
            const uint64_t sim_cycles = run.cycles;
            if (!run.engine.empty()) j["engine"] = run.engine;
            const double error = double(sim_cycles) / real_board - 1.0;
            abs_sum += std::abs(error);
            ++simulated;
            j["sim_cycles"] = sim_cycles;
            j["real_cycles"] = r.real_cycles;
            j["error"] = error;
            table += fmt::format("{:<8} {:<58} {:>12} {:>12} {:>+7.1f}%{}\n", r.workload,
                                 r.params_text, sim_cycles, r.real_cycles, 100.0 * error,
                                 run.engine.empty() ? "" : "  " + run.engine);
            out["rows"].push_back(j);
        }
        const double mae = simulated ? abs_sum / double(simulated) : 0.0;
        out["mae"] = simulated ? nlohmann::ordered_json(mae) : nlohmann::ordered_json(nullptr);
        out["simulated_rows"] = simulated;
        if (o->common.json) {
            fmt::print("{}\n", out.dump());
        } else {
            fmt::print("{}", table);
            fmt::print("mean absolute error {:.1f}% over {} of {} rows ({} at {} MHz)\n",
                       100.0 * mae, simulated, rows.size(), cfg.name, cfg.clock_mhz);
        }
    });
}

}  // namespace tpu::cli
