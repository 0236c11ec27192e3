// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/program_cache.h"

/// The library GEMM: C (M x N, fp32) = A (M x K) x W (K x N) for any shape, rows split over a
/// set of cores, every MXU of a core (a column panel each), double-buffered weight tiles, in one
/// of three precisions.
namespace tpu::driver {

/// Matmul precision: bf16 operands (1 MXU pass) or fp32 operands split into bf16 parts.
enum class Precision : uint8_t {
    Bf16,       ///< 1 pass: bf16(a) x bf16(w)
    Fp32Pass3,  ///< 3 passes: mid.hi, hi.mid, hi.hi
    Fp32Pass6,  ///< 6 passes: lo.hi, hi.lo, mid.mid, mid.hi, hi.mid, hi.hi
};
/// (A part, W part) of each MXU pass in order, smallest terms first so they are not lost in
/// the sum (parts as hw::split3: 0 hi, 1 mid, 2 lo).
std::vector<std::pair<int, int>> mxu_passes(Precision p);
/// "bf16", "fp32-3pass", "fp32-6pass".
std::string_view precision_name(Precision p);
/// Parses a precision name; throws DeviceError(Usage) listing the valid names.
Precision parse_precision(std::string_view name);

/// One core's share of a GEMM and how its kernel tiles it.
struct GemmTiling {
    uint32_t R = 0, C = 0;    ///< MXU array
    uint32_t Kp = 0, Np = 0;  ///< K and N padded to tile multiples (XLA-style padding)
    uint32_t block_rows = 0;  ///< LHS rows streamed per matmul (T)
    uint32_t mxus = 0;        ///< MXUs used: column panels per group (plan_gemm: all, 1-8)
    Precision precision = Precision::Bf16;
    /// Operands in the tile-major HBM layout (GemmKey) instead of row-major.
    bool tiled = false;
    /// A's panels stream through two VMEM slots with the weight tiles in every column group
    /// (A read once per group) instead of staying in VMEM for the whole block (read once), so
    /// VMEM no longer bounds the block rows.
    bool a_stream = false;
    auto operator<=>(const GemmTiling&) const = default;
};

/// Chooses the tiling of a GEMM whose largest per-core share has `max_rows` rows: the block
/// rows T (even blocks of at most 4096 rows) and the A mode with the smallest
/// gemm_estimate_cycles among those that fit in VMEM (ties go to A kept, then fewer blocks).
GemmTiling plan_gemm(const hw::BoardConfig& cfg, uint32_t max_rows, uint32_t K, uint32_t N,
                     Precision precision);
/// The planner's cost model of one core's kernel on `rows` rows, in cycles (driver/README.md,
/// "The planner"): the bytes that must move before the first matmul (its A panel and first
/// weight tiles) and after the last one (the last group's C) at HBM peak, plus the larger of
/// the MXU cycles (a step per pass costs what hw::MxuTimer::swap_step_cycles charges a new
/// weight tile: its rows, at least R cycles, plus the array's drain R + C - 2 when
/// core.mxu_swap_drains) and the other HBM bytes at peak (A once, or
/// once per column group when streamed; W once per row block; C once).
double gemm_estimate_cycles(const hw::BoardConfig& cfg, const GemmTiling& t, uint32_t rows);
/// The share of HBM peak the planners count on while the MXUs work (gemm.cpp says why 0.75).
inline constexpr double kGemmPlannedHbmShare = 0.75;
/// What a kernel built on the GEMM's schedule moves besides the GEMM's own operands, for
/// gemm_estimate_cycles: the fused dot kernel (matmul_kernel.h) reads fp32 operands and
/// converts them in VMEM, reads its epilogue's side inputs and may store C as bf16.
struct GemmTraffic {
    bool a_fp32 = false;        ///< A read as fp32 (4 bytes a value) instead of P bf16 parts
    bool w_fp32 = false;        ///< W read as fp32 instead of P bf16 parts
    uint32_t full_sides = 0;    ///< fp32 tensors of C's shape read per output tile (residuals)
    uint32_t column_sides = 0;  ///< fp32 vectors of N values read once (biases)
    bool c_bf16 = false;        ///< C stored as bf16 (2 bytes a value)
    auto operator<=>(const GemmTraffic&) const = default;
};
/// gemm_estimate_cycles with a fused kernel's `extra` traffic counted in the HBM bytes (and in
/// the exposed bytes: the first A panel, the last group's side tiles).
double gemm_estimate_cycles(const hw::BoardConfig& cfg, const GemmTiling& t, uint32_t rows,
                            const GemmTraffic& extra);

/// Program-cache key of the library GEMM kernel: one core's tiling and C's layout.
/// HBM layouts, each zero-padded, parts of A (W) rows x Kp x 2 (Kp x Np x 2) bytes apart:
/// - row-major (`tiled` off; what the device-side packing of tensor_ops writes): A parts
///   rows x Kp bf16, W parts Kp x Np bf16, C rows x Np fp32 (or compact: rows x
///   `compact_cols`, the padding columns of the last panel dropped, N <= Np < N + C);
/// - tile-major (`tiled` on; what gemm() writes from the host, as a TPU runtime converts arrays
///   to XLA's tiled HBM layouts on transfer): A as Kp / R column panels, each rows x R bf16 and
///   contiguous; W as R x C tiles, tile (k, n) at ((k Np / C + n) R C 2) bytes, each row-major
///   and contiguous; C as Np / C column panels, each rows x C fp32 and contiguous. Every DMA of
///   the kernel then reads or writes one contiguous run, which HBM serves at streaming rates.
struct GemmKey {
    GemmTiling tiling;          ///< the core's tiling and operand layout
    uint32_t compact_cols = 0;  ///< 0: C padded to Np columns (or tiled); n: compact rows x n
    auto operator<=>(const GemmKey&) const = default;
    std::string name() const { return "gemm"; }
    friend size_t hash_value(const GemmKey& k);
};

/// Where emit_gemm's operands are.
struct GemmOperands {
    streaming::Operand a;             ///< HBM: A's part 0 in the key's layout
    streaming::Operand w;             ///< HBM: W's part 0
    streaming::Operand c;             ///< HBM: C
    streaming::Operand rows;          ///< scalar: rows of A and C on this core
    streaming::Operand a_part_bytes;  ///< scalar: bytes between A's parts (rows x Kp x 2)
};

/// Emits the library GEMM kernel for `key` into `b` (driver/README.md, "How the GEMM kernel is
/// laid out and scheduled"): resources from b's pools in its own scope; on return every
/// instruction it issued has completed. It uses 26 scalar registers besides its operands, so a
/// caller may hold few others. Counters start from 0 without code when it is the first code of
/// the program (a launch clears the registers). Throws DeviceError(Usage) for a compact C in the
/// tiled layout or a compact width that does not match Np.
void emit_gemm(isa::Builder& b, const GemmKey& key, const GemmOperands& ops);
/// The stand-alone kernel: launch arguments a, w, c (HBM addresses), rows (on this core),
/// a_part_bytes (rows x Kp x 2), then emit_gemm, then halt.
isa::Program generate(const GemmKey& key);

/// How gemm() splits a GEMM over cores: `gm` row blocks times `gn` blocks of 128-column tiles;
/// core (i, j) = cores[i gn + j] computes C's block (i, j); cores past gm gn sit out.
struct GemmSplit {
    uint32_t gm = 1;  ///< row blocks (A is split, W is not)
    uint32_t gn = 1;  ///< column blocks (W and C are split, A is not)
    friend bool operator==(const GemmSplit&, const GemmSplit&) = default;
};

/// The split of C = A (M x K) x W (K x N) over up to `cores` cores with the smallest
/// gemm_estimate_cycles of the busiest core under its plan_gemm tiling; ties go to fewer HBM
/// bytes, then to the first candidate (fewer row blocks). Every split gm x gn <= cores with
/// gm <= M and gn <= N/128 (rounded up) is a candidate.
GemmSplit plan_gemm_split(const hw::BoardConfig& cfg, uint32_t M, uint32_t K, uint32_t N,
                          Precision precision, uint32_t cores);

/// Result of a library GEMM.
struct GemmResult {
    std::vector<float> c;        ///< M x N, row-major; empty with sim.functional=false
    Event event;                 ///< the launch
    uint64_t macs = 0;           ///< useful multiply-accumulates (M K N x passes)
    double mxu_utilization = 0;  ///< macs / (cores x MXUs x R x C x cycles)
    GemmSplit split;             ///< how the cores shared C
    GemmTiling tiling;           ///< the busiest core's tiling (the widest column block)
    uint64_t hbm_bytes = 0;      ///< bytes the kernel's DMAs moved between HBM and VMEM
    /// A and W read once and C written once: P (M K + K N) 2 + M N 4 bytes (P bf16 parts).
    uint64_t min_hbm_bytes = 0;
    /// The roofline bound in cycles: max(macs over every MXU of `cores`, min_hbm_bytes over
    /// their HBM peak), with no launch costs.
    double roofline_cycles = 0;
};

/// Runs C = A x W (row-major fp32 host arrays; bf16 precision rounds them) on `cores`, split
/// by plan_gemm_split: uploads each core's rows of A and columns of W in the tile-major layout,
/// launches every block at once, reads C back, frees the buffers. With sim.functional=false
/// the transfers are timed without moving bytes (Device::write_timing) and `c` stays empty.
GemmResult gemm(Device& dev, ProgramCache& cache, const std::vector<float>& a,
                const std::vector<float>& w, uint32_t M, uint32_t K, uint32_t N,
                Precision precision, const std::vector<uint32_t>& cores);

/// The host reference with the device's exact numerics: per output, for each K tile of R rows
/// in order and each pass in order, a tile pass sum (k order, from +0.0) added to the fp32
/// result (the first one stored).
std::vector<float> gemm_reference(const std::vector<float>& a, const std::vector<float>& w,
                                  uint32_t M, uint32_t K, uint32_t N, Precision precision,
                                  uint32_t R);

}  // namespace tpu::driver
