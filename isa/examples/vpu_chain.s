# A VPU elementwise chain over 8192 fp32 values: y = tanh(2x + 1) * x.
# The VPU keeps its own instructions in order where they touch the same VMEM bytes, so only
# the last one needs a completion flag.
#   HBM 0x00000  x, 8192 fp32 (32 KiB)
# Output: HBM 0x10000  y, 8192 fp32
.equ N, 8192
.equ X_HBM, 0x00000
.equ Y_HBM, 0x10000
.equ X, 0x00000
.equ T, 0x08000
.equ Y, 0x10000

        dma.hv  [X], [X_HBM], 8, 4096, 4096, 4096, f0
        wait    f0, 1
        v.muls  [T], [X], 2.0, N
        v.adds  [T], [T], 1.0, N
        v.tanh  [T], [T], N
        v.mul   [Y], [T], [X], N, f1
        wait    f1, 1
        dma.vh  [Y_HBM], [Y], 8, 4096, 4096, 4096, f2
        wait    f2, 1
        halt
