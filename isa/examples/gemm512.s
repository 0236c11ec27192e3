# A tiled 512x512x512 GEMM, C = A x W, on both MXUs of one core.
# Column panel n of C (512 x 128) runs on MXU n%2, so the two MXUs work in parallel; within a
# panel the next weight tile loads into the shadow buffer while the current one streams A
# (double-buffered weights), so the MXU never waits for weights after the first tile.
#   HBM 0x000000  A, 512x512 bf16, row-major (512 KiB)
#   HBM 0x080000  W, 512x512 bf16, row-major (512 KiB)
# Output: HBM 0x100000  C, 512x512 fp32, row-major (1 MiB)
.equ A_HBM, 0x000000
.equ W_HBM, 0x080000
.equ C_HBM, 0x100000
.equ A_V,   0x000000    # A panel k (512 x 128 bf16, 128 KiB) at A_V + k*0x20000
.equ W_V,   0x080000    # W tile (k, n) (128 x 128 bf16, 32 KiB) at W_V + (4n+k)*0x8000
.equ C_V,   0x100000    # C panel n (512 x 128 fp32, 256 KiB) at C_V + n*0x40000

# A panels: 512 rows of 256 bytes, HBM row stride 1024 bytes.
        li      s1, 0
load_a: mul     s2, s1, 0x20000
        mul     s3, s1, 256
        dma.hv  [s2+A_V], [s3+A_HBM], 512, 256, 256, 1024, f0
        add     s1, s1, 1
        bne     s1, 4, load_a

# W tiles: t = 4n + k; tile rows start at HBM W_HBM + k*128*1024 + n*256.
        li      s1, 0
load_w: shr     s4, s1, 2               # n
        and     s5, s1, 3               # k
        mul     s2, s1, 0x8000
        mul     s3, s5, 0x20000
        mul     s6, s4, 256
        add     s3, s3, s6
        dma.hv  [s2+W_V], [s3+W_HBM], 128, 256, 256, 1024, f0
        add     s1, s1, 1
        bne     s1, 16, load_w
        wait    f0, 20

# C panel n = sum over k of A panel k x W tile (k, n), accumulated in fp32 in VMEM.
        li      s4, 0                   # n
panel:  and     s7, s4, 1               # MXU index
        mul     s8, s4, 0x40000         # C panel offset
        li      s5, 0                   # k
tile:   shl     s2, s4, 2
        add     s2, s2, s5
        mul     s2, s2, 0x8000          # W tile offset
        mul     s3, s5, 0x20000         # A panel offset
        sltu    s9, 0, s5               # accumulate unless k == 0
        mxu.lw  s7, [s2+W_V], 128, 128
        mxu.mm  s7, [s8+C_V], [s3+A_V], 512, s9, f1
        add     s5, s5, 1
        bne     s5, 4, tile
        add     s4, s4, 1
        bne     s4, 4, panel
        wait    f1, 16

# C panels back to HBM: 512 rows of 512 bytes, HBM row stride 2048 bytes.
        li      s4, 0
store:  mul     s8, s4, 0x40000
        mul     s3, s4, 512
        dma.vh  [s3+C_HBM], [s8+C_V], 512, 512, 2048, 512, f2
        add     s4, s4, 1
        bne     s4, 4, store
        wait    f2, 4
        halt
