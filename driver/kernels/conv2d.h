// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "driver/device.h"
#include "driver/kernels/epilogue.h"
#include "driver/kernels/stream_kernel.h"
#include "driver/kernels/tensor.h"
#include "driver/program_cache.h"

/// conv2d forward on the MXUs as an implicit GEMM (driver/README.md, "Convolution"): NHWC
/// input, HWIO weights, NHWC fp32 output, bf16 operands with fp32 accumulation.
namespace tpu::driver {

/// The shape of a 2-D convolution (groups = 1).
struct Conv2dShape {
    uint32_t batch = 1;   ///< images (N)
    uint32_t height = 1;  ///< input rows (H)
    uint32_t width = 1;   ///< input columns (W)
    uint32_t cin = 1;     ///< input channels
    uint32_t cout = 1;    ///< output channels
    uint32_t kernel = 1;  ///< kernel rows = columns (k)
    uint32_t stride = 1;  ///< stride in both dimensions
    uint32_t pad = 0;     ///< zero padding on every side
    /// (H + 2 pad - k) / stride + 1
    uint32_t out_height() const { return (height + 2 * pad - kernel) / stride + 1; }
    /// (W + 2 pad - k) / stride + 1
    uint32_t out_width() const { return (width + 2 * pad - kernel) / stride + 1; }
    /// Multiply-accumulates: N Ho Wo k^2 Cin Cout.
    uint64_t macs() const;
    /// Throws DeviceError(Usage) naming the field: zero sizes, a kernel larger than the padded
    /// input, or sizes whose HBM layout exceeds the kernels' 32-bit addressing.
    void validate() const;
    auto operator<=>(const Conv2dShape&) const = default;
};

/// Whether conv2d lowers to im2col and one GEMM instead of the implicit GEMM (driver/README.md,
/// "Convolution"): when the taps' channels packed together into K (k k Cin rows in R-row MXU
/// passes) need at most a quarter of the passes of one pass per tap and Cin tile. Small-Cin
/// layers such as an RGB stem (7x7x3: 2 passes instead of 49) would otherwise fill the array
/// with zero rows; below a 4x saving the im2col round trip through HBM (k k times the input, in
/// fp32) costs more than the passes it saves (3x3x32 on 14x14 images: 47 564 cycles folded
/// against 44 023 as an implicit GEMM). `R` is the MXU's rows.
bool conv2d_folds_taps(const Conv2dShape& s, uint32_t R);

/// The output rows y0 .. y0 + ny and columns x0 .. x0 + nx whose input pixel under tap
/// (kh, kw) lies inside the image (the others read padding).
struct Conv2dTapRange {
    uint32_t y0 = 0, ny = 0, x0 = 0, nx = 0;
};
/// Conv2dTapRange of tap (kh, kw) of `s`.
Conv2dTapRange conv2d_tap_range(const Conv2dShape& s, uint32_t kh, uint32_t kw);

/// How one core's kernel tiles its images (driver/README.md, "Convolution").
struct Conv2dTiling {
    uint32_t R = 0, C = 0;      ///< MXU array: Cin tile (K) and Cout tile (N)
    uint32_t CT = 0, NT = 0;    ///< Cin and Cout tiles
    uint32_t phases = 0;        ///< stride phases per dimension: min(stride, k)
    uint32_t Hq = 0, Wq = 0;    ///< rows and columns of one phase image in HBM
    uint32_t band_rows = 0;     ///< output rows per block (the whole image unless it does not fit)
    uint32_t images = 0;        ///< images on this core
    uint32_t block_images = 0;  ///< images per block (1 when images are cut into bands)
    uint32_t mxus = 0;          ///< MXUs used (plan: all, 1-8)
    uint32_t column_sides = 0;  ///< epilogue Column sides (VMEM: one Cout tile of each, C fp32)
    uint32_t full_sides = 0;    ///< epilogue Full sides (VMEM: one image's tile of each)
    /// Images whose matmuls are queued after an image's last one before its epilogue waits for
    /// them (1..block_images; plan_conv2d: enough to cover the array's latency, conv2d_lag)
    uint32_t lag = 1;
    /// Cout tiles a step computes at once, one per MXU (plan_conv2d's cost model): 1 = every
    /// MXU loads the step's weight tile and takes every mxus-th run; mxus = MXU m loads tile
    /// nt + m of the group and streams every run (needs NT a multiple of mxus and full tiles)
    uint32_t cout_split = 1;
    /// Pieces of output rows that the epilogue of a kernel of one block, one Cout group and
    /// one image runs in (conv2d_epilogue_pieces; 1 = the whole image after its last matmul):
    /// piece q once the last step has queued piece q + 1's runs, so its store overlaps the
    /// MXUs instead of following them
    uint32_t epilogue_pieces = 1;
    auto operator<=>(const Conv2dTiling&) const = default;
};

/// The epilogue lag of tiling `t` (Conv2dTiling::lag) on `cfg`'s MXUs: the fewest images L
/// such that the matmuls of L images that each MXU streams take at least the array's latency
/// (hw::MxuTimer::mm_cycles of no rows, R + C - 2) plus a full queue of matmuls
/// (core.queue_depth runs): the epilogue's wait for an image's results then finds them written
/// while the MXU queues are still full, so the MXUs never wait for it. At most a quarter of
/// block_images (at least 1) and 16: each lagging image's epilogue is unrolled three more times.
uint32_t conv2d_lag(const hw::BoardConfig& cfg, const Conv2dShape& s, const Conv2dTiling& t);

/// Conv2dTiling::epilogue_pieces of tiling `t` on `cfg`: 1 unless the kernel is one block of
/// one image and one Cout group, with several runs on at most two MXUs sharing the tile; then
/// as many pieces (at most 8, each unrolled once) as the image has runs for, each enough to
/// keep the MXUs busy for the array's latency and a full queue (as conv2d_lag), so that a
/// piece's epilogue, which waits for its last matmul, never stops the MXUs.
uint32_t conv2d_epilogue_pieces(const hw::BoardConfig& cfg, const Conv2dShape& s,
                                const Conv2dTiling& t);

/// The planner's cost of tiling `t` on `cfg`'s MXUs: cycles one MXU streams, blocks x groups
/// x k k CT steps, each hw::MxuTimer::swap_step_cycles of the rows the MXU streams through the
/// step's tile (a tile swap drains the array once per step).
uint64_t conv2d_mxu_cycles(const hw::BoardConfig& cfg, const Conv2dShape& s, const Conv2dTiling& t);

/// The tiling of `images` images per core: whole images, as many per block as divide `images`
/// and fit in VMEM twice (more images per block amortise the array drain of each weight tile),
/// or, when one image does not fit, bands of output rows (the largest divisor of Ho that fits).
/// An epilogue's sides (emit_conv2d) take VMEM beside them: one tile of each. With several
/// MXUs it plans both ways of sharing them (Conv2dTiling::cout_split) and keeps the one whose
/// MXUs stream for fewer cycles (conv2d_mxu_cycles), sharing on a tie.
Conv2dTiling plan_conv2d(const hw::BoardConfig& cfg, const Conv2dShape& s, uint32_t images,
                         uint32_t column_sides = 0, uint32_t full_sides = 0);
/// Channels of one pixel of a phase plane, which are the rows (K) of every weight tile the
/// kernel loads into an MXU: R, or Cin when Cin < R (one Cin tile). An MXU pass contracts K
/// values of each LHS row (mxu.mm reads rows of K bf16), so a small-Cin plane holds only its
/// channels: the RGB stem's planes are 6 bytes a pixel instead of 256, a whole image's fit in
/// VMEM (one block, so one weight-tile swap per tap), and they are packed from whole input rows
/// (conv2d_pack_x). The values are the same: the rows past Cin were zeros in both operands.
uint32_t conv2d_pixel_channels(const Conv2dShape& s, uint32_t R);
/// Bytes of the packed phase planes of tiling `t` in HBM (every image of s.batch).
uint64_t conv2d_packed_x_bytes(const Conv2dShape& s, const Conv2dTiling& t);

/// Program-cache key of the per-core kernel: the shape (`batch` = every core's images, as the
/// caller planned it) and one core's tiling. HBM layouts (the packing kernels write them):
/// - X: per image, per stride phase (a, b) (a, b < phases), per Cin tile: a Hq x Wq x K bf16
///   plane (K = conv2d_pixel_channels), pixel (i, j) = zero-padded input (i stride + a - pad,
///   j stride + b - pad), channels past Cin zero. Tap (kh, kw) of output (y, x) reads phase
///   (kh % s, kw % s) at (y + kh / s, x + kw / s): with stride s every tap is a stride-1 window
///   of one plane.
/// - W: R x C bf16 tiles (Cin x Cout, zero-padded), tile (nt, kh, kw, ct) at index
///   ((nt k + kh) k + kw) CT + ct, each row-major and contiguous.
/// - bias: NT C fp32. Y: NHWC fp32, N x Ho x Wo x Cout, compact.
struct Conv2dKey {
    Conv2dShape shape;        ///< the convolution
    Conv2dTiling tiling;      ///< one core's tiling (plan_conv2d), with the epilogue's sides
    bool store_bf16 = false;  ///< Y in bf16 (an epilogue's store_bf16), N x Ho x Wo x Cout
    auto operator<=>(const Conv2dKey&) const = default;
    std::string name() const { return "conv2d"; }
    friend size_t hash_value(const Conv2dKey& k);
};
/// Where emit_conv2d's operands are (HBM addresses in the layouts above).
struct Conv2dOperands {
    streaming::Operand x;       ///< HBM: the packed phase planes
    streaming::Operand w;       ///< HBM: the packed weight tiles
    streaming::Operand bias;    ///< HBM: NT C fp32
    streaming::Operand y;       ///< HBM: the output
    streaming::Operand blocks;  ///< scalar: blocks on this core (conv2d_blocks)
};
/// Blocks of one core's kernel: images / block_images x Ho / band_rows.
uint32_t conv2d_blocks(const Conv2dShape& s, const Conv2dTiling& t);
/// Emits the kernel for `key` into `b` (driver/README.md, "Convolution"): registers, flags,
/// scalar memory and VMEM from b's pools in its own scope (it uses 26 registers besides its
/// operands and 13 flags, 14 with epilogue sides); on return every instruction it issued has
/// completed. `epilogue` runs on each image's fp32 tile (hb Wo rows x C, after the bias) before
/// its store: its sides must match the key's tiling (column_sides, full_sides) and its
/// store_bf16 the key's; a Full side is NHWC fp32 like Y, a Column side Cout fp32. Throws
/// isa::BuildError when they do not match.
void emit_conv2d(isa::Builder& b, const Conv2dKey& key, const Conv2dOperands& ops,
                 const Epilogue& epilogue = {});
/// The stand-alone kernel: launch arguments x, w, bias, y (HBM addresses), blocks (s1..s5), then
/// emit_conv2d, then halt.
isa::Program generate(const Conv2dKey& key);

/// The streaming helper kernels of conv2d and conv2d_grad (driver/README.md, "Convolution").
enum class Conv2dAux : uint8_t {
    PackInput,   ///< x (NHWC fp32) -> the kernel's bf16 phase planes; operands x, packed
    PackWeight,  ///< w (HWIO fp32) -> the kernel's bf16 weight tiles; operands w, packed
    Im2colTap,   ///< one tap's columns of im2col(x); operands x, col
    Col2imTap,   ///< dx += one tap's columns of dcol; operands dcol, dx
    Im2colRows,  ///< im2col(x), one unit per output row; operands x, col
    Col2imRows,  ///< dx = col2im(dcol), one unit per input row; operands dcol, dx
    Zero,        ///< t = +0.0; operand t
};
/// Program-cache key of a helper kernel: the fields it reads (the others stay 0, so shapes that
/// differ only in what a kernel does not read share its program).
struct Conv2dAuxKey {
    Conv2dAux kind = Conv2dAux::Zero;           ///< which kernel
    Conv2dShape shape{0, 0, 0, 0, 0, 0, 0, 0};  ///< the convolution's fields the kernel reads
    uint32_t R = 0, C = 0;                      ///< MXU array (packing kernels)
    uint32_t kh = 0, kw = 0;                    ///< the tap (per-tap kernels)
    uint64_t units = 0;                         ///< values (Zero)
    uint32_t tile = 0;                          ///< units per VMEM tile (plan_conv2d_aux)
    auto operator<=>(const Conv2dAuxKey&) const = default;
    /// "conv2d_pack_x", "conv2d_pack_w", "conv2d_im2col", "conv2d_col2im", "conv2d_im2col_rows",
    /// "conv2d_col2im_rows", "conv2d_grad_zero".
    std::string name() const;
    friend size_t hash_value(const Conv2dAuxKey& k);
};
/// The key of helper `kind` for shape `s` (R, C: the MXU; tap (kh, kw); `units` values for
/// Zero), tiled for `vmem_bytes` of free VMEM. Throws DeviceError(Usage) when not even one
/// unit fits.
Conv2dAuxKey plan_conv2d_aux(Conv2dAux kind, const Conv2dShape& s, uint32_t R, uint32_t C,
                             uint32_t kh, uint32_t kw, uint64_t units, uint64_t vmem_bytes);
/// The operands of helper `kind`, in launch-argument order.
std::span<const streaming::Param> conv2d_aux_params(Conv2dAux kind);
/// Emits helper `k` into `b` (no halt), operands in conv2d_aux_params order.
void emit(isa::Builder& b, const Conv2dAuxKey& k, std::span<const streaming::Operand> ops);
/// The stand-alone program of helper `k`.
isa::Program generate(const Conv2dAuxKey& k);

/// Result of conv2d().
struct Conv2dResult {
    std::vector<float> y;        ///< N x Ho x Wo x Cout, fp32
    Event event;                 ///< the kernel's launches (operands already packed), merged
    Event pack;                  ///< the packing launches before them (not in `event`)
    uint64_t macs = 0;           ///< useful multiply-accumulates (Conv2dShape::macs)
    double mxu_utilization = 0;  ///< macs / (cores x MXUs x R x C x cycles)
    uint64_t hbm_bytes = 0;      ///< bytes the kernel's DMAs moved (packing excluded)
    Conv2dTiling tiling;         ///< the busiest core's tiling (implicit GEMM; empty if folded)
    bool folded = false;         ///< lowered to im2col + GEMM (conv2d_folds_taps); `pack` = im2col
};

/// y = conv2d(x, w) + bias on device Tensors, one launch group over their core set, each core
/// on its own replica (`s.batch` images per core): x is N H W rows x Cin (NHWC), w k k Cin rows
/// x Cout (HWIO), bias 1 x Cout, y N Ho Wo rows x Cout, all fp32. Packing kernels write the
/// kernel's bf16 layouts (above) into scratch HBM, freed before returning. The event covers
/// the packing and the kernel.
Event conv2d(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Tensor& x,
             const Tensor& w, const Tensor& bias, const Tensor& y);

/// Gradients of y = conv2d(x, w) + bias on device Tensors (layouts as in conv2d; dx like x, dw
/// like w, db 1 x Cout), each core on its own replica. db = col_sum(dy); dw = im2col(x)^T dy
/// and dcol = dy w^T with the bf16 matmul; dx = +0.0, then each tap's columns of dcol added in
/// tap row-major order (col2im). im2col(x) is N Ho Wo x k k Cin fp32 (zeros in the padding),
/// scratch freed before returning. The event covers every launch. A `dx` without buffers (a
/// default Tensor) skips dcol and col2im: the input's gradient is not wanted (an image).
Event conv2d_grad(Device& dev, ProgramCache& cache, const Conv2dShape& s, const Tensor& x,
                  const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                  const Tensor& db);

/// Gradients of conv2d (host reference).
struct Conv2dGradResult {
    std::vector<float> dx;  ///< N H W x Cin
    std::vector<float> dw;  ///< k k Cin x Cout
    std::vector<float> db;  ///< Cout
};
/// im2col(x): row (n, y, x) holds, for each tap (kh, kw) in row-major order, the Cin values of
/// input pixel (y s + kh - pad, x s + kw - pad), zeros in the padding.
std::vector<float> conv2d_im2col_reference(const std::vector<float>& x, const Conv2dShape& s);
/// conv2d_grad with the device's exact numerics: db = col_sum_reference(dy, tile rows =
/// `col_sum_tile_rows`), dw = matmul_reference(im2col(x)^T, dy, bf16), dcol =
/// matmul_reference(dy, w^T, bf16), dx[p] = ((+0.0 + c_0) + c_1) + ... over the taps that reach
/// pixel p in row-major (kh, kw) order, c_t the tap's dcol values, each add rounded to fp32.
Conv2dGradResult conv2d_grad_reference(const std::vector<float>& x, const std::vector<float>& w,
                                       const std::vector<float>& dy, const Conv2dShape& s,
                                       uint32_t R, uint32_t col_sum_tile_rows);

/// Runs y = conv2d(x, w) + bias on `cores`, data-parallel over the batch (core i takes the
/// i-th even share of the images): x is N x H x W x Cin (NHWC), w is k x k x Cin x Cout
/// (HWIO), bias Cout; all fp32 on the host, rounded to bf16 (bias stays fp32). Uploads fp32
/// Tensors and packs them on the device as the Tensor conv2d does, but reports the packing
/// (`pack`) apart from the kernel (`event`).
Conv2dResult conv2d(Device& dev, ProgramCache& cache, const std::vector<float>& x,
                    const std::vector<float>& w, const std::vector<float>& bias,
                    const Conv2dShape& s, const std::vector<uint32_t>& cores);

/// The host reference with the device's exact numerics: per output value, for each tap
/// (kh, kw) in row-major order and each Cin tile of R channels in order, a pass sum (channel
/// order, from +0.0, bf16 products exact in fp32) added to the fp32 accumulator (the first one
/// stored); padding taps take part with zeros. Then the fp32 bias is added. When
/// conv2d_folds_taps(s, R): matmul_reference(im2col(x), w, bf16, R), then the fp32 bias.
std::vector<float> conv2d_reference(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>& bias, const Conv2dShape& s,
                                    uint32_t R);
/// The same with the lowering named by the caller (the compiler's differs from conv2d's):
/// `fold_taps` the im2col dot, else a pass per tap.
std::vector<float> conv2d_reference(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>& bias, const Conv2dShape& s,
                                    uint32_t R, bool fold_taps);
/// The exact convolution of the same fp32 inputs in fp64, to measure the bf16 error.
std::vector<double> conv2d_reference_fp64(const std::vector<float>& x, const std::vector<float>& w,
                                          const std::vector<float>& bias, const Conv2dShape& s);

}  // namespace tpu::driver
