# A racy kernel: the VPU reads x while the DMA may still be writing it, because nothing orders
# the two units (the DMA raises f0 but nobody waits for it before v.exp).
#   tpusim run isa/examples/bad/race.s --set sim.race_detector=true   -> data race report, exit 1
        dma.hv  [0], [0], 8, 4096, 4096, 4096, f0
        v.exp   [0x8000], [0], 8192          # should come after `wait f0, 1`
        wait    f0, 1
        halt
