// SPDX-License-Identifier: Apache-2.0
// The HBM as a TLM-2.0 target: data, delay annotation from the shared timing model, errors.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <tlm_utils/simple_initiator_socket.h>
#include <systemc>
#include <tlm>

#include "hw/board.h"
#include "hw/mem/hbm2.h"
#include "hw/mem/hbm_target.h"

namespace tpu::hw {
namespace {

/// A test bench initiator: a method that runs the transactions of `script` once, at the start of
/// the simulation (blocking transport into the HBM never waits).
struct Initiator : sc_core::sc_module {
    tlm_utils::simple_initiator_socket<Initiator> socket{"socket"};
    std::function<void(Initiator&)> script;
    explicit Initiator(sc_core::sc_module_name n) : sc_core::sc_module(n) { SC_METHOD(run); }
    SC_HAS_PROCESS(Initiator);
    void run() { script(*this); }

    /// One blocking transaction; returns the response and adds the annotated delay to `delay`.
    tlm::tlm_response_status transport(tlm::tlm_command cmd, uint64_t addr, uint8_t* data,
                                       uint32_t len, sc_core::sc_time& delay,
                                       uint8_t* byte_enable = nullptr) {
        tlm::tlm_generic_payload p;
        p.set_command(cmd);
        p.set_address(addr);
        p.set_data_ptr(data);
        p.set_data_length(len);
        p.set_streaming_width(len);
        p.set_byte_enable_ptr(byte_enable);
        p.set_byte_enable_length(byte_enable ? len : 0);
        p.set_response_status(tlm::TLM_INCOMPLETE_RESPONSE);
        socket->b_transport(p, delay);
        return p.get_response_status();
    }
};

TEST(HbmTarget, DataDelayAndErrors) {
    BoardConfig cfg;
    Board board(cfg);
    Initiator init("init");
    init.socket.bind(board.hbm_target(2).socket);
    // The same requests on a fresh timing model give the expected delays.
    Hbm2Timing ref(cfg);
    const uint64_t period = cfg.period_ps();
    bool ran = false;
    init.script = [&](Initiator& in) {
        std::vector<uint8_t> out(4096), back(4096);
        for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(i * 7 + 1);
        sc_core::sc_time d = sc_core::SC_ZERO_TIME;
        ASSERT_EQ(in.transport(tlm::TLM_WRITE_COMMAND, 0x10000, out.data(), 4096, d),
                  tlm::TLM_OK_RESPONSE);
        const uint64_t w_done = ref.access(0, 0x10000, 4096, true);
        EXPECT_EQ(d, sc_core::sc_time(double(w_done * period), sc_core::SC_PS));
        // A read issued at the annotated time: the shared model continues from there.
        const sc_core::sc_time before = d;
        ASSERT_EQ(in.transport(tlm::TLM_READ_COMMAND, 0x10000, back.data(), 4096, d),
                  tlm::TLM_OK_RESPONSE);
        const uint64_t r_done = ref.access(w_done, 0x10000, 4096, false);
        EXPECT_EQ(d, sc_core::sc_time(double(r_done * period), sc_core::SC_PS));
        EXPECT_GT(d, before);
        EXPECT_EQ(back, out);
        // The board sees the bytes in core 2's HBM, not core 0's.
        std::vector<uint8_t> seen(16);
        board.hbm(2).read(0x10000, seen);
        EXPECT_EQ(std::memcmp(seen.data(), out.data(), 16), 0);
        // Bad requests: outside the HBM, zero bytes, byte enables.
        uint8_t byte = 0, be = 0xff;
        EXPECT_EQ(in.transport(tlm::TLM_READ_COMMAND, cfg.hbm.bytes_per_core, &byte, 1, d),
                  tlm::TLM_ADDRESS_ERROR_RESPONSE);
        EXPECT_EQ(in.transport(tlm::TLM_READ_COMMAND, 0, &byte, 0, d),
                  tlm::TLM_ADDRESS_ERROR_RESPONSE);
        EXPECT_EQ(in.transport(tlm::TLM_WRITE_COMMAND, 0, &byte, 1, d, &be),
                  tlm::TLM_BYTE_ENABLE_ERROR_RESPONSE);
        EXPECT_EQ(board.hbm_target(2).transactions(), 2u);
        ran = true;
    };
    sc_core::sc_start();
    EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace tpu::hw
