// SPDX-License-Identifier: Apache-2.0
#include "tests/trainer/grad_check.h"

namespace tpu::trainer {
namespace {

using test::check_gradients;
using test::GradInput;
using Values = std::vector<std::vector<double>>;

TEST(GradCheck, ResidualAddSendsTheGradientToBothInputs) {
    check_gradients(
        {{5, 7}, {5, 7}},
        [](Runtime& rt, const std::vector<Var>& v) {
            // x + (x + w): x's gradient arrives twice (taken over, then added).
            return add(rt, v[0], add(rt, v[0], v[1]));
        },
        [](const Values& x) {
            std::vector<double> y(x[0].size());
            for (size_t i = 0; i < y.size(); ++i) y[i] = 2 * x[0][i] + x[1][i];
            return y;
        });
}

TEST(GradCheck, AddReluGatesBothInputsByTheSum) {
    // x + w with every sum at least 0.05 away from the kink (fp64 central differences need
    // that); half the sums negative. x also reaches the output a second time, so its gradient
    // is taken over and then accumulated.
    std::vector<double> x(35), w(35);
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = 0.03 * double(i % 7) - 0.4;
        w[i] = (i % 2 ? 0.5 : -0.6) + 0.01 * double(i % 5);
    }
    check_gradients(
        {{5, 7, true, x}, {5, 7, true, w}},
        [](Runtime& rt, const std::vector<Var>& v) {
            return add(rt, v[0], add_relu(rt, v[0], v[1]));
        },
        [](const Values& in) {
            std::vector<double> y(in[0].size());
            for (size_t i = 0; i < y.size(); ++i)
                y[i] = in[0][i] + std::max(0.0, in[0][i] + in[1][i]);
            return y;
        });
}

TEST(GradCheck, PeriodicAddSumsTheTableGradientOverBlocks) {
    // 3 sequences of 4 positions, 6 features; the table is 4 x 6.
    check_gradients(
        {{12, 6}, {4, 6}},
        [](Runtime& rt, const std::vector<Var>& v) { return add_periodic(rt, v[0], v[1]); },
        [](const Values& x) {
            std::vector<double> y(x[0].size());
            for (size_t i = 0; i < y.size(); ++i) y[i] = x[0][i] + x[1][i % 24];
            return y;
        });
}

TEST(GradCheck, TransposedLinearIsTheTiedOutputProjection) {
    // x: 5 x 6, W: 9 x 6 (vocab x hidden): y = x Wᵀ, 5 x 9.
    check_gradients(
        {{5, 6}, {9, 6}},
        [](Runtime& rt, const std::vector<Var>& v) { return linear_transposed(rt, v[0], v[1]); },
        [](const Values& x) {
            std::vector<double> y(5 * 9, 0.0);
            for (int i = 0; i < 5; ++i)
                for (int j = 0; j < 9; ++j)
                    for (int k = 0; k < 6; ++k) y[i * 9 + j] += x[0][i * 6 + k] * x[1][j * 6 + k];
            return y;
        });
}

TEST(GradCheck, SplitAndMergeHeadsMoveBlocksBothWays) {
    // 6 token rows of 3 heads x 2: split, scale per position by a second input (so the
    // gradient is not the identity), merge back.
    check_gradients(
        {{6, 6}, {18, 2}},
        [](Runtime& rt, const std::vector<Var>& v) {
            Var h = split_heads(rt, v[0], 3);
            EXPECT_EQ(h->value.rows, 18u);
            return merge_heads(rt, add(rt, h, v[1]), 3);
        },
        [](const Values& x) {
            std::vector<double> y(36);
            for (int r = 0; r < 6; ++r)
                for (int h = 0; h < 3; ++h)
                    for (int j = 0; j < 2; ++j)
                        y[r * 6 + h * 2 + j] = x[0][r * 6 + h * 2 + j] + x[1][(h * 6 + r) * 2 + j];
            return y;
        });
}

/// softmax(q kᵀ / sqrt(d) [+ mask]) v per group of `seq` rows, in fp64.
std::vector<double> attention_fp64(const Values& x, uint32_t seq, uint32_t d, bool causal) {
    const size_t rows = x[0].size() / d;
    std::vector<double> o(rows * d, 0.0);
    for (size_t g = 0; g < rows / seq; ++g)
        for (uint32_t i = 0; i < seq; ++i) {
            std::vector<double> s(seq);
            double m = -1e300;
            for (uint32_t j = 0; j < seq; ++j) {
                double dot = 0;
                for (uint32_t c = 0; c < d; ++c)
                    dot += x[0][(g * seq + i) * d + c] * x[1][(g * seq + j) * d + c];
                s[j] = causal && j > i ? -1e300 : dot / std::sqrt(double(d));
                m = std::max(m, s[j]);
            }
            double sum = 0;
            for (double& e : s) sum += (e = e <= -1e299 ? 0.0 : std::exp(e - m));
            for (uint32_t j = 0; j < seq; ++j)
                for (uint32_t c = 0; c < d; ++c)
                    o[(g * seq + i) * d + c] += s[j] / sum * x[2][(g * seq + j) * d + c];
        }
    return o;
}

// The contractions are bf16 MXU passes, so outputs and gradients carry bf16 rounding: inputs
// on the bf16 grid keep the forward exact up to fp32 sums, and the tolerance allows for the
// rounding of the softmax probabilities and gradients fed back into the MXU.
std::vector<GradInput> bf16_inputs(uint32_t rows, uint32_t d, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<GradInput> in(3, GradInput{rows, d});
    for (auto& i : in) {
        i.value.resize(size_t(rows) * d);
        for (double& v : i.value) v = double(int(rng() % 64) - 32) / 32.0;
    }
    return in;
}

TEST(GradCheck, AttentionMatchesFp64Gradients) {
    // 2 groups of 5 positions, dhead 4.
    check_gradients(
        bf16_inputs(10, 4, 7),
        [](Runtime& rt, const std::vector<Var>& v) {
            return attention(rt, v[0], v[1], v[2], 5, false);
        },
        [](const Values& x) { return attention_fp64(x, 5, 4, false); }, 2e-2);
}

TEST(GradCheck, CausalAttentionMatchesFp64Gradients) {
    check_gradients(
        bf16_inputs(10, 4, 8),
        [](Runtime& rt, const std::vector<Var>& v) {
            return attention(rt, v[0], v[1], v[2], 5, true);
        },
        [](const Values& x) { return attention_fp64(x, 5, 4, true); }, 2e-2);
}

TEST(GradCheck, SoftmaxMatchesFp64Gradients) {
    check_gradients(
        {{3, 7}}, [](Runtime& rt, const std::vector<Var>& v) { return softmax(rt, v[0]); },
        [](const Values& x) {
            std::vector<double> y(21);
            for (int r = 0; r < 3; ++r) {
                double m = -1e300, s = 0;
                for (int j = 0; j < 7; ++j) m = std::max(m, x[0][r * 7 + j]);
                for (int j = 0; j < 7; ++j) s += std::exp(x[0][r * 7 + j] - m);
                for (int j = 0; j < 7; ++j) y[r * 7 + j] = std::exp(x[0][r * 7 + j] - m) / s;
            }
            return y;
        });
}

/// Pooling of NHWC images (rows of H·W·C values) in fp64: max or mean (zero padding counted)
/// over each k x k window at stride s, padding p.
std::vector<double> pool_fp64(const std::vector<double>& x, int n, int h, int w, int c, int k,
                              int s, int p, bool max) {
    const int ho = (h + 2 * p - k) / s + 1, wo = (w + 2 * p - k) / s + 1;
    std::vector<double> y;
    for (int b = 0; b < n; ++b)
        for (int i = 0; i < ho; ++i)
            for (int j = 0; j < wo; ++j)
                for (int ch = 0; ch < c; ++ch) {
                    double acc = max ? -1e300 : 0.0;
                    for (int di = 0; di < k; ++di)
                        for (int dj = 0; dj < k; ++dj) {
                            const int r = i * s + di - p, q = j * s + dj - p;
                            const bool in = r >= 0 && r < h && q >= 0 && q < w;
                            const double v = in ? x[((size_t(b) * h + r) * w + q) * c + ch] : 0.0;
                            if (max && in) acc = std::max(acc, v);
                            if (!max) acc += v;
                        }
                    y.push_back(max ? acc : acc / (k * k));
                }
    return y;
}

TEST(GradCheck, MaxPoolRoutesTheGradientToEachWindowsMaximum) {
    const PoolWindow w{1, 5, 5, 3, 3, 2, 1};
    check_gradients(
        {{2, 75}}, [&](Runtime& rt, const std::vector<Var>& v) { return max_pool2d(rt, v[0], w); },
        [](const Values& x) { return pool_fp64(x[0], 2, 5, 5, 3, 3, 2, 1, true); });
}

TEST(GradCheck, AvgPoolCountsPaddingInTheDivisor) {
    const PoolWindow w{1, 5, 5, 3, 3, 2, 1};
    check_gradients(
        {{2, 75}}, [&](Runtime& rt, const std::vector<Var>& v) { return avg_pool2d(rt, v[0], w); },
        [](const Values& x) { return pool_fp64(x[0], 2, 5, 5, 3, 3, 2, 1, false); });
}

TEST(GradCheck, GlobalAvgPoolAveragesEveryPixel) {
    const PoolWindow w{1, 4, 3, 5, 1, 1, 0};
    check_gradients(
        {{2, 60}},
        [&](Runtime& rt, const std::vector<Var>& v) { return global_avg_pool(rt, v[0], w); },
        [](const Values& x) {
            std::vector<double> y(10, 0.0);
            for (int b = 0; b < 2; ++b)
                for (int px = 0; px < 12; ++px)
                    for (int ch = 0; ch < 5; ++ch)
                        y[b * 5 + ch] += x[0][(b * 12 + px) * 5 + ch] / 12.0;
            return y;
        });
}

TEST(GradCheck, Conv2dMatchesFp64Gradients) {
    // 2 images of 5x4x3, 4 output channels, 3x3 kernel, stride 2, pad 1; inputs on the bf16
    // grid (the contractions are bf16 MXU passes), so the tolerance covers the rounding of the
    // output gradient fed back into the MXU.
    const driver::Conv2dShape s{1, 5, 4, 3, 4, 3, 2, 1};
    std::mt19937 rng(3);
    std::vector<GradInput> in = {{2, 60}, {27, 4}, {1, 4}};
    for (auto& i : in) {
        i.value.resize(size_t(i.rows) * i.cols);
        for (double& v : i.value) v = double(int(rng() % 64) - 32) / 32.0;
    }
    check_gradients(
        in, [&](Runtime& rt, const std::vector<Var>& v) { return conv2d(rt, v[0], v[1], v[2], s); },
        [&](const Values& x) {
            const int ho = 3, wo = 2;
            std::vector<double> y;
            for (int n = 0; n < 2; ++n)
                for (int i = 0; i < ho; ++i)
                    for (int j = 0; j < wo; ++j)
                        for (int co = 0; co < 4; ++co) {
                            double acc = x[2][co];
                            for (int kh = 0; kh < 3; ++kh)
                                for (int kw = 0; kw < 3; ++kw) {
                                    const int r = i * 2 + kh - 1, c = j * 2 + kw - 1;
                                    if (r < 0 || r >= 5 || c < 0 || c >= 4) continue;
                                    for (int ci = 0; ci < 3; ++ci)
                                        acc += x[0][n * 60 + (r * 4 + c) * 3 + ci] *
                                               x[1][((kh * 3 + kw) * 3 + ci) * 4 + co];
                                }
                            y.push_back(acc);
                        }
            return y;
        },
        2e-2);
}

TEST(GradCheck, BadShapesAreNamed) {
    auto dev = driver::Device::open(hw::BoardConfig{});
    driver::ProgramCache cache;
    Metrics metrics;
    Runtime rt(*dev, cache, {0}, PrecisionMode::True32, metrics);
    Var x = rt.leaf(10, 4), t = rt.leaf(3, 4), w = rt.leaf(5, 3);
    auto error = [](const std::function<void()>& f) {
        try {
            f();
        } catch (const driver::DeviceError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(error([&] {
                  add_periodic(rt, x, t);
              }).find("add_periodic: 10 rows are not whole blocks of the table's 3 rows"),
              std::string::npos);
    EXPECT_NE(error([&] {
                  linear_transposed(rt, x, w);
              }).find("linear_transposed: input has 4 features, the weight (5 x 3) expects 3"),
              std::string::npos);
    EXPECT_NE(error([&] { add(rt, x, t); }).find("add: the operands"), std::string::npos);
    EXPECT_NE(error([&] {
                  split_heads(rt, x, 3);
              }).find("split_heads: a 10 x 4 tensor does not split into 3 heads"),
              std::string::npos);
    EXPECT_NE(error([&] {
                  max_pool2d(rt, x, PoolWindow{1, 3, 3, 3, 2, 2, 0});
              }).find("max_pool2d: rows of 4 values are not 3x3x3 images"),
              std::string::npos);
}

}  // namespace
}  // namespace tpu::trainer
