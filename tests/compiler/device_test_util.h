// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the code generation tests share: leaves with values, a graph recorded on them and run
// through a LazyContext, and the check that the device gives the host evaluator's bits.

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/builder.h"
#include "compiler/compiler.h"
#include "compiler/device_backend.h"
#include "compiler/lazy.h"
#include "hw/board_config.h"

namespace tpu::compiler::test {

/// An fp32 shape.
inline Shape f32(std::vector<int64_t> dims) {
    return Shape{DType::F32, std::move(dims)};
}

/// conv + BN (inference affine) + optional residual + ReLU: one layer of a ResNet block, as the
/// zoo's ResNets record it.
inline ValueId conv_bn(Graph& g, ValueId x, ValueId w, const ValueId* bn, int64_t stride,
                       int64_t pad, ValueId residual, bool act) {
    ValueId y = conv2d(g, x, w, stride, pad);
    y = batch_norm_inference(g, y, bn[0], bn[1], bn[2], bn[3], 1e-5, 3);
    if (residual != kNoValue) y = add(g, y, residual);
    return act ? relu(g, y) : y;
}

inline std::vector<float> randoms(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

/// Records a graph on the leaves' values; returns its result.
using Record = std::function<ValueId(Graph&, const std::vector<ValueId>&)>;

/// A parameter or input with its values.
struct Leaf {
    std::string name;
    Shape shape;
    std::vector<std::vector<float>> values;  // one per replica, or one for all
    bool parameter = false;
};

/// Runs `record` on `leaves` through a LazyContext on `backend`; returns every replica's result.
inline std::vector<std::vector<float>> run(Backend& backend, const std::vector<Leaf>& leaves,
                                           const Record& record, CompileOptions co = {}) {
    LazyContext ctx(backend, co);
    std::vector<LazyTensor> ts;
    std::vector<ValueId> vs;
    for (const Leaf& l : leaves)
        ts.push_back(l.parameter ? ctx.parameter(l.name, l.shape, l.values)
                                 : ctx.input(l.name, l.shape, l.values));
    for (const LazyTensor& t : ts) vs.push_back(ctx.value(t));
    const LazyTensor y = ctx.wrap(record(ctx.graph(), vs), "y");
    ctx.mark_step();
    std::vector<std::vector<float>> out;
    for (size_t r = 0; r < backend.replicas(); ++r) out.push_back(ctx.to_host(y, r));
    return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) &&
            !(std::isnan(a[i]) && std::isnan(b[i])))
            return false;
    return true;
}

/// Runs on the device (race detector on) and on the host evaluator; expects equal bits and
/// one launch (no host fallback). Returns the backend's stats.
inline DeviceBackendStats expect_bit_exact(const std::vector<Leaf>& leaves, const Record& record,
                                           std::vector<uint32_t> cores = {0}) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    DeviceBackend device(*dev, cores, cg);
    const uint64_t launches = dev->metrics().launches;
    const auto got = run(device, leaves, record);
    EXPECT_EQ(dev->metrics().launches - launches, 1u) << "one launch per step";
    HostBackend host(cores.size());
    const auto want = run(host, leaves, record);
    for (size_t r = 0; r < cores.size(); ++r) {
        EXPECT_TRUE(same_bits(got[r], want[r])) << "replica " << r;
        size_t bad = 0;
        for (size_t i = 0; i < got[r].size() && bad < 5; ++i)
            if (std::bit_cast<uint32_t>(got[r][i]) != std::bit_cast<uint32_t>(want[r][i]))
                ADD_FAILURE() << "value " << i << ": " << got[r][i] << " vs " << want[r][i]
                              << (++bad, "");
    }
    return device.stats();
}

/// The probe: runs `record` with host fallback on (race detector on) and returns the stats,
/// which list each fusion that fell back to the host and why (printed too); the results in
/// `out`, if given.
inline DeviceBackendStats probe(const std::vector<Leaf>& leaves, const Record& record,
                                std::vector<std::vector<float>>* out = nullptr) {
    const auto cfg = hw::BoardConfig::load("", {"sim.race_detector=true"});
    auto dev = driver::Device::open(cfg);
    CodegenOptions cg;
    cg.board = cfg;
    cg.host_fallback = true;
    DeviceBackend device(*dev, {0}, cg);
    const auto got = run(device, leaves, record);
    if (out) *out = got;
    for (const auto& [why, n] : device.stats().fallbacks)
        std::cout << "  " << n << "x " << why << "\n";
    return device.stats();
}

}  // namespace tpu::compiler::test
