# Golden kernel for traces/golden/ (run on cores 0,1 of configs/tiny.json; see README.md):
# every unit once per core. C = relu(A x W) with an 8 x 8 MXU, then each core sends its C to
# the other core over ICI and stores both halves back to HBM.
#   HBM 0x0000  A, 8 x 8 bf16 (128 B)    HBM 0x0100  W, 8 x 8 bf16 (128 B)
# Output: HBM 0x1000  own C, 8 x 8 fp32    HBM 0x1100  the other core's C
.equ A_HBM, 0x0000
.equ W_HBM, 0x0100
.equ C_HBM, 0x1000
.equ R_HBM, 0x1100
.equ A_V,   0x0000
.equ W_V,   0x0100
.equ C_V,   0x0200
.equ R_V,   0x0400

        coreid  s1
        xor     s2, s1, 1                        # the other core of the pair
        dma.hv  [A_V], [A_HBM], 8, 16, 16, 16, f0
        dma.hv  [W_V], [W_HBM], 8, 16, 16, 16, f1
        wait    f1, 1
        mxu.lw  0, [W_V], 8, 8
        wait    f0, 1
        mxu.mm  0, [C_V], [A_V], 8, 0, f2
        wait    f2, 1
        v.maxs  [C_V], [C_V], 0.0, 64, f3
        wait    f3, 1
        ici.v   s2, [R_V], [C_V], 256, f4        # the other core's f4 += 1 on arrival
        dma.vh  [C_HBM], [C_V], 8, 32, 32, 32, f5
        wait    f4, 1                            # the other core's C has arrived
        dma.vh  [R_HBM], [R_V], 8, 32, 32, 32, f6
        wait    f5, 1
        wait    f6, 1
        halt
