// SPDX-License-Identifier: Apache-2.0
// libFuzzer owns main(); libsystemc.so still references sc_main, which the fuzzers never call.
extern "C" int sc_main(int, char*[]) {
    return 0;
}
