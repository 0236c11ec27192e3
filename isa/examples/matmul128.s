# One 128x128x128 matmul on MXU 0: C = A x W.
# Inputs (load with `tpusim run --load 0:0x0=a.bin --load 0:0x8000=w.bin`):
#   HBM 0x00000  A, 128x128 bf16, row-major (32 KiB)
#   HBM 0x08000  W, 128x128 bf16, row-major (32 KiB)
# Output: HBM 0x10000  C, 128x128 fp32, row-major (64 KiB)
.equ A_HBM, 0x00000
.equ W_HBM, 0x08000
.equ C_HBM, 0x10000
.equ A_V,   0x00000
.equ W_V,   0x08000
.equ C_V,   0x10000

        dma.hv  [A_V], [A_HBM], 128, 256, 256, 256, f0
        dma.hv  [W_V], [W_HBM], 128, 256, 256, 256, f1
        wait    f1, 1
        mxu.lw  0, [W_V], 128, 128          # weights into the shadow buffer
        wait    f0, 1
        mxu.mm  0, [C_V], [A_V], 128, 0, f2 # waits for the weight load inside the MXU
        wait    f2, 1
        dma.vh  [C_HBM], [C_V], 128, 512, 512, 512, f3
        wait    f3, 1
        halt
