// SPDX-License-Identifier: Apache-2.0
// GoogleTest runner for SystemC: SystemC owns main(), so tests start from sc_main.
#include <gtest/gtest.h>
#include <systemc>

int sc_main(int argc, char* argv[]) {
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
