loop:
    li s1, 4
    add s2, s1, s3+8
    dma.hv [s1+64], [4096], 2, 512, 512, 512, f1
    wait f1, 1
    bne s1, s0, loop
    halt
