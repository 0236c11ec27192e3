.equ N, 128
    mxu.lw 0, [0], N, N, f2
    mxu.mm 1, [s4], [s5+N], 8, 0, f3
    v.adds [0], [64], 1.5, 1024
    halt
