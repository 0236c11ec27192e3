# Runs off its end without a halt: a device fault on whichever core runs it (tests/pod: a fault
# in one rank ends every rank with the fault's message).
        nop
