// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hw/board_config.h"

namespace tpu::driver {
class Device;
}

/// The simulator benchmark cases: the one list that both `tpusim bench` and bench/sim_bench run.
namespace tpu::bench {

/// What one run of a case measured.
struct CaseRun {
    uint64_t cycles = 0;             ///< simulated board cycles of the case's launches
    double host_seconds = 0;         ///< host wall time of the case's timed region
    double launch_host_seconds = 0;  ///< the part of it spent simulating launches
};

/// The shape of a GEMM C (m x n) = A (m x k) x W (k x n).
struct GemmShape {
    uint32_t m = 0, k = 0, n = 0;
    auto operator<=>(const GemmShape&) const = default;
};

/// One benchmark case.
struct BenchCase {
    std::string name;                ///< unique, "KIND_SIZE/functional" or ".../timing"
    std::string what;                ///< one-line description for the README and --help
    bool functional = true;          ///< sim.functional while the case runs
    bool quick = true;               ///< part of --quick (costs well under 3 host seconds)
    std::optional<GemmShape> eigen;  ///< Eigen fp32 GEMM of this shape as the yardstick
    /// Runs the case on a freshly opened Device whose sim.functional is `functional`.
    std::function<CaseRun(driver::Device&)> run;
};

/// Every case, in table order.
std::vector<BenchCase> bench_cases();
/// The cases to run: `quick` drops the slow ones, a non-empty `filter` keeps names containing
/// it. Throws DeviceError(Usage) naming the filter and the case names when nothing is left.
std::vector<BenchCase> select_cases(bool quick, const std::string& filter);

/// Runs `c` in this process on a Device of its own, built from `cfg` with sim.functional set to
/// c.functional (each board owns its SystemC context, so every case starts on a fresh board at
/// cycle 0). Errors of the case are rethrown with the case's name in front: DeviceError with
/// its kind, anything else as std::runtime_error.
CaseRun run_case(const hw::BoardConfig& cfg, const BenchCase& c);

/// Host seconds of an Eigen fp32 GEMM (Eigen::MatrixXf product), best of 2..5 repetitions
/// (fewer once they add up to `budget_seconds`), memoised per shape.
class EigenYardstick {
public:
    explicit EigenYardstick(double budget_seconds = 2.0) : m_budget(budget_seconds) {}
    /// Best host seconds of C = A x W for `s` (measured on first use).
    double seconds(const GemmShape& s);
    /// Repetitions behind seconds(s) (0 before it was measured).
    int repetitions(const GemmShape& s) const;

private:
    double m_budget;
    std::map<GemmShape, std::pair<double, int>> m_best;  ///< shape -> (best seconds, reps)
};

/// One line of the benchmark table.
struct BenchRow {
    std::string name;                          ///< case name
    bool functional = true;                    ///< sim.functional of the run
    CaseRun run;                               ///< what the simulator did
    double cycles_per_host_second = 0;         ///< run.cycles / run.host_seconds
    double host_per_simulated_second = 0;      ///< run.host_seconds / simulated seconds
    std::optional<double> eigen_host_seconds;  ///< the Eigen yardstick, GEMMs only
    std::optional<double> ratio_to_eigen;      ///< run.host_seconds / eigen_host_seconds
};

/// Runs `c` (run_case) and, for GEMMs, measures the Eigen yardstick.
BenchRow run_row(const hw::BoardConfig& cfg, const BenchCase& c, EigenYardstick& eigen);

}  // namespace tpu::bench
