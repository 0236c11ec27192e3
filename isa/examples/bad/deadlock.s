# A deadlocking kernel: cores 0 and 1 each wait for the other's signal before sending their own.
#   tpusim run isa/examples/bad/deadlock.s --cores 0,1   -> deadlock report with a state dump, exit 1
        coreid  s1
        xor     s2, s1, 1                   # the other core
        wait    f1, 1                       # waits first ...
        sigr    s2, f1, 1                   # ... so neither ever signals
        halt
