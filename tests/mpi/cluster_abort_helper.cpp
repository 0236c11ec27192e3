// SPDX-License-Identifier: Apache-2.0
// Under mpirun: the last rank calls Cluster::abort while the others wait in a barrier it never
// joins, so the job ends only if abort kills every rank (tests/mpi/expect_abort.cmake checks the
// exit code and the message; a hang is caught by the test's timeout).
#include <string>

#include "sim/cluster.h"

// SystemC (linked through tpu::sim) owns main() and calls sc_main, which it declares extern "C".
extern "C" int sc_main(int argc, char* argv[]) {
    using tpu::sim::Cluster;
    Cluster::init(&argc, &argv);
    if (Cluster::rank() == Cluster::size() - 1)
        Cluster::abort("rank " + std::to_string(Cluster::rank()) + " gives up", 3);
    Cluster::barrier();
    Cluster::finalize();
    return 0;
}
