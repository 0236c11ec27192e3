// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"
#include "hw/board_config.h"
#include "trainer/graph.h"
#include "trainer/metrics.h"

/// Checks a graph op's backward against central finite differences of an fp64 host model of
/// its forward: the device's gradients of loss = sum(y ⊙ R), R fixed random, must match
/// d loss / d input computed in fp64 on the host.
namespace tpu::trainer::test {

/// One input of the op under test.
struct GradInput {
    uint32_t rows = 0, cols = 0;     ///< shape
    bool differentiable = true;      ///< false: a constant (one-hot labels, masks)
    std::vector<double> value = {};  ///< initial value (random in [-1, 1] when empty)
};

/// The op on the device.
using DeviceOp = std::function<Var(Runtime&, const std::vector<Var>&)>;
/// The same op in fp64 on the host: inputs in, output values (row-major) out.
using HostOp = std::function<std::vector<double>(const std::vector<std::vector<double>>&)>;

/// Runs the check on one core in "32-true" (fp32 arithmetic, matmuls as bf16 x 3) and expects
/// |device - fd| <= tol x max(1, max |fd|) for every input element, and the forward within
/// tol x max(1, |y|) of the fp64 one.
inline void check_gradients(std::vector<GradInput> inputs, const DeviceOp& op, const HostOp& host,
                            double tol = 2e-3, uint32_t seed = 1) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (auto& in : inputs)
        if (in.value.empty()) {
            in.value.resize(size_t(in.rows) * in.cols);
            for (double& v : in.value) v = u(rng);
        }
    std::vector<std::vector<double>> values;
    for (const auto& in : inputs) values.push_back(in.value);
    const std::vector<double> y0 = host(values);
    std::vector<double> r(y0.size());
    for (double& v : r) v = u(rng);
    auto loss = [&](const std::vector<std::vector<double>>& x) {
        const std::vector<double> y = host(x);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += y[i] * r[i];
        return l;
    };

    auto dev = driver::Device::open(hw::BoardConfig{});
    driver::ProgramCache cache;
    Metrics metrics;
    Runtime rt(*dev, cache, {0}, PrecisionMode::True32, metrics);
    std::vector<Var> vars;
    for (const auto& in : inputs) {
        Var v = rt.leaf(in.rows, in.cols);
        rt.upload(v->value, 0, std::vector<float>(in.value.begin(), in.value.end()));
        v->requires_grad = in.differentiable;
        vars.push_back(v);
    }
    Var y = op(rt, vars);
    ASSERT_EQ(y->value.elements(), y0.size()) << "device and host outputs differ in size";
    const std::vector<float> yd = rt.download(y->value, 0);
    for (size_t i = 0; i < y0.size(); ++i)
        ASSERT_NEAR(yd[i], y0[i], tol * std::max(1.0, std::abs(y0[i]))) << "output " << i;
    y->grad = rt.scratch(y->value.rows, y->value.cols);
    rt.upload(y->grad, 0, std::vector<float>(r.begin(), r.end()));
    y->has_grad = true;
    rt.backward(y);

    for (size_t k = 0; k < inputs.size(); ++k) {
        if (!inputs[k].differentiable) continue;
        ASSERT_TRUE(vars[k]->has_grad) << "input " << k << " received no gradient";
        const std::vector<float> g = rt.download(vars[k]->grad, 0);
        std::vector<double> fd(g.size());
        double scale = 1;
        for (size_t i = 0; i < g.size(); ++i) {
            const double h = 1e-5;
            auto x = values;
            x[k][i] += h;
            const double up = loss(x);
            x[k][i] -= 2 * h;
            fd[i] = (up - loss(x)) / (2 * h);
            scale = std::max(scale, std::abs(fd[i]));
        }
        for (size_t i = 0; i < g.size(); ++i)
            EXPECT_NEAR(g[i], fd[i], tol * scale) << "input " << k << " element " << i;
    }
    rt.end_step();
}

}  // namespace tpu::trainer::test
