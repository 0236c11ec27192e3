// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <tlm_utils/simple_target_socket.h>
#include <systemc>
#include <tlm>

namespace tpu::hw {

class SparseMemory;
class HbmTimingModel;

/// One core's HBM as a TLM-2.0 target, for SystemC initiators outside the cores (host-side
/// models, test benches). Blocking transport, loosely timed: the annotated delay comes from the
/// same busy-until timing model the core's DMA engine uses, so both compete for the same
/// pseudo-channels and banks. Include only where a SystemC initiator is built (it pulls in TLM).
class HbmTarget : public sc_core::sc_module {
public:
    /// Bind an initiator socket here.
    tlm_utils::simple_target_socket<HbmTarget> socket;

    HbmTarget(sc_core::sc_module_name name, SparseMemory& mem, HbmTimingModel& timing,
              uint64_t period_ps);
    /// Transactions served with TLM_OK_RESPONSE.
    uint64_t transactions() const { return m_transactions; }

private:
    /// Reads or writes the backing store and adds the access time to `delay`. A request outside
    /// the HBM or of zero bytes gets TLM_ADDRESS_ERROR_RESPONSE, byte enables
    /// TLM_BYTE_ENABLE_ERROR_RESPONSE, a streaming width below the length
    /// TLM_BURST_ERROR_RESPONSE, a length over 4 GiB TLM_GENERIC_ERROR_RESPONSE.
    void b_transport(tlm::tlm_generic_payload& p, sc_core::sc_time& delay);

    SparseMemory& m_mem;
    HbmTimingModel& m_timing;
    uint64_t m_period_ps;
    uint64_t m_transactions = 0;
};

}  // namespace tpu::hw
