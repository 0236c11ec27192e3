// SPDX-License-Identifier: Apache-2.0
// Golden hashes of library programs written with the program builder. Each hash is of the
// program image the text kernel it replaced emitted for that key (issue 25: the migration kept
// every program byte-identical, so no cycle count moved). A deliberate change to a kernel's
// code updates its rows here and says why in the commit.
#include <gtest/gtest.h>

#include <cstdint>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "driver/kernels/attention.h"
#include "driver/kernels/conv2d.h"
#include "driver/kernels/gemm.h"
#include "driver/kernels/matmul_kernel.h"
#include "driver/kernels/pool.h"
#include "driver/kernels/softmax.h"
#include "driver/kernels/tensor_ops.h"
#include "driver/kernels/vector_ops.h"

namespace tpu::driver {
namespace {

using AnyKey =
    std::variant<VectorKey, TensorOpKey, PackKey, ColumnCopyKey, SoftmaxKey, SoftmaxGradKey,
                 GemmKey, MatmulKey, PoolKey, AttentionKey, Conv2dKey, Conv2dAuxKey>;

struct Golden {
    AnyKey key;
    uint64_t hash;  ///< isa::image_hash of the program
};

/// Keys the driver, trainer and CLI tests compile (the smallest, the largest and a ragged
/// multi-tile shape of each kernel, and every variant of softmax and the packing kernel), with
/// the hashes of the text kernels' programs.
const std::vector<Golden> kGolden = {
    {VectorKey{VectorOp::Adam, 1, 1, 1}, 0x962bf50addb5d84e},
    {VectorKey{VectorOp::Adam, 535872, 1, 32768}, 0x36615ebefb25bfc1},
    {VectorKey{VectorOp::Adam, 120000, 1, 32768}, 0xac26456f456f4860},
    {VectorKey{VectorOp::Add, 1, 1, 1}, 0x4b6fc171c895698c},
    {VectorKey{VectorOp::Add, 4194304, 1, 32768}, 0x3c2e9f55e8f239ce},
    {VectorKey{VectorOp::Add, 100003, 1, 32768}, 0x983702bf86b59d2a},
    {VectorKey{VectorOp::AddRelu, 1, 1, 1}, 0x36128f9973af4eba},
    {VectorKey{VectorOp::AddRelu, 120000, 1, 32768}, 0x453e1c4580cb3a84},
    {VectorKey{VectorOp::BiasAdd, 1, 1, 1}, 0xca3ba80c811be23e},
    {VectorKey{VectorOp::BiasAdd, 5000, 1, 5000}, 0x02dd78eafb736851},
    {VectorKey{VectorOp::BiasAdd, 300, 300, 109}, 0x57d922236b428423},
    {VectorKey{VectorOp::ColSum, 1, 1, 1}, 0x86dc354bfd75b0c6},
    {VectorKey{VectorOp::ColSum, 50176, 32, 1024}, 0xed1ceb6bb6f9fca5},
    {VectorKey{VectorOp::ColSum, 3136, 64, 512}, 0x926cce1d7d7a85ac},
    {TensorOpKey{TensorOp::Copy, 1, 1, 1}, 0x54fa05d1687820db},
    {TensorOpKey{TensorOp::Copy, 38700, 1, 32768}, 0x6236f0fb77a646fa},
    {ColumnCopyKey{false, 1, 1, 1, 1}, 0x0925ff81f05f6176},
    {ColumnCopyKey{false, 1024, 16, 32, 1024}, 0xa75362eefe588093},
    {ColumnCopyKey{true, 1, 1, 1, 1}, 0x172bf233b81285e1},
    {ColumnCopyKey{true, 1024, 16, 32, 1024}, 0x303fd166dc2393f0},
    {TensorOpKey{TensorOp::Dropout, 512, 1, 512}, 0x3a23def1840db3a1},
    {TensorOpKey{TensorOp::Dropout, 70000, 1, 32768}, 0xbe30eda23719a92e},
    {TensorOpKey{TensorOp::Gelu, 1, 1, 1}, 0x57a2a1d3703673e9},
    {TensorOpKey{TensorOp::Gelu, 131072, 1, 32768}, 0x0df0313c9d13a368},
    {TensorOpKey{TensorOp::Gelu, 70000, 1, 32768}, 0x66e743a3a46ea74d},
    {TensorOpKey{TensorOp::GeluGrad, 1, 1, 1}, 0x23f847a79a2378d6},
    {TensorOpKey{TensorOp::GeluGrad, 131072, 1, 32768}, 0x7e682cf6fada17e6},
    {TensorOpKey{TensorOp::GeluGrad, 70000, 1, 32768}, 0x2cd554b7eaa0de23},
    {TensorOpKey{TensorOp::LayerNorm, 1, 1, 1}, 0x0c43995105b31149},
    {TensorOpKey{TensorOp::LayerNorm, 1024, 32, 1024}, 0x27de6eb325937f38},
    {TensorOpKey{TensorOp::LayerNorm, 300, 129, 254}, 0x026d8c7e031d6c84},
    {TensorOpKey{TensorOp::LayerNormGrad, 1, 1, 1}, 0xf5dac12be8c5bee5},
    {TensorOpKey{TensorOp::LayerNormGrad, 1024, 32, 1024}, 0x09e0c30db48605df},
    {TensorOpKey{TensorOp::LayerNormGrad, 300, 129, 254}, 0xa59fcaf4fe685f4b},
    {PackKey{9, 50176, 9, 50176, true, 1, 1}, 0xbcc64b3dd22ed0ae},
    {PackKey{50176, 32, 50176, 128, false, 1, 256}, 0x52dcd9f40e121ff4},
    {PackKey{210, 150, 210, 256, false, 1, 84}, 0x333b02826dcc4d3d},
    {PackKey{40, 2000, 40, 2048, true, 2, 16}, 0x5ef6a0de23e4a462},
    {PackKey{150, 5, 256, 128, false, 1, 150}, 0xb1a0cf38b80b7bc1},
    {PackKey{2000, 100, 2048, 128, false, 2, 256}, 0xfe1eaacb37ca8baf},
    {VectorKey{VectorOp::Mul, 1, 1, 1}, 0x6753edfa53d451e4},
    {VectorKey{VectorOp::Mul, 4194304, 1, 32768}, 0x44806aa1f8290762},
    {VectorKey{VectorOp::Mul, 100003, 1, 32768}, 0x8fbc2bd596b5088e},
    {VectorKey{VectorOp::Relu, 1, 1, 1}, 0xc2d5ab44523f9856},
    {VectorKey{VectorOp::Relu, 4194304, 1, 32768}, 0xaa8ef6f8267bc10a},
    {VectorKey{VectorOp::Relu, 100352, 1, 32768}, 0xefdf313f4de741a6},
    {VectorKey{VectorOp::ReluGrad, 1, 1, 1}, 0x937fa5320a107e02},
    {VectorKey{VectorOp::ReluGrad, 1605632, 1, 32768}, 0x64765c1bd41392c5},
    {VectorKey{VectorOp::ReluGrad, 120000, 1, 32768}, 0xbdd31a236f3bd816},
    {TensorOpKey{TensorOp::RoundBf16, 1, 1, 1}, 0xd5dbc56deca0f4c9},
    {TensorOpKey{TensorOp::RoundBf16, 38700, 1, 32768}, 0x7556fb69a511d956},
    {VectorKey{VectorOp::RowSum, 1, 1, 1}, 0xd3fc8e6ceac172fe},
    {VectorKey{VectorOp::RowSum, 5000, 1, 5000}, 0x726053da3ed7a978},
    {VectorKey{VectorOp::RowSum, 300, 300, 109}, 0x3282e9874ae0bd3c},
    {VectorKey{VectorOp::Scale, 1, 1, 1}, 0x825c872298680446},
    {VectorKey{VectorOp::Scale, 4194304, 1, 32768}, 0x403342ec264d1c8a},
    {VectorKey{VectorOp::Scale, 100003, 1, 32768}, 0xe6e75cc5046cc702},
    {VectorKey{VectorOp::SgdMomentum, 1, 1, 1}, 0x2b249b0abd7bc4ed},
    {VectorKey{VectorOp::SgdMomentum, 421760, 1, 32768}, 0xafe38b671ff8af56},
    {VectorKey{VectorOp::SgdMomentum, 120000, 1, 32768}, 0x1be202e3d4381a44},
    {SoftmaxKey{1, 1, false, false, 1}, 0x45cef951505908fb},
    {SoftmaxKey{2048, 2048, false, false, 16}, 0xf6d95437c9ba8051},
    {SoftmaxKey{130, 1000, false, false, 32}, 0xafdc90735077f90d},
    {SoftmaxKey{48, 24, true, false, 48}, 0x10a00a027a665f0f},
    {SoftmaxKey{60, 20, true, true, 20}, 0x2e7fec99b24f8c07},
    {VectorKey{VectorOp::SoftmaxCrossEntropy, 1, 1, 1}, 0x3c2f95b0fe019a7a},
    {VectorKey{VectorOp::SoftmaxCrossEntropy, 5000, 1, 5000}, 0x686c67f7cfeae894},
    {VectorKey{VectorOp::SoftmaxCrossEntropy, 300, 300, 109}, 0x8460a8bdc3ab8ee5},
    {SoftmaxGradKey{1, 1, false, 1}, 0x0b250721351b459f},
    {SoftmaxGradKey{130, 1000, false, 32}, 0xd1308790fee61018},
    {SoftmaxGradKey{48, 24, true, 48}, 0xbaee5ea3a316b00d},
    // The GEMM and the fused matmul: plan_gemm's and plan_matmul's tilings of the shapes the
    // GEMM tests run (gemm_order_test, tensor_ops_test), in both layouts, compact and padded C,
    // A kept and streamed, with and without transposes and bias, on the default board, on
    // smaller VMEMs and on an 8 x 8 MXU. GemmKey{{R, C, Kp, Np, block_rows, mxus, precision,
    // tiled, a_stream}, compact_cols}; MatmulKey{M, K, N, ta, tb, precision, R, C, mxus,
    // block_rows, bias}.
    {GemmKey{{128, 128, 128, 128, 8, 2, Precision::Bf16, false, false}, 1}, 0x73a8437d95cc21b1},
    {MatmulKey{1, 1, 1, false, false, Precision::Bf16, 128, 128, 2, 8, false}, 0xb33688d29349cda9},
    {GemmKey{{128, 128, 1152, 256, 304, 2, Precision::Fp32Pass6, true, false}, 0},
     0x3a35eede675f623c},
    {MatmulKey{300, 1152, 129, true, false, Precision::Fp32Pass6, 128, 128, 2, 304, true},
     0x128c1a14c391a4e9},
    {GemmKey{{128, 128, 256, 256, 8, 2, Precision::Fp32Pass6, false, false}, 129},
     0xdc751458a0b8089e},
    {MatmulKey{8, 256, 129, false, true, Precision::Fp32Pass6, 128, 128, 2, 8, false},
     0xb92666185015831f},
    {GemmKey{{128, 128, 2048, 384, 64, 2, Precision::Fp32Pass6, false, false}, 0},
     0x5e1b7668b598364c},
    {MatmulKey{64, 2048, 300, true, false, Precision::Fp32Pass6, 128, 128, 2, 64, false},
     0xf62492dee7f6a226},
    {GemmKey{{128, 128, 512, 1024, 256, 2, Precision::Bf16, true, false}, 0}, 0x88670630c119b971},
    {MatmulKey{256, 512, 1024, false, false, Precision::Bf16, 128, 128, 2, 256, false},
     0x0d7d2648601f30db},
    {GemmKey{{128, 128, 384, 640, 1104, 2, Precision::Bf16, false, false}, 0}, 0xfe205995e6f7787b},
    {MatmulKey{1100, 384, 640, true, true, Precision::Bf16, 128, 128, 2, 1104, true},
     0x7f4c9390e3c7f9e8},
    {GemmKey{{128, 128, 384, 384, 136, 2, Precision::Fp32Pass3, false, false}, 0},
     0x68cc94dd313b8277},
    {MatmulKey{129, 300, 384, false, false, Precision::Fp32Pass3, 128, 128, 2, 136, false},
     0x5b60793bda98315b},
    {GemmKey{{128, 128, 1152, 640, 280, 2, Precision::Bf16, true, true}, 0}, 0x493576a66428d153},
    {MatmulKey{1100, 1152, 640, true, false, Precision::Bf16, 128, 128, 2, 104, false},
     0x02fa3562df288201},
    {GemmKey{{128, 128, 1024, 640, 304, 2, Precision::Fp32Pass3, false, true}, 0},
     0x377fee58e4afe99d},
    {MatmulKey{600, 1024, 640, false, true, Precision::Fp32Pass3, 128, 128, 2, 152, false},
     0xa5e4cda17fd1650a},
    {GemmKey{{128, 128, 384, 256, 304, 2, Precision::Bf16, false, false}, 0}, 0x1e9ddcf6f556a030},
    {MatmulKey{300, 260, 140, true, false, Precision::Bf16, 128, 128, 2, 304, true},
     0x5b6aea7a5478cf80},
    {GemmKey{{128, 128, 8192, 512, 2504, 2, Precision::Fp32Pass6, true, true}, 0},
     0xed1f790a08ab78a7},
    {MatmulKey{5000, 8192, 512, false, false, Precision::Fp32Pass6, 128, 128, 2, 296, false},
     0xad1352241af9667c},
    {GemmKey{{8, 8, 32, 32, 40, 2, Precision::Fp32Pass3, false, false}, 0}, 0x44598dfd6895ebbb},
    {MatmulKey{37, 30, 29, true, true, Precision::Fp32Pass3, 8, 8, 2, 40, false},
     0xe6bd036842c28e69},
    // Pooling: the smallest window, ResNet's stem pool (112 x 112 x 64, k3 s2 p1), stride =
    // kernel with padding, a 7 x 7 window with stride 1, a 1 x 1 window with stride 2; the
    // global pools on an odd image and ResNet's 7 x 7 x 512. PoolKey{op, {batch, height, width,
    // channels, kernel, stride, pad}}.
    {PoolKey{PoolOp::Max, {1, 4, 4, 1, 2, 2, 0}}, 0xb2079ea4d246bc87},
    {PoolKey{PoolOp::Max, {1, 112, 112, 64, 3, 2, 1}}, 0x1250a6d543ef815e},
    {PoolKey{PoolOp::Max, {1, 10, 11, 3, 3, 3, 1}}, 0x558fc9544a90bbc7},
    {PoolKey{PoolOp::Max, {1, 9, 8, 5, 7, 1, 3}}, 0x844934d9133b2219},
    {PoolKey{PoolOp::Max, {2, 5, 6, 2, 1, 2, 0}}, 0x46e94505204419b5},
    {PoolKey{PoolOp::Avg, {1, 4, 4, 1, 2, 2, 0}}, 0x99515582825763f3},
    {PoolKey{PoolOp::Avg, {1, 112, 112, 64, 3, 2, 1}}, 0x765587bc7cb2e43e},
    {PoolKey{PoolOp::Avg, {1, 10, 11, 3, 3, 3, 1}}, 0x192457218380ae62},
    {PoolKey{PoolOp::Avg, {1, 9, 8, 5, 7, 1, 3}}, 0xa5af9c0235695529},
    {PoolKey{PoolOp::Avg, {2, 5, 6, 2, 1, 2, 0}}, 0x2898a80954a61e65},
    {PoolKey{PoolOp::MaxGrad, {1, 4, 4, 1, 2, 2, 0}}, 0x6545046eafb42e60},
    {PoolKey{PoolOp::MaxGrad, {1, 112, 112, 64, 3, 2, 1}}, 0xcf2040ff5ed4de4e},
    {PoolKey{PoolOp::MaxGrad, {1, 10, 11, 3, 3, 3, 1}}, 0x7b30c6cc78208626},
    {PoolKey{PoolOp::MaxGrad, {1, 9, 8, 5, 7, 1, 3}}, 0x5b76a080dff47b95},
    {PoolKey{PoolOp::MaxGrad, {2, 5, 6, 2, 1, 2, 0}}, 0xdc2830935c556573},
    {PoolKey{PoolOp::AvgGrad, {1, 4, 4, 1, 2, 2, 0}}, 0xdd8050fbfdb5b033},
    {PoolKey{PoolOp::AvgGrad, {1, 112, 112, 64, 3, 2, 1}}, 0xfd8cdcb927bc4613},
    {PoolKey{PoolOp::AvgGrad, {1, 10, 11, 3, 3, 3, 1}}, 0x461da2b6ccb3e997},
    {PoolKey{PoolOp::AvgGrad, {1, 9, 8, 5, 7, 1, 3}}, 0x185391a76e8dce7c},
    {PoolKey{PoolOp::AvgGrad, {2, 5, 6, 2, 1, 2, 0}}, 0x6ddc9ac61a629a15},
    {PoolKey{PoolOp::Global, {3, 7, 5, 131, 1, 1, 0}}, 0x6d951dcd72145aa2},
    {PoolKey{PoolOp::Global, {8, 7, 7, 512, 1, 1, 0}}, 0xbdf790af9e3e9783},
    {PoolKey{PoolOp::GlobalGrad, {3, 7, 5, 131, 1, 1, 0}}, 0x4c26af00de89b05b},
    {PoolKey{PoolOp::GlobalGrad, {8, 7, 7, 512, 1, 1, 0}}, 0xc525f9c158fef7e9},
    // Fused attention: bert-block's 12 heads x 512 x 64, gpt's 16 x 4 heads x 64 x 32 causal
    // (8 heads per block), one key tile with one head, 130 keys (a ragged second key tile), tiny
    // heads, and an unscaled one (dhead 1). AttentionKey{backward, seq, dhead, heads_per_block,
    // blocks, key_cols, causal, scaled}.
    {AttentionKey{false, 512, 64, 1, 12, 128, false, true}, 0x480ae135d0e8ff38},
    {AttentionKey{true, 512, 64, 1, 12, 128, false, true}, 0x608c1fe0cad9acb9},
    {AttentionKey{false, 64, 32, 8, 8, 128, true, true}, 0xe57130fc3986b78f},
    {AttentionKey{true, 64, 32, 8, 8, 128, false, true}, 0xa84f6dca5bdebd5d},
    {AttentionKey{false, 100, 16, 1, 1, 128, true, true}, 0xf96c5de4ab3b366a},
    {AttentionKey{true, 100, 16, 1, 1, 128, false, true}, 0xe89d2e11cfac0e6b},
    {AttentionKey{false, 130, 16, 2, 1, 128, false, true}, 0x1169bbee3264de7a},
    {AttentionKey{true, 130, 16, 2, 1, 128, false, true}, 0x3980c892ee6faa6d},
    {AttentionKey{false, 5, 4, 6, 1, 128, true, true}, 0xb794523f5bd23b0b},
    {AttentionKey{true, 5, 4, 6, 1, 128, false, true}, 0x72e23c0d811c338e},
    {AttentionKey{false, 200, 1, 2, 1, 128, false, false}, 0xb97fdc905ed8120d},
    {AttentionKey{true, 200, 1, 2, 1, 128, false, false}, 0x6bc6a403949ed223},
    // New programs with no text predecessor (their values are checked by AttentionCompose.*):
    // the token-major layout, Q, K, V out of a fused QKV. AttentionKey{..., heads, qkv_row,
    // out_row}.
    {AttentionKey{false, 20, 8, 6, 1, 128, true, true, 3, 72, 24}, 0xb25a308bc97f8a89},
    {AttentionKey{true, 130, 16, 2, 2, 128, false, true, 2, 96, 32}, 0x93df66f5cd57c732},
    // conv2d: plan_conv2d's tilings of the validation rows and of conv2d_test's shapes (two
    // tiles each way, stride 2, bands in a small VMEM, one MXU, an 8 x 8 MXU), with their packing
    // kernels; the im2col, col2im and zeroing kernels of the folded and backward paths. The
    // conv2d programs themselves (not the helpers) were re-pinned when the kernel took deferred
    // epilogues, plane-major X blocks and the first block in pieces (values checked by
    // Conv2dShapes.* and Conv2dCout.*): they are no longer the text kernels' bytes. Those of
    // Cin < R (and their pack_x) were re-pinned when such planes became dense, K = Cin channels a
    // pixel packed from whole input rows (conv2d_pixel_channels; values checked likewise).
    // Conv2dKey{shape, {R, C, CT, NT, phases, Hq, Wq, band_rows, images, block_images, mxus}};
    // Conv2dAuxKey{kind, the shape's fields it reads, R, C, kh, kw, units, tile}.
    {Conv2dKey{{64, 28, 28, 128, 128, 3, 1, 1}, {128, 128, 1, 1, 1, 30, 30, 28, 64, 8, 2}},
     0x9e58bda607368df4},
    {Conv2dAuxKey{Conv2dAux::PackInput, {64, 28, 28, 128, 0, 3, 1, 1}, 128, 0, 0, 0, 0, 1},
     0xf36e96f5a18f733d},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 128, 128, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x641af6fd4674a700},
    {Conv2dKey{{64, 56, 56, 64, 64, 3, 1, 1}, {128, 128, 1, 1, 1, 58, 58, 56, 64, 2, 2}},
     0x75e34288b7ad8a48},
    {Conv2dAuxKey{Conv2dAux::PackInput, {64, 56, 56, 64, 0, 3, 1, 1}, 128, 0, 0, 0, 0, 1},
     0xe7e37e2df43e9651},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 64, 64, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x2a1fa787a670906d},
    {Conv2dKey{{64, 14, 14, 256, 256, 3, 1, 1}, {128, 128, 2, 2, 1, 16, 16, 14, 64, 32, 2}},
     0xc1a3cc7247d5027d},
    {Conv2dAuxKey{Conv2dAux::PackInput, {64, 14, 14, 256, 0, 3, 1, 1}, 128, 0, 0, 0, 0, 1},
     0x5744a9b26d9bbead},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 256, 256, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0xe3f5a5caefbbd086},
    {Conv2dKey{{64, 7, 7, 512, 512, 3, 1, 1}, {128, 128, 4, 4, 1, 9, 9, 7, 64, 64, 2}},
     0x94d35818b754091c},
    // The planner's tilings of the 28², 14² and 7² rows since the epilogue lag (no text
    // predecessor; values checked by Conv2dShapes.*): lags 2, 4 and 13 images.
    {Conv2dKey{{64, 28, 28, 128, 128, 3, 1, 1}, {128, 128, 1, 1, 1, 30, 30, 28, 64, 8, 2, 0, 0, 2}},
     0xab8b94b7cc270b22},
    {Conv2dKey{{64, 14, 14, 256, 256, 3, 1, 1},
               {128, 128, 2, 2, 1, 16, 16, 14, 64, 32, 2, 0, 0, 4}},
     0x4f1fc08d872840e1},
    {Conv2dKey{{64, 7, 7, 512, 512, 3, 1, 1}, {128, 128, 4, 4, 1, 9, 9, 7, 64, 64, 2, 0, 0, 13}},
     0x311788dd65d46876},
    {Conv2dAuxKey{Conv2dAux::PackInput, {64, 7, 7, 512, 0, 3, 1, 1}, 128, 0, 0, 0, 0, 1},
     0xe76c60a6c85b845b},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 512, 512, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x2608bd52ef8ed0af},
    {Conv2dKey{{3, 9, 7, 130, 129, 3, 2, 1}, {128, 128, 2, 2, 2, 6, 5, 5, 3, 3, 2}},
     0x439140b9143799a4},
    {Conv2dAuxKey{Conv2dAux::PackInput, {3, 9, 7, 130, 0, 3, 2, 1}, 128, 0, 0, 0, 0, 1},
     0x153b1e9ce2338edf},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 130, 129, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x98cb0a8b83b92ead},
    {Conv2dKey{{2, 5, 5, 8, 8, 1, 2, 0}, {128, 128, 1, 1, 1, 3, 3, 3, 2, 2, 2}},
     0xcb252728542d80d7},
    {Conv2dAuxKey{Conv2dAux::PackInput, {2, 5, 5, 8, 0, 1, 2, 0}, 128, 0, 0, 0, 0, 1},
     0x71d3e79aefad74b0},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 8, 8, 1, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x4deb4ac52f42396d},
    {Conv2dKey{{2, 20, 18, 130, 20, 3, 1, 1}, {128, 128, 2, 1, 1, 22, 20, 2, 2, 1, 2}},
     0x50a96deb85223c97},
    {Conv2dAuxKey{Conv2dAux::PackInput, {2, 20, 18, 130, 0, 3, 1, 1}, 128, 0, 0, 0, 0, 1},
     0x40f13171a23a0799},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 130, 20, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x078ddadeb73747d2},
    {Conv2dKey{{3, 5, 4, 9, 6, 3, 1, 1}, {128, 128, 1, 1, 1, 7, 6, 5, 3, 3, 1}},
     0x059dd1dc1f8b46ba},
    {Conv2dAuxKey{Conv2dAux::PackInput, {3, 5, 4, 9, 0, 3, 1, 1}, 128, 0, 0, 0, 0, 1},
     0xe214e3d963f10d4b},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 9, 6, 3, 0, 0}, 128, 128, 0, 0, 0, 1},
     0x4639b36943fde8d7},
    {Conv2dKey{{1, 29, 27, 6, 5, 5, 2, 2}, {8, 8, 1, 1, 2, 17, 16, 15, 1, 1, 2}},
     0xd8a640c5a757a5df},
    {Conv2dAuxKey{Conv2dAux::PackInput, {1, 29, 27, 6, 0, 5, 2, 2}, 8, 0, 0, 0, 0, 1},
     0x5bb20a37dc785618},
    {Conv2dAuxKey{Conv2dAux::PackWeight, {0, 0, 0, 6, 5, 5, 0, 0}, 8, 8, 0, 0, 0, 1},
     0xf4a32cf14c034a96},
    {Conv2dAuxKey{Conv2dAux::Im2colRows, {1, 30, 32, 3, 0, 7, 2, 3}, 0, 0, 0, 0, 0, 1},
     0x8183a9a785d1d344},
    {Conv2dAuxKey{Conv2dAux::Im2colRows, {2, 6, 5, 3, 0, 3, 1, 1}, 0, 0, 0, 0, 0, 1},
     0xfbc9661545bc4126},
    {Conv2dAuxKey{Conv2dAux::Col2imRows, {2, 6, 5, 3, 0, 3, 1, 1}, 0, 0, 0, 0, 0, 1},
     0xe09ad06f374ff5d8},
    {Conv2dAuxKey{Conv2dAux::Col2imRows, {1, 9, 8, 3, 0, 5, 2, 2}, 0, 0, 0, 0, 0, 1},
     0xddc21253930782e4},
    {Conv2dAuxKey{Conv2dAux::Im2colTap, {1, 6, 200, 1, 0, 3, 1, 1}, 0, 0, 0, 0, 0, 1},
     0xba61e85948df177c},
    {Conv2dAuxKey{Conv2dAux::Im2colTap, {1, 6, 200, 1, 0, 3, 1, 1}, 0, 0, 1, 2, 0, 1},
     0xa6374c7be8638f7f},
    {Conv2dAuxKey{Conv2dAux::Col2imTap, {1, 2, 512, 128, 0, 7, 1, 3}, 0, 0, 3, 3, 0, 1},
     0xa03a9f3da82578a7},
    {Conv2dAuxKey{Conv2dAux::Col2imTap, {1, 2, 512, 128, 0, 7, 1, 3}, 0, 0, 3, 0, 0, 1},
     0x2322d751c687dae3},
    {Conv2dAuxKey{Conv2dAux::Zero, {0, 0, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, 1, 1}, 0x84316c7ca64e7b7a},
    {Conv2dAuxKey{Conv2dAux::Zero, {0, 0, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, 131072, 32768},
     0xbec5732eddc54cbf},
    {Conv2dAuxKey{Conv2dAux::Zero, {0, 0, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, 100003, 32768},
     0xf59d7f8174eed0d3},
};

TEST(KernelPrograms, BuilderProgramsAreByteIdenticalToTheTextKernelsTheyReplaced) {
    for (const Golden& g : kGolden) {
        const auto [name, hash] = std::visit(
            [](const auto& k) {
                const isa::Program p = generate(k);
                EXPECT_EQ(p.name, k.name());
                return std::pair{k.name(), isa::image_hash(p)};
            },
            g.key);
        EXPECT_EQ(fmt::format("{:016x}", hash), fmt::format("{:016x}", g.hash)) << name;
    }
}

}  // namespace
}  // namespace tpu::driver
